/* The code predictor's verify call in one C function, at the weight-streaming floor (docs/precision.md#the-native-forward).
 *
 * A code-predictor call with a few query rows reads every weight once and does a few multiply-adds with it: on a CPU
 * its time is the time to stream its weights from memory. This file computes the whole call (5 decoder layers: RMSNorm,
 * fused q/k/v projection, per-head q/k RMSNorm, RoPE, slot KV cache write, masked grouped-query attention, output
 * projection, SwiGLU MLP; the final norm) and the per-depth head logits, so that one call from Python is one C call
 * and every weight byte is read once, from a layout made for streaming:
 *
 *   panels of NB = 64 output channels; inside a panel the weights of one input index (or of a pair / quad of input
 *   indices) for the 64 outputs are contiguous, so one panel is one sequential stream and the 64 outputs are four
 *   512-bit accumulators per query row, updated with one broadcast of the row's input and one vector FMA
 *   (float32), VDPBF16PS (bfloat16, and int8 weights widened to bfloat16) or VPDPBUSD (int8 x int8) per 64 bytes.
 *
 *   F32  [panel][K][64] float32            y = sum_k x_k w_k
 *   BF16 [panel][K/2][64][2] bfloat16      pairs of inputs, VDPBF16PS
 *   I8W  [panel][K/2][64][2] int8          weight-only int8: widened to bfloat16 in registers (exact), VDPBF16PS,
 *                                          times the channel's scale
 *   I8D  [panel][K/4][64][4] int8          int8 x int8 -> int32 (exact) with VPDPBUSD: each input row quantised with
 *                                          its own scale, shifted by 128 to unsigned; 128 * sum_k w_k subtracted
 *
 * ROW INVARIANCE. Every output of every query row is one accumulator that runs over k in the same order whatever the
 * number of rows in the call (rows are processed in blocks of at most MB rows; a block's size changes which registers
 * hold a row, never its sequence of operations); norms, RoPE, attention and the MLP's gating are per row with fixed
 * loop orders, and attention visits the allowed slots in slot order, skipping the others. So a row of a verify call is
 * computed exactly as the same row alone in an AR call: bit for bit, in every precision (tested).
 *
 * ACTIVATIONS are float32 here; with `act_bf16` (the bfloat16 and int8 precisions, whose official module computes in
 * bfloat16) every value is rounded to bfloat16 where the official module's bfloat16 arithmetic rounds it.
 *
 * Built on first use by rvqspec_lib/device/kernels/cpforward.py with `cc -O3 -march=native` for the running CPU; the
 * AVX-512 paths are compiled where the CPU has AVX512F (+ AVX512-BF16 for BF16/I8W, AVX512-VNNI for I8D), a plain C
 * path (the same layouts and orders, slower) everywhere else. One thread. Not re-entrant per model handle.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { P_F32 = 0, P_BF16 = 1, P_I8W = 2, P_I8D = 3 };
#ifndef NB
#define NB 32      /* output channels per panel */
#endif
#ifndef MB
#define MB 12      /* query rows per register block */
#endif
#define NV (NB / 16)  /* 512-bit accumulators per row */
#define LANES 16   /* partial sums of the per-row reductions */

int rvq_caps(void) {
    int c = 0;
#ifdef __AVX512F__
    c |= 1;
#endif
#ifdef __AVX512BF16__
    c |= 2;
#endif
#ifdef __AVX512VNNI__
    c |= 4;
#endif
    return c;
}

static inline int group_of(int prec) { return prec == P_F32 ? 1 : prec == P_I8D ? 4 : 2; }
static inline int esize_of(int prec) { return prec == P_F32 ? 4 : prec == P_BF16 ? 2 : 1; }

static inline uint32_t f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* round a finite float32 to the nearest bfloat16 (ties to even), returned as float32; branch-free, so the loops that
 * apply it vectorise (no NaN reaches it: inputs are finite activations) */
static inline float rb(float x) {
    uint32_t u = f2u(x);
    return u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
static inline uint16_t bf16_bits(float x) { return (uint16_t)(f2u(rb(x)) >> 16); }
static inline float bf16_float(uint16_t b) { return u2f((uint32_t)b << 16); }

/* e^x, branch-free (vectorises): Cody-Waite reduction by ln 2, a degree-7 polynomial (Cephes' expf coefficients),
 * 2^n built in the exponent bits; x clamped to [-87.3, 88.3]; relative error about 2 ulp. The same function for every
 * row, so rows stay bit-identical whatever their number. */
static inline float fexp(float x) {
    x = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x;
    float n = x * 1.44269504088896341f + 12582912.0f;  /* round to the nearest integer (1.5 * 2^23) */
    n = n - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    return p * u2f((uint32_t)((int32_t)n + 127) << 23);
}

/* ---- per-row reductions with a fixed order (LANES partial sums, then a fixed tree): row invariant -------------- */

#if defined(__AVX512F__)
static inline float dot(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
static inline float absmax(const float *a, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_abs_ps(_mm512_loadu_ps(a + i)));
    if (i < n) acc = _mm512_max_ps(acc, _mm512_abs_ps(_mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1u), a + i)));
    return _mm512_reduce_max_ps(acc);
}
#else
static inline float dot(const float *a, const float *b, int n) {
    float part[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) part[j] = fmaf(a[i + j], b[i + j], part[j]);
    for (int j = 0; i < n; i++, j++) part[j] = fmaf(a[i], b[i], part[j]);
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += part[j];
    return s;
}
static inline float absmax(const float *a, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) { float v = fabsf(a[i]); m = v > m ? v : m; }
    return m;
}
#endif
static inline float sumsq(const float *a, int n) { return dot(a, a, n); }

/* ---- packing ---------------------------------------------------------------------------------------------------- */

size_t rvq_packed_bytes(int prec, int N, int K) {
    size_t np = (size_t)(N + NB - 1) / NB, g = group_of(prec), kg = (K + g - 1) / g;
    return np * kg * NB * g * esize_of(prec);
}

/* W: float32 (N, K) row-major (F32, BF16: values already bfloat16-representable) or int8 (N, K) (I8W, I8D).
 * comp (I8D only, N int32): 128 * sum_k W[n, k], the correction of the unsigned shift. Padding is zero. */
void rvq_pack(int prec, const void *W, int N, int K, void *out, int32_t *comp) {
    int g = group_of(prec), kg = (K + g - 1) / g, np = (N + NB - 1) / NB;
    memset(out, 0, rvq_packed_bytes(prec, N, K));
    for (int p = 0; p < np; p++)
        for (int j = 0; j < NB; j++) {
            int n = p * NB + j;
            if (n >= N) continue;
            for (int k = 0; k < K; k++) {
                size_t idx = (((size_t)p * kg + k / g) * NB + j) * g + k % g;
                if (prec == P_F32) ((float *)out)[idx] = ((const float *)W)[(size_t)n * K + k];
                else if (prec == P_BF16) ((uint16_t *)out)[idx] = bf16_bits(((const float *)W)[(size_t)n * K + k]);
                else ((int8_t *)out)[idx] = ((const int8_t *)W)[(size_t)n * K + k];
            }
        }
    if (prec == P_I8D && comp)
        for (int n = 0; n < N; n++) {
            int32_t s = 0;
            for (int k = 0; k < K; k++) s += ((const int8_t *)W)[(size_t)n * K + k];
            comp[n] = 128 * s;
        }
}

/* ---- inputs in the kernels' formats ----------------------------------------------------------------------------- */

