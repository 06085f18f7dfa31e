/* Row-wise elementwise work between the matmuls, one call each instead of several torch ops.
 *
 * specgram_add_rmsnorm: h[m] += delta[m] * scale (when delta is given; granite's residual multiplier, else 1),
 *   then out[m] = w * h[m] / sqrt(mean(h[m]^2) + eps),
 *   for M rows of N floats; the sum of squares is accumulated in double (exact enough that the order of
 *   summation does not matter at float precision), then the rounding follows transformers' LlamaRMSNorm:
 *   h * rsqrt(var + eps), then weight * that.
 * specgram_add_rmsnorm with dw: delta[m] normed by dw first (gemma3's norms of the branch outputs).
 * specgram_act_mul: out[m, j] = act(gu[m, j]) * gu[m, I + j] for the fused gate|up output gu [M, 2I], act silu or
 *   gelu's tanh form; VW lanes at a time (vexp.h), the last I mod VW columns with libm's expf / tanhf.
 * All per row: batch-invariant (and so independent of the thread count: a call with less than SERIAL_WORK
 * elements runs on the calling thread alone, where starting the OpenMP team would cost more than the work,
 * e.g. a decode row of 576).
 */
#include <math.h>
#include <stdint.h>

#include "specgram.h"
#include "team.h"
#include "vexp.h"


/* y = w * x / sqrt(mean(x^2) + eps) for one row of N floats (y may be x). */
void specgram_rmsnorm_row(const float *x, const float *w, float eps, float *y, int64_t N) {
    double ss = 0.0;
    for (int64_t j = 0; j < N; ++j) ss += (double)x[j] * (double)x[j];
    float var = (float)(ss / (double)N);
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t j = 0; j < N; ++j) y[j] = w[j] * (x[j] * r);
}

/* Rows m0 .. m1 - 1 (forward.c's team shares rows out; the entry points below loop over all of them):
 * h += norm(delta) * scale (dw NULL: delta as it is; scale 1 is exact: the plain add), then h's norm into out. */
void specgram_add_rmsnorm_rows(float *h, const float *delta, const float *dw, float deps, float scale, const float *w,
                               float eps, float *out, int64_t m0, int64_t m1, int64_t N) {
    float normed[dw ? N : 1];
    for (int64_t m = m0; m < m1; ++m) {
        float *x = h + m * N;
        if (delta) {
            const float *d = delta + m * N;
            if (dw) specgram_rmsnorm_row(d, dw, deps, normed, N), d = normed;
            for (int64_t j = 0; j < N; ++j) x[j] = x[j] + d[j] * scale;
        }
        specgram_rmsnorm_row(x, w, eps, out + m * N, N);
    }
}

/* gelu's tanh form, torch's: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), with tanh z = 1 - 2 / (1 + e^2z) */
#define GELU_BETA 0.7978845608028654f
#define GELU_KAPPA 0.044715f

VINLINE vf vf_gelu_tanh(vf g) {
    vf inner = vf_mul(vf_set1(GELU_BETA), vf_add(g, vf_mul(vf_set1(GELU_KAPPA), vf_mul(g, vf_mul(g, g)))));
    vf e = vf_exp(vf_add(inner, inner));
    vf th = vf_sub(vf_set1(1.0f), vf_div(vf_set1(2.0f), vf_add(vf_set1(1.0f), e)));
    return vf_mul(vf_mul(vf_set1(0.5f), g), vf_add(vf_set1(1.0f), th));
}

void specgram_act_mul_rows(const float *gu, float *out, int64_t m0, int64_t m1, int64_t I, int act) {
    for (int64_t m = m0; m < m1; ++m) {
        const float *g = gu + m * 2 * I, *u = g + I;
        float *y = out + m * I;
        int64_t j = 0;
        for (; j + VW <= I; j += VW) {
            vf gv = vf_load(g + j);
            vf a = act == SPECGRAM_ACT_GELU_TANH ? vf_gelu_tanh(gv)
                                                 : vf_div(gv, vf_add(vf_set1(1.0f), vf_exp(vf_sub(vf_zero(), gv))));
            vf_store(y + j, vf_mul(a, vf_load(u + j)));
        }
        for (; j < I; ++j) {
            float x = g[j];
            float a = act == SPECGRAM_ACT_GELU_TANH ? 0.5f * x * (1.0f + tanhf(GELU_BETA * (x + GELU_KAPPA * x * x * x)))
                                                    : x / (1.0f + expf(-x));
            y[j] = a * u[j];
        }
    }
}

void specgram_add_rmsnorm(float *h, const float *delta, const float *dw, float deps, float scale, const float *w,
                          float eps, float *out, int64_t M, int64_t N, int nthreads) {
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(M * N >= SERIAL_WORK)")
    for (int64_t m = 0; m < M; ++m) specgram_add_rmsnorm_rows(h, delta, dw, deps, scale, w, eps, out, m, m + 1, N);
}

void specgram_act_mul(const float *gu, float *out, int64_t M, int64_t I, int act, int nthreads) {
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(M * I >= SERIAL_WORK)")
    for (int64_t m = 0; m < M; ++m) specgram_act_mul_rows(gu, out, m, m + 1, I, act);
}
