/* LoRA updates of a product's output rows, each row under its own adapter (lora.py builds the table).
 *
 *   y[m, col + o] += (sum_j t[j] bt[j, o]) * scale,  t[j] = sum_i a[j, i] x[m, i]
 *
 * for every part of adapter adapters[m] on layer l's product p (0 q|k|v, 1 o, 2 gate|up, 3 down); a row whose
 * adapter is -1 is left as it is. a [rank, in] and bt [rank, out] (B transposed) are float32, row-major: PEFT's
 * B (A x) times the scale, added to the base product's output. B is stored transposed so that the second product
 * runs VW outputs at a time over the rank (no horizontal sum per output).
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

/* Rows [m0, m1), output blocks of VW (the last one partial) numbered b: this call updates those with b in share
 * `part` of `parts` equal shares of each part's blocks. Which call computes an output changes nothing in it. */
void specgram_lora_rows(const specgram_lora *lora, const int64_t *adapters, int64_t layers, int64_t l, int32_t p,
                        const float *x, int64_t ldx, float *y, int64_t ldy, int64_t m0, int64_t m1, int32_t part,
                        int32_t parts) {
    float t[SPECGRAM_LORA_MAX_RANK];
    for (int64_t m = m0; m < m1; ++m) {
        const int64_t a = adapters[m];
        if (a < 0 || a >= lora->adapters) continue;
        const int64_t i = (a * layers + l) * 4 + p;
        for (int64_t k = lora->first[i]; k < lora->first[i + 1]; ++k) {
            const specgram_lora_part *P = lora->parts + k;
            const int64_t blocks = (P->out + VW - 1) / VW;
            const int64_t b0 = blocks * part / parts, b1 = blocks * (part + 1) / parts;
            if (b0 == b1) continue;
            for (int64_t j = 0; j < P->rank; ++j) t[j] = dot(P->a + j * P->in, x + m * ldx, P->in);
            float *ym = y + m * ldy + P->col;
            const vf scale = vf_set1(P->scale);
            const int64_t o1 = b1 * VW < P->out ? b1 * VW : P->out;
            int64_t o = b0 * VW;
            for (; o + VW <= o1; o += VW) {
                vf acc = vf_zero();
                for (int64_t j = 0; j < P->rank; ++j) acc = vf_fma(vf_set1(t[j]), vf_load(P->b + j * P->out + o), acc);
                vf_store(ym + o, vf_add(vf_load(ym + o), vf_mul(acc, scale)));
            }
            for (; o < o1; ++o) {
                float acc = 0.0f;
                for (int64_t j = 0; j < P->rank; ++j) acc += t[j] * P->b[j * P->out + o];
                ym[o] += acc * P->scale;
            }
        }
    }
}