/* BF16 / I8W: x (M, K) float32 -> pairs of bfloat16 (M, K2) uint32, zero padded */
static void pack_x_bf16(const float *x, int ldx, int M, int K, uint32_t *xp) {
    int k2 = (K + 1) / 2;
    for (int m = 0; m < M; m++)
        for (int i = 0; i < k2; i++) {
            uint16_t lo = bf16_bits(x[(size_t)m * ldx + 2 * i]);
            uint16_t hi = 2 * i + 1 < K ? bf16_bits(x[(size_t)m * ldx + 2 * i + 1]) : 0;
            xp[(size_t)m * k2 + i] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
}

/* I8D: each row quantised as the official Int8Linear(dynamic=True) does: s = max(max|x|, 1e-30) / 127,
 * q = round_half_even(x / s) clamped to [-127, 127]; stored + 128 as unsigned quads (M, K4) uint32, zero padded with
 * q = 0 (128) whose product with the zero padding of the weights is 0. */
static void pack_x_i8(const float *x, int ldx, int M, int K, uint32_t *xq, float *sx) {
    int k4 = (K + 3) / 4;
    for (int m = 0; m < M; m++) {
        const float *r = x + (size_t)m * ldx;
        float amax = absmax(r, K);
        float s = (amax > 1e-30f ? amax : 1e-30f) / 127.0f;
        sx[m] = s;
        uint8_t *o = (uint8_t *)(xq + (size_t)m * k4);
        for (int k = 0; k < K; k++) {
            float q = r[k] / s + 12582912.0f;  /* round half to even, as torch.round */
            q = q - 12582912.0f;
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            o[k] = (uint8_t)((int32_t)q + 128);
        }
        for (int k = K; k < 4 * k4; k++) o[k] = 128;
    }
}

/* ---- the panel kernels: acc[m][0..63] for rows m < mb of one panel ----------------------------------------------- */

#if defined(__AVX512F__)
#ifndef PF_BYTES
#define PF_BYTES 4096  /* software prefetch distance along a panel (every line of the stream is prefetched) */
#endif
#define PREFETCH(p, lines) do { for (int l_ = 0; l_ < (lines); l_++) _mm_prefetch((const char *)(p) + PF_BYTES + 64 * l_, _MM_HINT_T0); } while (0)

/* The loop every panel kernel runs: MB x NV accumulators of type ACC (zeroed by ZERO), one step per input group (KG
 * groups, STEP weights apart), the NV weight vectors of a group loaded once (LOAD, into wv[j] of type WV) and applied
 * to each row's broadcast input b = BCAST(X[m * LDX + i]) of type BT by a[m][j] = FMA; then the mb rows' STORE. */
#define PANEL_LOOP(ACC, ZERO, WV, LOAD, PF, KG, STEP, X, LDX, BT, BCAST, FMA, STORE) do { \
    ACC a[MB][NV]; \
    for (int m = 0; m < MB; m++) for (int j = 0; j < NV; j++) a[m][j] = ZERO(); \
    for (int i = 0; i < (KG); i++, w += (STEP)) { \
        PREFETCH(w, PF); \
        WV wv[NV]; \
        for (int j = 0; j < NV; j++) { LOAD; } \
        for (int m = 0; m < MB; m++) { \
            if (m >= mb) break; \
            BT b = BCAST(X[(size_t)m * (LDX) + i]); \
            for (int j = 0; j < NV; j++) a[m][j] = FMA; \
        } \
    } \
    for (int m = 0; m < mb; m++) for (int j = 0; j < NV; j++) STORE(acc + m * NB + 16 * j, a[m][j]); \
} while (0)

/* the empty asm pins each weight vector in a register: without it GCC folds the load into every row's FMA (mb loads
 * of the same 64 bytes; 1.4x slower at 4 rows). Same instructions, same results. */
