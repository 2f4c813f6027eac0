/* SnakeBeta of the 12 Hz speech tokenizer's decoder, fused: y = x + inv_beta[c] * sin(alpha[c] * x)^2
 * (official SnakeBeta: x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2; the caller passes alpha = exp(alpha) and
 * inv_beta = 1 / (exp(beta) + 1e-9), computed once).
 *
 * Why (docs/codec_streaming.md): eager torch runs SnakeBeta as five passes over memory (mul, sin, pow, mul, add), and
 * a frame of audio goes through about 2.8 M activations of it; one pass with the sine inline costs a fraction.
 *
 * Layout: x and y (rows, C) row-major, channels contiguous (channels-last activations of shape (B, C, 1, T): rows =
 * B * T); alpha, inv_beta (C,) float32. x and y may be the same buffer. One thread.
 *
 * The sine: sin^2 has period pi, so the argument is reduced to r = a - k * pi in [-pi/2, pi/2] (in double: exact
 * enough for |a| up to about 1e7), and sin(r) is its Taylor polynomial to degree 11 (absolute error below 6e-8 on
 * that interval, under half an ulp of 1.0f). Results agree with torch.sin to float32 rounding, not bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float sin2(float a) {
    double k = nearbyint((double)a * 0.31830988618379067154);  /* 1 / pi */
    float r = (float)((double)a - k * 3.14159265358979323846);
    float r2 = r * r;
    float s = r * (1.0f + r2 * (-1.6666667163e-1f + r2 * (8.3333337680e-3f + r2 * (-1.9841270114e-4f
                   + r2 * (2.7557319224e-6f + r2 * -2.5052108385e-8f)))));
    return s * s;
}

void rvqspec_snake_f32(const float *x, float *y, const float *alpha, const float *inv_beta, int64_t rows, int C) {
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * C;
        float *yr = y + i * C;
#pragma GCC ivdep
        for (int c = 0; c < C; c++) {
            float v = xr[c];
            yr[c] = v + inv_beta[c] * sin2(alpha[c] * v);
        }
    }
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, as torch's conversion */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bfloat16 in and out, float32 inside (the official module in bfloat16 rounds after each of its five ops). */
void rvqspec_snake_bf16(const uint16_t *x, uint16_t *y, const float *alpha, const float *inv_beta, int64_t rows,
                        int C) {
    for (int64_t i = 0; i < rows; i++) {
        const uint16_t *xr = x + i * C;
        uint16_t *yr = y + i * C;
#pragma GCC ivdep
        for (int c = 0; c < C; c++) {
            float v = bf16_to_f32(xr[c]);
            yr[c] = f32_to_bf16(v + inv_beta[c] * sin2(alpha[c] * v));
        }
    }
}
