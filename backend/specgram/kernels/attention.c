/* Rotary embedding, KV-cache write and causal attention of one decoder layer, for B rows of up to T new
 * tokens each, reading the cache in place (no gather of whole rows).
 *
 *   qkv   [B*T, (H + 2*Hkv) * D] fp32   the fused projection output; q | k | v per token, heads contiguous
 *   cos, sin [B*T, D] fp32              rotary tables at each token's position (transformers' rotary_emb)
 *   kc, vc  [S, Hkv, P, D] fp32         this layer's cache (S slots, P positions)
 *   slots, starts, num_new [B] int64    row b appends num_new[b] tokens to slot slots[b] from position starts[b]
 *   out   [B*T, H * D] fp32             attention output (zeros for padding entries t >= num_new[b])
 *
 * Token t of row b sits at position p = starts[b] + t and attends to positions j <= p of its slot
 * (j > p - window too, when window > 0). Every row only reads its own slot below its own length, and each
 * query's result depends on nothing else in the batch: batch- and draft-width-invariant by construction.
 * Rotary follows transformers' apply_rotary_pos_emb: x*cos + rotate_half(x)*sin, rounded the same way
 * (compiled without contraction: a multiply, a multiply, an add).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vexp.h"

static void rope(const float *x, const float *c, const float *s, float *y, int64_t D) {
    int64_t h = D / 2;
    for (int64_t j = 0; j < h; ++j) y[j] = x[j] * c[j] + (-x[j + h]) * s[j];
    for (int64_t j = h; j < D; ++j) y[j] = x[j] * c[j] + x[j - h] * s[j];
}

static inline float dot(const float *a, const float *b, int64_t D) {
    __m512 acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= D; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
    float s = _mm512_reduce_add_ps(acc);
    for (; j < D; ++j) s += a[j] * b[j];
    return s;
}

void specgram_rope_cache_write(const float *qkv, const float *cos, const float *sin, float *kc, float *vc,
                               const int64_t *slots, const int64_t *starts, const int64_t *num_new, int64_t B,
                               int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t P, float *q_out, int nthreads) {
    int64_t width = (H + 2 * Hkv) * D;
    _Pragma("omp parallel for schedule(static) num_threads(nthreads)")
    for (int64_t bt = 0; bt < B * T; ++bt) {
        int64_t b = bt / T, t = bt % T;
        if (t >= num_new[b]) continue;
        const float *row = qkv + bt * width, *c = cos + bt * D, *s = sin + bt * D;
        int64_t pos = starts[b] + t;
        for (int64_t h = 0; h < H; ++h) rope(row + h * D, c, s, q_out + bt * H * D + h * D, D);
        for (int64_t h = 0; h < Hkv; ++h) {
            int64_t at = ((slots[b] * Hkv + h) * P + pos) * D;
            rope(row + (H + h) * D, c, s, kc + at, D);
            const float *v = row + (H + Hkv + h) * D;
            for (int64_t j = 0; j < D; ++j) vc[at + j] = v[j];
        }
    }
}

/* q: [B*T, H*D] (rotated), written by specgram_rope_cache_write. */
void specgram_attention(const float *q, const float *kc, const float *vc, const int64_t *slots,
                        const int64_t *starts, const int64_t *num_new, int64_t B, int64_t T, int64_t H,
                        int64_t Hkv, int64_t D, int64_t P, int64_t window, float scale, float *out, int nthreads) {
    int64_t group = H / Hkv;
    _Pragma("omp parallel for schedule(dynamic, 1) collapse(2) num_threads(nthreads)")
    for (int64_t bt = 0; bt < B * T; ++bt) {
        for (int64_t h = 0; h < H; ++h) {
            int64_t b = bt / T, t = bt % T;
            float *o = out + bt * H * D + h * D;
            if (t >= num_new[b]) {
                for (int64_t j = 0; j < D; ++j) o[j] = 0.0f;
                continue;
            }
            int64_t pos = starts[b] + t;
            int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
            int64_t n = pos + 1 - lo;
            const float *qh = q + bt * H * D + h * D;
            const float *K = kc + ((slots[b] * Hkv + h / group) * P + lo) * D;
            const float *V = vc + ((slots[b] * Hkv + h / group) * P + lo) * D;
            float *p = malloc(sizeof(float) * n);
            float m = -INFINITY;
            for (int64_t j = 0; j < n; ++j) {
                p[j] = dot(qh, K + j * D, D) * scale;
                m = p[j] > m ? p[j] : m;
            }
            __m512 vm = _mm512_set1_ps(m), vsum = _mm512_setzero_ps();
            int64_t j = 0;
            for (; j + 16 <= n; j += 16) {
                __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(p + j), vm));
                _mm512_storeu_ps(p + j, e);
                vsum = _mm512_add_ps(vsum, e);
            }
            if (j < n) {
                __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
                __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + j), vm));
                _mm512_mask_storeu_ps(p + j, k, e);
                vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(k, e));
            }
            float inv = 1.0f / _mm512_reduce_add_ps(vsum);
            float acc[D];
            for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
            for (j = 0; j < n; ++j) {
                float w = p[j];
                const float *v = V + j * D;
                for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
            }
            for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;
            free(p);
        }
    }
}