static inline __attribute__((always_inline)) void blk_f32(const float *w, const float *x, int ldx, int K, float *acc,
                                                          const int mb) {
    PANEL_LOOP(__m512, _mm512_setzero_ps, __m512, wv[j] = _mm512_loadu_ps(w + 16 * j); __asm__("" : "+v"(wv[j])),
               NV, K, NB, x, ldx, __m512, _mm512_set1_ps, _mm512_fmadd_ps(wv[j], b, a[m][j]), _mm512_storeu_ps);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define SET1_PAIR(v) (__m512bh)_mm512_set1_epi32((int)(v))

static inline __attribute__((always_inline)) void blk_bf16(const uint16_t *w, const uint32_t *xp, int k2, float *acc,
                                                           const int mb) {
    PANEL_LOOP(__m512, _mm512_setzero_ps, __m512bh, wv[j] = (__m512bh)_mm512_loadu_si512(w + 32 * j), NV, k2, 2 * NB,
               xp, k2, __m512bh, SET1_PAIR, _mm512_dpbf16_ps(a[m][j], wv[j], b), _mm512_storeu_ps);
}

static inline __m512bh widen_i8(const int8_t *w) {  /* 32 int8 (16 outputs x a pair of inputs) -> bfloat16, exact */
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

static inline __attribute__((always_inline)) void blk_i8w(const int8_t *w, const uint32_t *xp, int k2, float *acc,
                                                          const int mb) {
    PANEL_LOOP(__m512, _mm512_setzero_ps, __m512bh, wv[j] = widen_i8(w + 32 * j), (NV + 1) / 2, k2, 2 * NB, xp, k2,
               __m512bh, SET1_PAIR, _mm512_dpbf16_ps(a[m][j], wv[j], b), _mm512_storeu_ps);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define SET1_QUAD(v) _mm512_set1_epi32((int)(v))

static inline __attribute__((always_inline)) void blk_i8d(const int8_t *w, const uint32_t *xq, int k4, int32_t *acc,
                                                          const int mb) {
    PANEL_LOOP(__m512i, _mm512_setzero_si512, __m512i,
               wv[j] = _mm512_loadu_si512(w + 64 * j); __asm__("" : "+v"(wv[j])),  /* as blk_f32 */
               NV, k4, 4 * NB, xq, k4, __m512i, SET1_QUAD, _mm512_dpbusd_epi32(a[m][j], b, wv[j]), _mm512_storeu_si512);
}
#endif

/* Plain C versions: the same layouts and the same per-output order over k (used where the CPU lacks the
 * instructions; a different rounding of the bfloat16 pair products than VDPBF16PS, so not bit-equal to it). */
static void blk_generic(int prec, const void *wv, const float *x, int ldx, const uint32_t *xp, int kg, int K, int mb,
                        float *acc, int32_t *iacc) {
    for (int m = 0; m < mb; m++) {
        for (int j = 0; j < NB; j++) { acc[m * NB + j] = 0.0f; iacc[m * NB + j] = 0; }
        for (int i = 0; i < kg; i++) {
            if (prec == P_F32) {
                const float *w = (const float *)wv + (size_t)i * NB;
                float b = x[(size_t)m * ldx + i];
                for (int j = 0; j < NB; j++) acc[m * NB + j] = fmaf(w[j], b, acc[m * NB + j]);
            } else if (prec == P_I8D) {
                const int8_t *w = (const int8_t *)wv + (size_t)i * NB * 4;
                const uint8_t *b = (const uint8_t *)(xp + (size_t)m * kg + i);
                for (int j = 0; j < NB; j++)
                    for (int t = 0; t < 4; t++) iacc[m * NB + j] += (int32_t)b[t] * (int32_t)w[j * 4 + t];
            } else {
                uint32_t pair = xp[(size_t)m * kg + i];
                float b0 = bf16_float((uint16_t)(pair & 0xffff)), b1 = bf16_float((uint16_t)(pair >> 16));
                for (int j = 0; j < NB; j++) {
                    float w0, w1;
                    if (prec == P_BF16) {
                        const uint16_t *w = (const uint16_t *)wv + ((size_t)i * NB + j) * 2;
                        w0 = bf16_float(w[0]); w1 = bf16_float(w[1]);
                    } else {
                        const int8_t *w = (const int8_t *)wv + ((size_t)i * NB + j) * 2;
                        w0 = (float)w[0]; w1 = (float)w[1];
                    }
                    acc[m * NB + j] = fmaf(w0, b0, acc[m * NB + j]);
                    acc[m * NB + j] = fmaf(w1, b1, acc[m * NB + j]);
                }
            }
        }
    }
    (void)K;
}

static int fast_path(int prec) {
    int c = rvq_caps();
    if (!(c & 1)) return 0;
    if (prec == P_BF16 || prec == P_I8W) return (c & 2) != 0;
    if (prec == P_I8D) return (c & 4) != 0;
    return 1;
}

/* ---- one linear layer: y (M, ldy) = epilogue(x (M, ldx) @ W.T) (no bias: the code predictor has none) ----------
 * scale: per output (I8W, I8D), float; comp: I8D's correction; act_bf16: round outputs to
 * bfloat16 as the official module's bfloat16 F.linear / int8 kernel returns them. work: >= M * (K + 4) + 2 * MB * NB
 * floats of scratch. */
typedef struct {
    int prec, N, K;
    const void *w;
    const float *scale;
    const int32_t *comp;
} Linear;

static void linear_run(const Linear *L, const float *x, int ldx, float *y, int ldy, int M, int act_bf16, float *work) {
    int prec = L->prec, N = L->N, K = L->K, g = group_of(prec), kg = (K + g - 1) / g, np = (N + NB - 1) / NB;
    uint32_t *xp = (uint32_t *)work;
    float *sx = work + (size_t)M * kg;
    float *acc = sx + M;
    int32_t *iacc = (int32_t *)(acc + MB * NB);
    if (prec == P_BF16 || prec == P_I8W) pack_x_bf16(x, ldx, M, K, xp);
    else if (prec == P_I8D) pack_x_i8(x, ldx, M, K, xp, sx);
    int fast = fast_path(prec);
    size_t panel_bytes = (size_t)kg * NB * g * esize_of(prec);
    for (int p = 0; p < np; p++) {
        const char *wp = (const char *)L->w + (size_t)p * panel_bytes;
        for (int m0 = 0; m0 < M; m0 += MB) {
            int mb = M - m0 < MB ? M - m0 : MB;
            if (fast) {
#define BY_ROWS(call) switch (mb) { case 1: call(1); break; case 2: call(2); break; case 3: call(3); break; \
    case 4: call(4); break; case 5: call(5); break; case 6: call(6); break; case 7: call(7); break; \
    case 8: call(8); break; case 9: call(9); break; case 10: call(10); break; case 11: call(11); break; \
    default: call(12); }
#if defined(__AVX512F__)
#define C_F32(k) blk_f32((const float *)wp, x + (size_t)m0 * ldx, ldx, K, acc, k)
                if (prec == P_F32) BY_ROWS(C_F32)
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define C_BF16(k) blk_bf16((const uint16_t *)wp, xp + (size_t)m0 * kg, kg, acc, k)
#define C_I8W(k) blk_i8w((const int8_t *)wp, xp + (size_t)m0 * kg, kg, acc, k)
                if (prec == P_BF16) BY_ROWS(C_BF16)
                if (prec == P_I8W) BY_ROWS(C_I8W)
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define C_I8D(k) blk_i8d((const int8_t *)wp, xp + (size_t)m0 * kg, kg, iacc, k)
                if (prec == P_I8D) BY_ROWS(C_I8D)
#endif
            } else {
                blk_generic(prec, wp, x + (size_t)m0 * ldx, ldx, xp + (size_t)m0 * kg, kg, K, mb, acc, iacc);
            }
            int nv = N - p * NB < NB ? N - p * NB : NB;
            for (int m = 0; m < mb; m++) {
                float *yr = y + (size_t)(m0 + m) * ldy + (size_t)p * NB;
                const float *a = acc + m * NB;
                if (prec == P_I8D) {
                    const int32_t *ia = iacc + m * NB, *cp = L->comp + (size_t)p * NB;
                    const float *sc = L->scale + (size_t)p * NB;
                    float s = sx[m0 + m];
                    for (int j = 0; j < nv; j++) yr[j] = ((float)(ia[j] - cp[j]) * s) * sc[j];
                } else if (prec == P_I8W) {
                    const float *sc = L->scale + (size_t)p * NB;
                    if (act_bf16) for (int j = 0; j < nv; j++) yr[j] = rb(a[j] * sc[j]);
                    else for (int j = 0; j < nv; j++) yr[j] = a[j] * sc[j];
                } else if (act_bf16) {
                    for (int j = 0; j < nv; j++) yr[j] = rb(a[j]);
                } else {
                    memcpy(yr, a, sizeof(float) * nv);
                }
            }
        }
    }
}

size_t rvq_linear_work(int prec, int M, int K) {
    return (size_t)M * (K + 8) + 2 * MB * NB + 64;
}

/* A linear layer called from Python (the per-depth heads). */
void rvq_linear(int prec, const void *w, const float *scale, const int32_t *comp, int N, int K,
                const float *x, float *y, int M, int act_bf16, float *work) {
    Linear L = {prec, N, K, w, scale, comp};
    linear_run(&L, x, K, y, N, M, act_bf16, work);
}

/* ---- the model -------------------------------------------------------------------------------------------------- */

enum { W_QKV = 0, W_O = 1, W_GU = 2, W_DOWN = 3 };
enum { N_IN = 0, N_POST = 1, N_Q = 2, N_K = 3 };

typedef struct {
    int prec, L, H, NH, NKV, D, I, act_bf16, kv_bf16;
    float eps, scaling;
    Linear *lin;          /* L x 4 */
    const float **norms;  /* L x 4 (input, post-attention, q, k) */
    const float *final_norm;
    float *work;
    size_t work_len;
} Model;

void *rvq_model_new(int prec, int L, int H, int NH, int NKV, int D, int I, float eps, int act_bf16) {
    Model *m = (Model *)calloc(1, sizeof(Model));
    if (!m) return NULL;
    m->prec = prec; m->L = L; m->H = H; m->NH = NH; m->NKV = NKV; m->D = D; m->I = I; m->eps = eps;
    m->act_bf16 = act_bf16;
    m->scaling = 1.0f / sqrtf((float)D);
    m->lin = (Linear *)calloc((size_t)L * 4, sizeof(Linear));
    m->norms = (const float **)calloc((size_t)L * 4, sizeof(float *));
    if (!m->lin || !m->norms) { free(m->lin); free(m->norms); free(m); return NULL; }
    return m;
}

void rvq_model_free(void *h) {
    Model *m = (Model *)h;
    if (!m) return;
    free(m->lin); free(m->norms); free(m->work); free(m);
}

void rvq_model_set_linear(void *h, int layer, int which, const void *w, const float *scale, const int32_t *comp,
                          int N, int K) {
    Model *m = (Model *)h;
    Linear L = {m->prec, N, K, w, scale, comp};
    m->lin[layer * 4 + which] = L;
}

/* The KV cache in bfloat16 (on != 0) instead of float32: the caches passed to the forward calls are then uint16
 * bfloat16 arrays of the same shape. Only with bfloat16 activations, whose keys and values are bfloat16 values
 * already, so the cache holds them exactly and every result is the same bit for bit; it halves the bytes attention
 * reads. Returns 0, or -1 (the model does not round its activations to bfloat16). */
int rvq_model_set_kv_bf16(void *h, int on) {
    Model *m = (Model *)h;
    if (on && !m->act_bf16) return -1;
    m->kv_bf16 = on != 0;
    return 0;
}

void rvq_model_set_norm(void *h, int layer, int which, const float *w) {
    Model *m = (Model *)h;
    if (layer < 0) m->final_norm = w; else m->norms[layer * 4 + which] = w;
}

/* RMSNorm of n values as the official Qwen3RMSNorm: statistics in float32, x * rsqrt(mean(x^2) + eps) rounded to the
 * activation dtype, then times the weight (rounded again in bfloat16). Fixed-order partial sums (row invariant). */
static void rms(const float *x, const float *w, float *y, int n, float eps, int bf) {
    float s = sumsq(x, n);
    int i;
    float r = 1.0f / sqrtf(s / (float)n + eps);
    if (bf) for (i = 0; i < n; i++) y[i] = rb(w[i] * rb(x[i] * r));
    else for (i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

static void ensure_work(Model *m, size_t n) {
    if (m->work_len >= n) return;
    free(m->work);
    m->work = (float *)aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    m->work_len = m->work ? n : 0;
}

/* One query head over the allowed slots idx[0..na-1] (increasing): scores s_i = (q . k_i) * scaling, p_i =
 * fexp(s_i - max) / sum (the sum in slot order), o = sum_i p_i v_i accumulated from zero in slot order. Every value is
 * computed by the same sequence of operations whatever the other rows, slots or heads (row invariant); the AVX-512 path
 * only runs independent scores side by side (4 slots at once, each exactly dot()) and keeps o in registers (each
 * element the same fused multiply-adds in the same order as the plain loop). sc: na floats of scratch. */
#if defined(__AVX512F__)
static inline void dot4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3, int n,
                        float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(q + i);
        a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + i), a0);
        a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k1 + i), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k2 + i), a2);
        a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k3 + i), a3);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(k, q + i);
        a0 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(k, k0 + i), a0);
        a1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(k, k1 + i), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(k, k2 + i), a2);
        a3 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(k, k3 + i), a3);
    }
    out[0] = _mm512_reduce_add_ps(a0); out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2); out[3] = _mm512_reduce_add_ps(a3);
}

