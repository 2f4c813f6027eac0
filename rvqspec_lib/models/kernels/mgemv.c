/* Multi-row GEMV for the code predictor's small-Q linear layers: y[q, n] = sum_k x[q, k] * W[n, k].
 *
 * Why (docs/offline.md#verify-cost-on-this-cpu): on a CPU with AVX2/FMA only, MKL's sgemm uses its GEMV path for
 * one query row and a general GEMM for two or more, so a verify call of 2 positions costs ~1.5x one of 1. A call
 * of Q <= 64 rows is bound by streaming the weights, not by arithmetic, so the right kernel reads each weight row
 * ONCE and multiplies it with every query row while it sits in L1: blocks of 4 weight rows x 2 query rows keep
 * 8 accumulators in registers (plus 4 weight and 2 query vectors: 14 of the 16 ymm registers).
 *
 * Layout: W (N, K) row-major (an nn.Linear weight), x (Q, K) row-major, y (Q, N) row-major, float32.
 * Requires K % 8 == 0 and N % 4 == 0 (the caller falls back to torch otherwise). One thread.
 * Summation order differs from MKL's (8 partial sums per row, then a horizontal add): results agree to float32
 * rounding, not bit for bit.
 */
#include <immintrin.h>
#include <stddef.h>

static inline float hsum(__m256 v) {  /* sum of the 8 lanes */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 4 weight rows x 2 query rows */
static void block_4x2(const float *w, const float *xa, const float *xb, float *ya, float *yb, int K) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * (size_t)K, *w3 = w + 3 * (size_t)K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int k = 0; k < K; k += 8) {
        __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
        a0 = _mm256_fmadd_ps(v0, va, a0); b0 = _mm256_fmadd_ps(v0, vb, b0);
        a1 = _mm256_fmadd_ps(v1, va, a1); b1 = _mm256_fmadd_ps(v1, vb, b1);
        a2 = _mm256_fmadd_ps(v2, va, a2); b2 = _mm256_fmadd_ps(v2, vb, b2);
        a3 = _mm256_fmadd_ps(v3, va, a3); b3 = _mm256_fmadd_ps(v3, vb, b3);
    }
    ya[0] = hsum(a0); ya[1] = hsum(a1); ya[2] = hsum(a2); ya[3] = hsum(a3);
    yb[0] = hsum(b0); yb[1] = hsum(b1); yb[2] = hsum(b2); yb[3] = hsum(b3);
}

/* 4 weight rows x 1 query row (odd Q): two accumulator chains per row hide the FMA latency */
static void block_4x1(const float *w, const float *xa, float *ya, int K) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * (size_t)K, *w3 = w + 3 * (size_t)K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 va = _mm256_loadu_ps(xa + k), vc = _mm256_loadu_ps(xa + k + 8);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), va, a0); c0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k + 8), vc, c0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), va, a1); c1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k + 8), vc, c1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), va, a2); c2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k + 8), vc, c2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), va, a3); c3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k + 8), vc, c3);
    }
    for (; k < K; k += 8) {
        __m256 va = _mm256_loadu_ps(xa + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), va, a0); a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), va, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), va, a2); a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), va, a3);
    }
    ya[0] = hsum(_mm256_add_ps(a0, c0)); ya[1] = hsum(_mm256_add_ps(a1, c1));
    ya[2] = hsum(_mm256_add_ps(a2, c2)); ya[3] = hsum(_mm256_add_ps(a3, c3));
}

/* y = x @ W^T. Weight rows are the outer loop, so W is streamed from memory exactly once per call. */
void rvqspec_mgemv(const float *W, const float *x, float *y, int N, int K, int Q) {
    for (int n = 0; n < N; n += 4) {
        const float *w = W + (size_t)n * K;
        _mm_prefetch((const char *)(w + 4 * (size_t)K), _MM_HINT_T0);  /* the next block's first row */
        int q = 0;
        for (; q + 2 <= Q; q += 2)
            block_4x2(w, x + (size_t)q * K, x + (size_t)(q + 1) * K, y + (size_t)q * N + n, y + (size_t)(q + 1) * N + n, K);
        if (q < Q)
            block_4x1(w, x + (size_t)q * K, y + (size_t)q * N + n, K);
    }
}
