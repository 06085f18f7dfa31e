/* LoRA updates of a product's output rows, each row under its own adapter (lora.py builds the table).
 *
 *   y[m, col + o] += (sum_j b[o, j] t[j]) * scale,  t[j] = sum_i a[j, i] x[m, i]
 *
 * for every part of adapter adapters[m] on layer l's product p (0 q|k|v, 1 o, 2 gate|up, 3 down); a row whose
 * adapter is -1 is left as it is. a [rank, in] and b [out, rank] are float32, row-major: the order PEFT applies
 * them in (B (A x) times the scale, then added to the base product's output).
 * Exactness: a row's update reads that row and its adapter's weights only, in a fixed order (the same vector
 * sums whatever the batch), so a token's output is bitwise the same alone or batched with other adapters' rows.
 * Cost: rank x (in + out) multiply-adds per row and part, against the product's in x out: small at low rank, and
 * the base weights are read once per step whatever the adapters of its rows.
 */
#include <stdint.h>

#include "specgram.h"
#include "vec.h"

/* sum_i a[i] b[i] over n floats, in a fixed order: VW-wide partial sums, then the lanes, then the tail. */
static inline float dot(const float *a, const float *b, int64_t n) {
    vf acc = vf_zero();
    int64_t i = 0;
    for (; i + VW <= n; i += VW) acc = vf_fma(vf_load(a + i), vf_load(b + i), acc);
    float s = vf_reduce_add(acc);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

void specgram_lora_rows(const specgram_lora *lora, const int64_t *adapters, int64_t layers, int64_t l, int32_t p,
                        const float *x, int64_t ldx, float *y, int64_t ldy, int64_t m0, int64_t m1) {
    float t[SPECGRAM_LORA_MAX_RANK];
    for (int64_t m = m0; m < m1; ++m) {
        const int64_t a = adapters[m];
        if (a < 0 || a >= lora->adapters) continue;
        const int64_t i = (a * layers + l) * 4 + p;
        for (int64_t k = lora->first[i]; k < lora->first[i + 1]; ++k) {
            const specgram_lora_part *P = lora->parts + k;
            for (int64_t j = 0; j < P->rank; ++j) t[j] = dot(P->a + j * P->in, x + m * ldx, P->in);
            float *ym = y + m * ldy + P->col;
            for (int64_t o = 0; o < P->out; ++o) ym[o] += dot(P->b + o * P->rank, t, P->rank) * P->scale;
        }
    }
}