/* 16 bfloat16 values (a bfloat16 KV cache) widened to float32, exactly */
static inline __m512 ld_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* dot4 over keys held in bfloat16, n a multiple of 16: the same operations on the same values */
static inline void dot4_bf16(const float *q, const uint16_t *k0, const uint16_t *k1, const uint16_t *k2,
                             const uint16_t *k3, int n, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(q + i);
        a0 = _mm512_fmadd_ps(x, ld_bf16(k0 + i), a0);
        a1 = _mm512_fmadd_ps(x, ld_bf16(k1 + i), a1);
        a2 = _mm512_fmadd_ps(x, ld_bf16(k2 + i), a2);
        a3 = _mm512_fmadd_ps(x, ld_bf16(k3 + i), a3);
    }
    out[0] = _mm512_reduce_add_ps(a0); out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2); out[3] = _mm512_reduce_add_ps(a3);
}

/* o (NC x 16 floats) = sum_i (p[i] * inv) v_i in slot order, the accumulators in registers (NC a constant); v in
 * float32 or (kv16) bfloat16 */
static inline __attribute__((always_inline)) void pv_regs(const float *p, float inv, const void *vb, int kv16,
                                                          const int32_t *idx, int na, int D, int NC, float *o) {
    __m512 acc[8];
    for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    if (kv16) {
        for (int i = 0; i < na; i++) {
            __m512 pj = _mm512_set1_ps(p[i] * inv);
            const uint16_t *vv = (const uint16_t *)vb + (size_t)idx[i] * D;
            for (int c = 0; c < NC; c++) acc[c] = _mm512_fmadd_ps(pj, ld_bf16(vv + 16 * c), acc[c]);
        }
    } else {
        for (int i = 0; i < na; i++) {
            __m512 pj = _mm512_set1_ps(p[i] * inv);
            const float *vv = (const float *)vb + (size_t)idx[i] * D;
            for (int c = 0; c < NC; c++) acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vv + 16 * c), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}
#endif

/* one key (or value) row as float32: the row itself (float32 cache) or widened into buf (bfloat16 cache) */
static inline const float *kv_row(const void *base, int kv16, size_t j, int D, float *buf) {
    if (!kv16) return (const float *)base + j * D;
    const uint16_t *r = (const uint16_t *)base + j * D;
    for (int d = 0; d < D; d++) buf[d] = bf16_float(r[d]);
    return buf;
}

/* softmax weights of na scores in place (scaled first): fexp(s - max), their sum in slot order; returns 1 / sum */
static float softmax_weights(float *sc, int na, float scaling) {
    int i;
    for (i = 0; i < na; i++) sc[i] = sc[i] * scaling;
    float mx = -INFINITY;  /* the max of finite values: the same whatever the order (an equal +0 / -0 max gives the
                              same fexp(s - max)) */
    i = 0;
#if defined(__AVX512F__)
    if (na >= 16) {
        __m512 m16 = _mm512_loadu_ps(sc);
        for (i = 16; i + 16 <= na; i += 16) m16 = _mm512_max_ps(m16, _mm512_loadu_ps(sc + i));
        mx = _mm512_reduce_max_ps(m16);
    }
#endif
    for (; i < na; i++) mx = sc[i] > mx ? sc[i] : mx;
    for (i = 0; i < na; i++) sc[i] = fexp(sc[i] - mx);
    float sum = 0.0f;
    for (i = 0; i < na; i++) sum += sc[i];
    return 1.0f / sum;
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 ld_kv(const void *p, size_t i, int KV16) {
    return KV16 ? ld_bf16((const uint16_t *)p + i) : _mm512_loadu_ps((const float *)p + i);
}

/* scores of two query heads against four keys (n a multiple of 16), each exactly dot(): a key chunk is loaded once
 * for both heads (the heads of one KV group) */
static inline __attribute__((always_inline)) void dot2x4(const float *q0, const float *q1, const void *const *k,
                                                         int n, int KV16, float *s0, float *s1) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(q0 + i), y = _mm512_loadu_ps(q1 + i);
        __m512 k0 = ld_kv(k[0], i, KV16), k1 = ld_kv(k[1], i, KV16), k2 = ld_kv(k[2], i, KV16),
               k3 = ld_kv(k[3], i, KV16);
        a0 = _mm512_fmadd_ps(x, k0, a0); a1 = _mm512_fmadd_ps(x, k1, a1);
        a2 = _mm512_fmadd_ps(x, k2, a2); a3 = _mm512_fmadd_ps(x, k3, a3);
        b0 = _mm512_fmadd_ps(y, k0, b0); b1 = _mm512_fmadd_ps(y, k1, b1);
        b2 = _mm512_fmadd_ps(y, k2, b2); b3 = _mm512_fmadd_ps(y, k3, b3);
    }
    s0[0] = _mm512_reduce_add_ps(a0); s0[1] = _mm512_reduce_add_ps(a1);
    s0[2] = _mm512_reduce_add_ps(a2); s0[3] = _mm512_reduce_add_ps(a3);
    s1[0] = _mm512_reduce_add_ps(b0); s1[1] = _mm512_reduce_add_ps(b1);
    s1[2] = _mm512_reduce_add_ps(b2); s1[3] = _mm512_reduce_add_ps(b3);
}

/* pv_regs for two heads over the same values: each value chunk loaded once */
static inline __attribute__((always_inline)) void pv2_regs(const float *p0, float inv0, const float *p1, float inv1,
                                                           const void *vb, int KV16, const int32_t *idx, int na,
                                                           int D, int NC, float *o0, float *o1) {
    __m512 acc0[8], acc1[8];
    for (int c = 0; c < NC; c++) acc0[c] = acc1[c] = _mm512_setzero_ps();
    for (int i = 0; i < na; i++) {
        __m512 w0 = _mm512_set1_ps(p0[i] * inv0), w1 = _mm512_set1_ps(p1[i] * inv1);
        size_t row = (size_t)idx[i] * D;
        for (int c = 0; c < NC; c++) {
            __m512 v = ld_kv(vb, row + 16 * c, KV16);
            acc0[c] = _mm512_fmadd_ps(w0, v, acc0[c]);
            acc1[c] = _mm512_fmadd_ps(w1, v, acc1[c]);
        }
    }
    for (int c = 0; c < NC; c++) { _mm512_storeu_ps(o0 + 16 * c, acc0[c]); _mm512_storeu_ps(o1 + 16 * c, acc1[c]); }
}

/* two query heads of one KV group (D a multiple of 16, at most 128), KV16 a constant */
static inline __attribute__((always_inline)) void attend_pair_t(const float *q0, const float *q1, const void *kb,
                                                                const void *vb, int KV16, int D, const int32_t *idx,
                                                                int na, float scaling, float *sc0, float *sc1,
                                                                float *o0, float *o1) {
    size_t es = KV16 ? 2 : 4;
    int i = 0;
    for (; i + 4 <= na; i += 4) {
        const void *k[4];
        for (int t = 0; t < 4; t++) k[t] = (const char *)kb + (size_t)idx[i + t] * D * es;
        dot2x4(q0, q1, k, D, KV16, sc0 + i, sc1 + i);
    }
    float buf[1024];
    for (; i < na; i++) {
        const float *kr = kv_row(kb, KV16, (size_t)idx[i], D, buf);
        sc0[i] = dot(q0, kr, D);
        sc1[i] = dot(q1, kr, D);
    }
    float inv0 = softmax_weights(sc0, na, scaling), inv1 = softmax_weights(sc1, na, scaling);
    switch (D / 16) {
        case 8: pv2_regs(sc0, inv0, sc1, inv1, vb, KV16, idx, na, D, 8, o0, o1); break;
        case 4: pv2_regs(sc0, inv0, sc1, inv1, vb, KV16, idx, na, D, 4, o0, o1); break;
        case 2: pv2_regs(sc0, inv0, sc1, inv1, vb, KV16, idx, na, D, 2, o0, o1); break;
        default: pv2_regs(sc0, inv0, sc1, inv1, vb, KV16, idx, na, D, 1, o0, o1); break;
    }
}
#endif

