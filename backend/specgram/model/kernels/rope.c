/* Rotary embedding and the KV-cache write of one decoder layer for N new tokens (before attention.c reads
 * the cache):
 *
 *   qkv   [N, (H + 2*Hkv) * D] fp32   the fused projection output; q | k | v per token, heads contiguous
 *   cos, sin [N, R] fp32              rotary tables at each token's position (transformers' rotary_emb), R =
 *                                     `rotary` dimensions of each head (D, or fewer: partial rotary, the rest
 *                                     passes through; 0: no rotary); the rows function takes [P, R] tables by
 *                                     position too (by_position)
 *   q_norm, k_norm [D] or NULL        an RMSNorm over each q and k head before rotary (qwen3), eps qk_eps
 *   kc [S, Hkv, D, P]                 this layer's K cache, positions last, float32 or (kv_bf16) bfloat16
 *   vc [S, Hkv, P, D]                 this layer's V cache, the same type
 *   slots, positions [N] int64        token n goes to slot slots[n] in [0, S) at position positions[n] in [0, P)
 *   q_out [N, H * D] fp32             the rotated queries
 *
 * Rotary follows transformers' apply_rotary_pos_emb, x*cos + rotate_half(x)*sin, rounded the same way
 * (compiled without contraction: multiply, multiply, add), per token: batch-invariant, and the same on every
 * ISA (and of the thread count: fewer than SERIAL_WORK values run on the calling thread alone, where starting
 * the OpenMP team would cost more than the work). A bfloat16 cache gets each value rounded to nearest even, as
 * torch's conversion rounds. A debug build (-DSPECGRAM_DEBUG, without NDEBUG) asserts the
 * slot and position ranges.
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "specgram.h"
#include "team.h"
#include "tree.h"


/* One head of D values: normed (norm NULL: as it is), then its first R values rotated (R even: the second half
 * of those rotated into the first with a minus sign), the rest passed through. */
static inline void head_in(const float *x, const float *norm, float eps, const float *c, const float *s, int64_t R,
                           float *y, int64_t D) {
    float normed[D];
    if (norm != NULL) specgram_rmsnorm_row(x, norm, eps, normed, D), x = normed;
    int64_t h = R / 2;
    for (int64_t j = 0; j < h; ++j) y[j] = x[j] * c[j] + (-x[j + h]) * s[j];
    for (int64_t j = h; j < R; ++j) y[j] = x[j] * c[j] + x[j - h] * s[j];
    for (int64_t j = R; j < D; ++j) y[j] = x[j];
}

/* float -> bfloat16, rounded to nearest even as torch's conversion does (NaN stays a quiet NaN). */
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

/* D values x -> the cache at element offset `at`, `stride` elements apart, as float32 or (bf16) bfloat16. */
static inline void store_kv(void *cache, int bf16, int64_t at, int64_t stride, const float *x, int64_t D) {
    if (bf16) {
        uint16_t *c = (uint16_t *)cache + at;
        for (int64_t j = 0; j < D; ++j) c[j * stride] = bf16_of(x[j]);
    } else {
        float *c = (float *)cache + at;
        for (int64_t j = 0; j < D; ++j) c[j * stride] = x[j];
    }
}

/* Tokens n0 .. n1 - 1 (forward.c's team shares tokens out; the entry point below loops over all of them). */
void specgram_rope_rows(const float *qkv, const float *cos, const float *sin, int by_position, void *kc, void *vc,
                        int kv_bf16, const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t n0,
                        int64_t n1, int64_t S, int64_t H, int64_t Hkv, int64_t D, int64_t P, int64_t rotary,
                        const float *q_norm, const float *k_norm, float qk_eps, float *q_out) {
    (void)S;                                                       /* read by the debug build's asserts only */
    const int64_t width = (H + 2 * Hkv) * D;
    float k[D];
    for (int64_t n = n0; n < n1; ++n) {
        assert(slots[n] >= 0 && slots[n] < S);
        assert(positions[n] >= 0 && positions[n] < P);
        /* a tree token rotates by its logical position (tree.h); the per-token tables are built at it already */
        const int64_t at = (by_position ? (tree ? tree_logical(tree[n], positions[n]) : positions[n]) : n) * rotary;
        const float *row = qkv + n * width, *c = cos + at, *s = sin + at;
        for (int64_t h = 0; h < H; ++h) head_in(row + h * D, q_norm, qk_eps, c, s, rotary, q_out + (n * H + h) * D, D);
        for (int64_t h = 0; h < Hkv; ++h) {
            int64_t head = slots[n] * Hkv + h;
            head_in(row + (H + h) * D, k_norm, qk_eps, c, s, rotary, k, D);
            store_kv(kc, kv_bf16, head * D * P + positions[n], P, k, D);              /* positions last */
            store_kv(vc, kv_bf16, (head * P + positions[n]) * D, 1, row + (H + Hkv + h) * D, D);
        }
    }
}

void specgram_rope_cache_write(const float *qkv, const float *cos, const float *sin, void *kc, void *vc, int kv_bf16,
                               const int64_t *slots, const int64_t *positions, int64_t N, int64_t S, int64_t H,
                               int64_t Hkv, int64_t D, int64_t P, int64_t rotary, const float *q_norm,
                               const float *k_norm, float qk_eps, float *q_out, int nthreads) {
    assert(rotary % 2 == 0 && rotary <= D && H >= 1 && Hkv >= 1 && nthreads >= 1);
#pragma omp parallel for schedule(static) num_threads(nthreads) if(N * (H + 2 * Hkv) * D >= SERIAL_WORK)
    for (int64_t n = 0; n < N; ++n)
        specgram_rope_rows(qkv, cos, sin, 0, kc, vc, kv_bf16, slots, positions, NULL, n, n + 1, S, H, Hkv, D, P, rotary,
                           q_norm, k_norm, qk_eps, q_out);
}