static void attend(const float *q, const void *kb, const void *vb, int kv16, int D, const int32_t *idx, int na,
                   float scaling, float *sc, float *o) {
    int i = 0;
    float buf[1024];  /* a widened bfloat16 row (D <= MAX_HEAD_DIM) */
#if defined(__AVX512F__)
    if (!kv16) {
        const float *k = (const float *)kb;
        for (; i + 4 <= na; i += 4)
            dot4(q, k + (size_t)idx[i] * D, k + (size_t)idx[i + 1] * D, k + (size_t)idx[i + 2] * D,
                 k + (size_t)idx[i + 3] * D, D, sc + i);
    } else if (D % 16 == 0) {
        const uint16_t *k = (const uint16_t *)kb;
        for (; i + 4 <= na; i += 4)
            dot4_bf16(q, k + (size_t)idx[i] * D, k + (size_t)idx[i + 1] * D, k + (size_t)idx[i + 2] * D,
                      k + (size_t)idx[i + 3] * D, D, sc + i);
    }
#endif
    for (; i < na; i++) sc[i] = dot(q, kv_row(kb, kv16, (size_t)idx[i], D, buf), D);
    float inv = softmax_weights(sc, na, scaling);
#if defined(__AVX512F__)
    if (D % 16 == 0 && D <= 128) {
        switch (D / 16) {
            case 8: pv_regs(sc, inv, vb, kv16, idx, na, D, 8, o); return;
            case 4: pv_regs(sc, inv, vb, kv16, idx, na, D, 4, o); return;
            case 2: pv_regs(sc, inv, vb, kv16, idx, na, D, 2, o); return;
            case 1: pv_regs(sc, inv, vb, kv16, idx, na, D, 1, o); return;
            default: break;
        }
    }
#endif
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (i = 0; i < na; i++) {
        float pj = sc[i] * inv;
        const float *vv = kv_row(vb, kv16, (size_t)idx[i], D, buf);
        for (int d = 0; d < D; d++) o[d] = fmaf(pj, vv[d], o[d]);
    }
}

/* query heads h0, h0 + 1 (of one KV group) at once where the AVX-512 pair path applies, else one by one: the same
 * values either way (every score and output element is the same sequence of operations). sc: 2 na floats. */
static void attend_heads(const float *q0, const float *q1, const void *kb, const void *vb, int kv16, int D,
                         const int32_t *idx, int na, float scaling, float *sc, float *o0, float *o1) {
#if defined(__AVX512F__)
    if (q1 && D % 16 == 0 && D <= 128) {
        if (kv16) attend_pair_t(q0, q1, kb, vb, 1, D, idx, na, scaling, sc, sc + na, o0, o1);
        else attend_pair_t(q0, q1, kb, vb, 0, D, idx, na, scaling, sc, sc + na, o0, o1);
        return;
    }
#endif
    attend(q0, kb, vb, kv16, D, idx, na, scaling, sc, o0);
    if (q1) attend(q1, kb, vb, kv16, D, idx, na, scaling, sc, o1);
}

/* The decoder stack over a slot KV cache of S slots of which attention scans the first NS (NS <= S): allow is
 * (B, Q, NS), slots NS..S-1 are neither read nor scanned (rvq_forward: NS = S; rvq_forward_scan: a growing prefix). */
static int forward_impl(Model *m, const float *x_in, const float *cos_t, const float *sin_t, const uint8_t *allow,
                        const int64_t *write, void *kc, void *vc, int B, int Q, int S, int NS, float *out) {
    int R = B * Q, H = m->H, NH = m->NH, NKV = m->NKV, D = m->D, I = m->I, bf = m->act_bf16, kv16 = m->kv_bf16;
    size_t es = kv16 ? sizeof(uint16_t) : sizeof(float);  /* bytes per cached value */
    int NQKV = (NH + 2 * NKV) * D, rep = NH / NKV, half = D / 2;
    int kmax = H > NH * D ? H : NH * D;
    kmax = kmax > I ? kmax : I;
    size_t lw = rvq_linear_work(m->prec, R, kmax);
    size_t need = (size_t)R * (H + H + NQKV + NH * D + 2 * I) + 3 * (size_t)NS + lw;
    ensure_work(m, need);
    if (!m->work) return -1;
    float *x = m->work, *hb = x + (size_t)R * H, *qkv = hb + (size_t)R * H, *att = qkv + (size_t)R * NQKV,
          *gu = att + (size_t)R * NH * D, *sc = gu + (size_t)R * 2 * I, *lwork = sc + 3 * (size_t)NS;
    int32_t *slot_idx = (int32_t *)(sc + 2 * (size_t)NS);
    memcpy(x, x_in, sizeof(float) * (size_t)R * H);
    for (int l = 0; l < m->L; l++) {
        const Linear *lin = m->lin + l * 4;
        const float **nw = m->norms + l * 4;
        char *kl = (char *)kc + (size_t)l * B * NKV * S * D * es, *vl = (char *)vc + (size_t)l * B * NKV * S * D * es;
        for (int r = 0; r < R; r++) rms(x + (size_t)r * H, nw[N_IN], hb + (size_t)r * H, H, m->eps, bf);
        linear_run(&lin[W_QKV], hb, H, qkv, NQKV, R, bf, lwork);
        /* q, k: per-head RMSNorm then RoPE (q * cos + rotate_half(q) * sin); k, v into the cache */
        float tmp[1024], rot_t[1024];
        for (int r = 0; r < R; r++) {
            int b = r / Q, qi = r % Q;
            const float *c = cos_t + (size_t)r * D, *s = sin_t + (size_t)r * D;
            float *row = qkv + (size_t)r * NQKV;
            for (int hh = 0; hh < NH + NKV; hh++) {
                float *v = row + (size_t)hh * D;
                rms(v, nw[hh < NH ? N_Q : N_K], tmp, D, m->eps, bf);
                for (int d = 0; d < half; d++) rot_t[d] = -tmp[d + half];
                for (int d = half; d < D; d++) rot_t[d] = tmp[d - half];
                if (bf) for (int d = 0; d < D; d++) v[d] = rb(rb(tmp[d] * c[d]) + rb(rot_t[d] * s[d]));
                else for (int d = 0; d < D; d++) v[d] = tmp[d] * c[d] + rot_t[d] * s[d];
            }
            int64_t slot = write[(size_t)b * Q + qi];
            for (int kh = 0; kh < NKV; kh++) {
                size_t off = (((size_t)b * NKV + kh) * S + slot) * D * es;
                const float *kr = row + (size_t)(NH + kh) * D, *vr = row + (size_t)(NH + NKV + kh) * D;
                if (kv16) {  /* bfloat16 values already (kv_bf16 needs act_bf16): the top half is exact */
                    uint16_t *kd = (uint16_t *)(kl + off), *vd = (uint16_t *)(vl + off);
                    for (int d = 0; d < D; d++) { kd[d] = (uint16_t)(f2u(kr[d]) >> 16); vd[d] = (uint16_t)(f2u(vr[d]) >> 16); }
                } else {
                    memcpy(kl + off, kr, sizeof(float) * D);
                    memcpy(vl + off, vr, sizeof(float) * D);
                }
            }
        }
        /* attention: each row over its allowed slots, in slot order (attend) */
        for (int r = 0; r < R; r++) {
            int b = r / Q, qi = r % Q, na = 0;
            const uint8_t *al = allow + ((size_t)b * Q + qi) * NS;
            for (int j = 0; j < NS; j++) if (al[j]) slot_idx[na++] = j;
            float *row = qkv + (size_t)r * NQKV;
            for (int hh = 0; hh < NH; hh += 2) {  /* two query heads at a time within a KV group */
                int kh = hh / rep, pair = hh + 1 < NH && (hh + 1) / rep == kh;
                const char *kb = kl + ((size_t)b * NKV + kh) * S * D * es, *vb = vl + ((size_t)b * NKV + kh) * S * D * es;
                float *o = att + (size_t)r * NH * D + (size_t)hh * D;
                attend_heads(row + (size_t)hh * D, pair ? row + (size_t)(hh + 1) * D : NULL, kb, vb, kv16, D,
                             slot_idx, na, m->scaling, sc, o, pair ? o + D : NULL);
                if (!pair && hh + 1 < NH) {  /* the next head belongs to another KV group */
                    int k2 = (hh + 1) / rep;
                    attend(row + (size_t)(hh + 1) * D, kl + ((size_t)b * NKV + k2) * S * D * es,
                           vl + ((size_t)b * NKV + k2) * S * D * es, kv16, D, slot_idx, na, m->scaling, sc, o + D);
                }
                if (bf) for (int d = 0; d < 2 * D && hh * D + d < NH * D; d++) o[d] = rb(o[d]);
            }
        }
        linear_run(&lin[W_O], att, NH * D, hb, H, R, bf, lwork);
        if (bf) for (size_t i = 0; i < (size_t)R * H; i++) x[i] = rb(x[i] + hb[i]);
        else for (size_t i = 0; i < (size_t)R * H; i++) x[i] = x[i] + hb[i];
        for (int r = 0; r < R; r++) rms(x + (size_t)r * H, nw[N_POST], hb + (size_t)r * H, H, m->eps, bf);
        linear_run(&lin[W_GU], hb, H, gu, 2 * I, R, bf, lwork);
        for (int r = 0; r < R; r++) {
            float *g = gu + (size_t)r * 2 * I, *u = g + I;
            if (bf) for (int i = 0; i < I; i++) g[i] = rb(rb(g[i] / (1.0f + fexp(-g[i]))) * u[i]);
            else for (int i = 0; i < I; i++) g[i] = g[i] / (1.0f + fexp(-g[i])) * u[i];
        }
        linear_run(&lin[W_DOWN], gu, 2 * I, hb, H, R, bf, lwork);
        if (bf) for (size_t i = 0; i < (size_t)R * H; i++) x[i] = rb(x[i] + hb[i]);
        else for (size_t i = 0; i < (size_t)R * H; i++) x[i] = x[i] + hb[i];
    }
    for (int r = 0; r < R; r++) rms(x + (size_t)r * H, m->final_norm, out + (size_t)r * H, H, m->eps, bf);
    return 0;
}

/* THE verify call (rvqspec_lib.decoding.predictor.verify_forward's contract):
 *   x (B*Q, H) inputs; cos, sin (B*Q, D) the rotary tables at each row's position; allow (B, Q, S) uint8;
 *   write (B, Q) int64 slots; kc, vc (L, B, NKV, S, D) float32 (bfloat16 after rvq_model_set_kv_bf16), written at
 *   the call's slots;
 *   out (B*Q, H) after the final norm.
 * Returns 0, or -1 when scratch memory could not be allocated. */
int rvq_forward(void *h, const float *x_in, const float *cos_t, const float *sin_t, const uint8_t *allow,
                const int64_t *write, void *kc, void *vc, int B, int Q, int S, float *out) {
    return forward_impl((Model *)h, x_in, cos_t, sin_t, allow, write, kc, vc, B, Q, S, S, out);
}

/* The same call over a cache of S slots whose first NS slots alone can be attended (the talker's growing KV cache,
 * rvqspec_lib.device.native_talker): allow is (B, Q, NS) and attention scans NS slots, not S, so a step's cost grows
 * with the context, not with the cache's capacity. write slots must be < NS to be seen by later rows of the call.
 * Every row's arithmetic is rvq_forward's over the same allowed slots (bit for bit). Returns 0, -1 (scratch memory)
 * or -2 (NS outside 1..S). */
int rvq_forward_scan(void *h, const float *x_in, const float *cos_t, const float *sin_t, const uint8_t *allow,
                     const int64_t *write, void *kc, void *vc, int B, int Q, int S, int NS, float *out) {
    if (NS < 1 || NS > S) return -2;
    return forward_impl((Model *)h, x_in, cos_t, sin_t, allow, write, kc, vc, B, Q, S, NS, out);
}

/* =====================================================================================================================
 * THE NATIVE FUSED FRAME (docs/methods.md#the-fused-speculative-round): a whole frame of Chain(window) speculation in
 * one C call -- the prefill, then rounds of draft -> verify -> accept -> commit in a bounded loop -- over the model
 * above (rvq_forward) and the packed per-depth heads. Bound by rvqspec_lib/device/native_frame.py (NativeChainFrame).
 *
 * SEMANTICS are rvqspec_lib.device.fused_spec.FusedChainFrame's, uniform for uniform. With K = window - 1 and n codes:
 *   prefill   positions (= slots) 0, 1 hold the projected context; code 1 = icdf(warp(lm_head[0](H)), u[b, 0, 0]).
 *   round s   (after committed code s, s = 1..n-1): D = min(K, n - s) drafts, draft j (depth s+j) drawn from
 *             q_j = warp(lm_head[s+j-1](H_s)) with u[b, s, j-1]; ONE rvq_forward over the root (code s, position s+1)
 *             and the drafts that have a code after them (q_len = 1 + min(K, n-1-s) rows at positions = slots
 *             s+1..s+q_len, causal); p_i = warp(lm_head[s+i](hid_i)); draft j accepted when
 *             u[b, s, K+j-1] < min(1, (p_{j-1}(x_j) / sum p_{j-1}) / q_j(x_j)); at the first rejection the next code is
 *             drawn from max(norm(p_{j-1}) - q_j, 0) (p_{j-1} itself where nothing is left) with u[b, s, 2K]; after a
 *             fully accepted chain the bonus code from p_D with u[b, s, 2K] when node D was verified (q_len = D + 1);
 *             the accepted drafts and the next code are committed, the hidden state of the last accepted node is H
 *             of the next round. window = 1 (K = 0) is the AR frame: uniforms (B, n, 1), u[b, s, 0] draws code s+1.
 *   warp      scores = logits / temperature (float32), top-k keeps every score >= the k-th largest (ties kept, as
 *             transformers' TopKLogitsWarper), softmax in float32; greedy: one-hot of the first maximal logit.
 *   icdf      the first code whose float64 cumulative mass (index order) exceeds u * total, clamped to the last code
 *             with mass (rvqspec_lib.device.fused_spec.inverse_cdf: zeros add nothing, so only the support is summed).
 * p is computed LAZILY: p_{j-1} only when draft j is tested, p_D only for the bonus. Tests after the first rejection
 * are never needed (FusedChainFrame computes and ignores them), so the codes are the same and a round applies
 * (accepted + 1) verify heads instead of q_len.
 *
 * Rows are decoded one after the other, each with its own float32 KV cache of n + 1 slots (a chain's accepted nodes
 * are a prefix: slot = position, no compaction; a rejected node's slot is never allowed, and is overwritten by the
 * next round). Every quantity of a row is a function of that row's context and uniforms alone, so a row's codes are
 * the same alone or in any batch. The embedding tables are the official small_to_mtp_projection applied to each
 * codec_embedding table (precomputed by the caller, float32 holding the activation dtype's values).
 *
 * Entry points: rvq_frame_new (a frame object: heads, tables, buffers, allocated once), rvq_frame_run (B frames, no
 * allocation), rvq_frame_free. The rows share nothing but the frame object's
 * scratch, so a frame object is not re-entrant (one thread at a time), as the model handle.
 *
 * flags (negative controls for the tests, each a deliberately LOSSY rule; 0 in use): FRAME_ALWAYS_ACCEPT accepts
 * every draft; FRAME_DRAFTS_HOT draws drafts from q^(T / 1.5) (q re-warped to temperature 1.5) while acceptance is
 * handed q; FRAME_RESIDUAL_FROM_P draws the code after a rejection from p instead of the residual.
 * ===================================================================================================================== */

enum { FRAME_ALWAYS_ACCEPT = 1, FRAME_DRAFTS_HOT = 2, FRAME_RESIDUAL_FROM_P = 4 };
#define FRAME_MAX_WINDOW 8

/* a warped distribution: dense probabilities (zero outside the support) and its support in increasing code order */
typedef struct {
    float *p;
    int32_t *idx;
    int n;
} Dist;

typedef struct {
    Model *m;
    Linear *heads;            /* n heads: lm_head[i] predicts code i + 1 */
    const float *const *emb;  /* n - 1 tables (V, H): emb[j - 1] embeds code j, projected */
    const float *cos_t, *sin_t;
    int n, V, K, S, top_k, greedy, flags;
    float temperature;
    float *kc, *vc, *x, *hid, *h, *logits, *top, *lwork;
    Dist q[FRAME_MAX_WINDOW], p, res;
    uint8_t *allow;
    int64_t *write;
} Frame;

static void dist_clear(Dist *d) {
    for (int i = 0; i < d->n; i++) d->p[d->idx[i]] = 0.0f;
    d->n = 0;
}

/* the k-th largest of n floats (1 <= k <= n; NaN never reaches it), counting ties, as torch.topk(s, k)[0][-1]: a
 * quickselect whose partitions are three-way (above / equal to / below a median-of-three pivot) and branch-free,
 * 16 values at a time with AVX-512 (compress into registers, then a plain store: a compressing store to memory is
 * slow on some CPUs). A value, so any correct selection gives the same one. work: 4 (n + 16) floats. */
static float kth_largest(const float *s, int n, int k, float *work) {
    const float *a = s;
    size_t r = (size_t)n + 16;  /* two pairs of regions (above, below), used in turn */
    for (int level = 0;; level++) {
        if (n <= 16) {  /* insertion sort, decreasing */
            float t[16];
            for (int i = 0; i < n; i++) {
                int j = i;
                while (j > 0 && t[j - 1] < a[i]) { t[j] = t[j - 1]; j--; }
                t[j] = a[i];
            }
            return t[k - 1];
        }
        float x = a[0], y = a[n / 2], z = a[n - 1];
        float pivot = x < y ? (y < z ? y : x < z ? z : x) : (x < z ? x : y < z ? z : y);
        float *hi = work + (size_t)(level & 1) * 2 * r, *lo = hi + r;
        int nh = 0, nl = 0, i = 0;
#if defined(__AVX512F__)
        __m512 pv = _mm512_set1_ps(pivot);
        for (; i + 16 <= n; i += 16) {
            __m512 v = _mm512_loadu_ps(a + i);
            __mmask16 mh = _mm512_cmp_ps_mask(v, pv, _CMP_GT_OQ), ml = _mm512_cmp_ps_mask(v, pv, _CMP_LT_OQ);
            _mm512_storeu_ps(hi + nh, _mm512_maskz_compress_ps(mh, v));
            _mm512_storeu_ps(lo + nl, _mm512_maskz_compress_ps(ml, v));
            nh += __builtin_popcount(mh);
            nl += __builtin_popcount(ml);
        }
#endif
        for (; i < n; i++) {
            hi[nh] = a[i]; nh += a[i] > pivot;
            lo[nl] = a[i]; nl += a[i] < pivot;
        }
        if (k <= nh) { a = hi; n = nh; }
        else if (k <= n - nl) return pivot;
        else { k -= n - nl; a = lo; n = nl; }
    }
}

/* warped float32 probabilities of one row of logits (rvqspec_lib.device.fused.warp_scores, then softmax) into d; the
 * logits are overwritten by the scores (logits / temperature) */
static void frame_warp(const Frame *f, float *logits, Dist *d) {
    int V = f->V;
    dist_clear(d);
    if (f->greedy) {
        int best = 0;
        for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        d->p[best] = 1.0f;
        d->idx[0] = best;
        d->n = 1;
        return;
    }
    float *sc = logits;
    if (f->temperature != 1.0f) for (int i = 0; i < V; i++) sc[i] = sc[i] / f->temperature;
    float kth = -INFINITY;
    if (f->top_k > 0) kth = kth_largest(sc, V, f->top_k < V ? f->top_k : V, f->top);
    int n = 0, i = 0;
#if defined(__AVX512F__)
    __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= V; i += 16) {  /* idx has 16 entries of slack */
        __mmask16 mk = _mm512_cmp_ps_mask(_mm512_loadu_ps(sc + i), _mm512_set1_ps(kth), _CMP_GE_OQ);
        _mm512_storeu_si512(d->idx + n, _mm512_maskz_compress_epi32(mk, _mm512_add_epi32(iota, _mm512_set1_epi32(i))));
        n += __builtin_popcount(mk);
    }
#endif
    for (; i < V; i++) if (sc[i] >= kth) d->idx[n++] = i;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) mx = sc[d->idx[j]] > mx ? sc[d->idx[j]] : mx;
    for (int j = 0; j < n; j++) {
        float e = expf(sc[d->idx[j]] - mx);
        d->p[d->idx[j]] = e;
        sum += e;
    }
    for (int j = 0; j < n; j++) d->p[d->idx[j]] = d->p[d->idx[j]] / sum;
    d->n = n;
}

/* one code drawn from d (non-negative, not necessarily normalised) with the uniform u: inverse_cdf's rule (the first
 * code whose float64 cumulative mass exceeds u * total, clamped to the last code with mass; zeros add nothing) */
static int frame_icdf(const Dist *d, int V, double u) {
    double tot = 0.0;
    int last = -1;
    for (int j = 0; j < d->n; j++)
        if (d->p[d->idx[j]] > 0.0f) { tot += (double)d->p[d->idx[j]]; last = d->idx[j]; }
    if (last < 0) return V - 1;
    double x = u * tot, c = 0.0;
    for (int j = 0; j < d->n; j++) {
        float v = d->p[d->idx[j]];
        if (v > 0.0f) {
            c += (double)v;
            if (c > x) return d->idx[j];
        }
    }
    return last;
}

/* the float32 sum of d in code order */
static float dist_sum(const Dist *d) {
    float s = 0.0f;
    for (int j = 0; j < d->n; j++) s += d->p[d->idx[j]];
    return s;
}

static void frame_head(Frame *f, int i, const float *h, float *logits) {
    linear_run(&f->heads[i], h, f->m->H, logits, f->V, 1, f->m->act_bf16, f->lwork);
}

/* causal rows over slot = position: row i at position first + i sees slots 0..first + i and writes slot first + i */
static void frame_mask(Frame *f, int first, int q_len) {
    memset(f->allow, 0, (size_t)q_len * f->S);
    for (int i = 0; i < q_len; i++) {
        memset(f->allow + (size_t)i * f->S, 1, (size_t)(first + i + 1));
        f->write[i] = first + i;
    }
}

/* one frame of one row: ctx (2, H) projected, u (n, 2K+1) -> codes (n); returns 0 or -1 (scratch allocation) */
static int frame_row(Frame *f, const float *ctx, const double *u, int64_t *codes, int32_t *calls) {
    Model *m = f->m;
    int H = m->H, D = m->D, n = f->n, V = f->V, K = f->K, W = 2 * K + 1, frc;
    int xs[FRAME_MAX_WINDOW + 1];
    memcpy(f->x, ctx, sizeof(float) * 2 * H);
    frame_mask(f, 0, 2);
    frc = rvq_forward(m, f->x, f->cos_t, f->sin_t, f->allow, f->write, f->kc, f->vc, 1, 2, f->S, f->hid);
    if (frc) return -1;
    memcpy(f->h, f->hid + H, sizeof(float) * H);
    frame_head(f, 0, f->h, f->logits);
    frame_warp(f, f->logits, &f->p);
    codes[0] = frame_icdf(&f->p, V, u[0]);
    *calls = 1;
    int s = 1;
    while (s < n) {
        const double *ur = u + (size_t)s * W;
        int nd = K < n - s ? K : n - s, q_len = 1 + (K < n - 1 - s ? K : n - 1 - s), bonus = q_len == nd + 1;
        /* 1. draft: q_j from H_s, x_j by the inverse CDF */
        for (int j = 1; j <= nd; j++) {
            Dist *qj = &f->q[j - 1];
            frame_head(f, s + j - 1, f->h, f->logits);
            frame_warp(f, f->logits, qj);
            if (f->flags & FRAME_DRAFTS_HOT) {
                float e = f->greedy ? 1.0f : f->temperature / 1.5f;
                dist_clear(&f->res);
                for (int i = 0; i < qj->n; i++) {
                    int c = qj->idx[i];
                    f->res.p[c] = qj->p[c] > 0.0f ? powf(qj->p[c], e) : 0.0f;
                    f->res.idx[i] = c;
                }
                f->res.n = qj->n;
                xs[j] = frame_icdf(&f->res, V, ur[j - 1]);
            } else {
                xs[j] = frame_icdf(qj, V, ur[j - 1]);
            }
        }
        /* 2. verify: the root and the fed drafts at positions = slots s+1.. */
        memcpy(f->x, f->emb[s - 1] + (size_t)codes[s - 1] * H, sizeof(float) * H);
        for (int i = 1; i < q_len; i++)
            memcpy(f->x + (size_t)i * H, f->emb[s - 1 + i] + (size_t)xs[i] * H, sizeof(float) * H);
        frame_mask(f, s + 1, q_len);
        frc = rvq_forward(m, f->x, f->cos_t + (size_t)(s + 1) * D, f->sin_t + (size_t)(s + 1) * D, f->allow, f->write,
                          f->kc, f->vc, 1, q_len, f->S, f->hid);
        if (frc) return -1;
        (*calls)++;
        /* 3. accept: the leading run of accepts, p computed only where a test needs it */
        int na = 0, nxt = -1;
        for (int j = 1; j <= nd; j++) {
            const Dist *qj = &f->q[j - 1];
            Dist *p = &f->p;
            frame_head(f, s + j - 1, f->hid + (size_t)(j - 1) * H, f->logits);
            frame_warp(f, f->logits, p);
            int x = xs[j];
            float psum = dist_sum(p);
            psum = psum > 1e-30f ? psum : 1e-30f;
            float qx = qj->p[x] > 1e-30f ? qj->p[x] : 1e-30f;
            float a = (p->p[x] / psum) / qx;
            a = a < 1.0f ? a : 1.0f;
            if ((f->flags & FRAME_ALWAYS_ACCEPT) || ur[K + j - 1] < (double)a) { na++; continue; }
            if (f->flags & FRAME_RESIDUAL_FROM_P) { nxt = frame_icdf(p, V, ur[2 * K]); break; }
            /* the residual max(norm(p) - q, 0): its support lies in p's */
            Dist *r = &f->res;
            dist_clear(r);
            for (int i = 0; i < p->n; i++) {
                int c = p->idx[i];
                float v = p->p[c] / psum - qj->p[c];
                if (v > 0.0f) { r->p[c] = v; r->idx[r->n++] = c; }
            }
            nxt = frame_icdf(r->n ? r : p, V, ur[2 * K]);
            break;
        }
        if (na == nd && bonus) {
            frame_head(f, s + nd, f->hid + (size_t)nd * H, f->logits);
            frame_warp(f, f->logits, &f->p);
            nxt = frame_icdf(&f->p, V, ur[2 * K]);
        }
        /* 4. commit */
        for (int j = 0; j < na; j++) codes[s + j] = xs[j + 1];
        if (nxt >= 0) codes[s + na] = nxt;
        memcpy(f->h, f->hid + (size_t)(na < q_len - 1 ? na : q_len - 1) * H, sizeof(float) * H);
        s += na + (nxt >= 0);
    }
    return 0;
}

/* ---- the entry points ----------------------------------------------------------------------------------------
 * A frame object owns everything a frame needs besides the model (heads as Linear, the KV cache of one row, the
 * verify rows, the distributions), allocated once: a frame call allocates nothing. The dense distributions are zero
 * outside their supports on entry and on exit (dist_clear). */
void rvq_frame_free(void *h) {
    Frame *f = (Frame *)h;
    if (!f) return;
    free(f->kc); free(f->heads); free(f->allow); free(f->write); free(f);
}

/* A frame object for windows 1..FRAME_MAX_WINDOW over the model.
 *   model: rvq_model_new's handle. head_w / head_scale / head_comp: n_codes packed heads (N = V outputs, K = H
 *   inputs, the model's precision; scale and comp entries NULL, or the arrays NULL, where the precision has none).
 *   emb: n_codes - 1 float32 tables (V, H), projected (emb[j - 1] embeds code j). cos_t, sin_t: rotary tables of at
 *   least n_codes + 1 positions (D each). The caller keeps all of them alive while the frame lives.
 * Returns NULL for a window outside 1..FRAME_MAX_WINDOW, n_codes < 1 or V < 1, or when memory is short. */
void *rvq_frame_new(void *model, const void *const *head_w, const float *const *head_scale,
                    const int32_t *const *head_comp, int n_codes, int V, const float *const *emb,
                    const float *cos_t, const float *sin_t, int window) {
    Model *m = (Model *)model;
    if (!m || window < 1 || window > FRAME_MAX_WINDOW || n_codes < 1 || V < 1) return NULL;
    Frame *f = (Frame *)calloc(1, sizeof(Frame));
    if (!f) return NULL;
    f->m = m; f->emb = emb; f->cos_t = cos_t; f->sin_t = sin_t;
    f->n = n_codes; f->V = V; f->K = window - 1; f->S = n_codes + 1;
    int H = m->H, rows = window > 2 ? window : 2;
    size_t cache = (size_t)m->L * m->NKV * f->S * m->D;
    size_t lw = rvq_linear_work(m->prec, 1, H);
    int n_dist = f->K + 2;  /* q_1..q_K, p, the residual */
    size_t total = 2 * cache + (size_t)2 * rows * H + H + 5 * (size_t)V + 64 + (size_t)n_dist * (2 * V + 16) + lw;
    float *buf = (float *)aligned_alloc(64, ((total * sizeof(float) + 63) / 64) * 64);
    f->kc = buf;
    f->heads = (Linear *)calloc((size_t)n_codes, sizeof(Linear));
    f->allow = (uint8_t *)malloc((size_t)rows * f->S);
    f->write = (int64_t *)malloc(sizeof(int64_t) * rows);
    if (!buf || !f->heads || !f->allow || !f->write) { rvq_frame_free(f); return NULL; }
    memset(buf, 0, total * sizeof(float));
    f->vc = f->kc + cache; f->x = f->vc + cache; f->hid = f->x + (size_t)rows * H; f->h = f->hid + (size_t)rows * H;
    f->logits = f->h + H; f->top = f->logits + V;
    float *dp = f->top + 4 * (size_t)V + 64;  /* kth_largest's work: 4 (V + 16) */
    for (int i = 0; i < n_dist; i++, dp += 2 * (size_t)V + 16) {
        Dist *d = i < f->K ? &f->q[i] : i == f->K ? &f->p : &f->res;
        d->p = dp; d->idx = (int32_t *)(dp + V); d->n = 0;
    }
    f->lwork = dp;
    for (int i = 0; i < n_codes; i++) {
        Linear L = {m->prec, V, H, head_w[i], head_scale ? head_scale[i] : NULL, head_comp ? head_comp[i] : NULL};
        f->heads[i] = L;
    }
    return f;
}

/* B frames, row after row: ctx (B, 2, H) projected context; u (B, n_codes, 2 window - 1) float64 uniforms;
 * greedy: one-hot argmax (temperature and top_k ignored); top_k 0: no top-k. codes_out (B, n_codes) int64 codes
 * 1..n_codes; calls_out (B,) forward calls each row took (the prefill included).
 * Returns 0; -1 when the model's scratch memory could not be allocated; -2 for temperature <= 0 without greedy. */
int rvq_frame_run(void *frame, const float *ctx, const double *u, int B, float temperature, int top_k, int greedy,
                  int flags, int64_t *codes_out, int32_t *calls_out) {
    Frame *f = (Frame *)frame;
    if (!greedy && !(temperature > 0.0f)) return -2;
    f->top_k = top_k; f->greedy = greedy; f->flags = flags; f->temperature = temperature;
    int H = f->m->H, rc = 0;
    for (int b = 0; b < B && rc == 0; b++)
        rc = frame_row(f, ctx + (size_t)b * 2 * H, u + (size_t)b * f->n * (2 * f->K + 1), codes_out + (size_t)b * f->n,
                       calls_out + b);
    for (int i = 0; i < f->K; i++) dist_clear(&f->q[i]);
    dist_clear(&f->p);
    dist_clear(&f->res);
    return rc;
}
