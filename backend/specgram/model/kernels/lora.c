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

/* sum_i a[i] b[i] over n floats, in a fixed order: four VW-wide partial sums (independent chains: the FMA
 * latency hidden), added pairwise, then the lanes, then the tail. */
static inline float dot(const float *a, const float *b, int64_t n) {
    vf s0 = vf_zero(), s1 = vf_zero(), s2 = vf_zero(), s3 = vf_zero();
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        s0 = vf_fma(vf_load(a + i), vf_load(b + i), s0);
        s1 = vf_fma(vf_load(a + i + VW), vf_load(b + i + VW), s1);
        s2 = vf_fma(vf_load(a + i + 2 * VW), vf_load(b + i + 2 * VW), s2);
        s3 = vf_fma(vf_load(a + i + 3 * VW), vf_load(b + i + 3 * VW), s3);
    }
    for (; i + VW <= n; i += VW) s0 = vf_fma(vf_load(a + i), vf_load(b + i), s0);
    float s = vf_reduce_add(vf_add(vf_add(s0, s1), vf_add(s2, s3)));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

#define CHUNK 16 /* rows of one adapter updated together: each weight row read once for all of them */

/* The update of part P for rows rows[0..n) (all of P's adapter), output blocks [b0, b1) of VW (the last one
 * partial). Every row's sums are those it gets alone: t[j] = dot(a_j, x_m), then over j in order per output
 * (an output's sum is the same in a four-block step or a one-block step). */
static void part_rows(const specgram_lora_part *P, const int64_t *rows, int64_t n, const float *x, int64_t ldx,
                      float *y, int64_t ldy, int64_t b0, int64_t b1) {
    float t[CHUNK][SPECGRAM_LORA_MAX_RANK];
    for (int64_t j = 0; j < P->rank; ++j)
        for (int64_t r = 0; r < n; ++r) t[r][j] = dot(P->a + j * P->in, x + rows[r] * ldx, P->in);
    const vf scale = vf_set1(P->scale);
    const int64_t o1 = b1 * VW < P->out ? b1 * VW : P->out;
    int64_t o = b0 * VW;
    for (; o + 4 * VW <= o1; o += 4 * VW)  /* four output blocks a row at once: four independent chains */
        for (int64_t r = 0; r < n; ++r) {
            vf c0 = vf_zero(), c1 = vf_zero(), c2 = vf_zero(), c3 = vf_zero();
            const float *bj = P->b + o;
            for (int64_t j = 0; j < P->rank; ++j, bj += P->out) {
                const vf tj = vf_set1(t[r][j]);
                c0 = vf_fma(tj, vf_load(bj), c0);
                c1 = vf_fma(tj, vf_load(bj + VW), c1);
                c2 = vf_fma(tj, vf_load(bj + 2 * VW), c2);
                c3 = vf_fma(tj, vf_load(bj + 3 * VW), c3);
            }
            float *ym = y + rows[r] * ldy + P->col + o;
            vf_store(ym, vf_add(vf_load(ym), vf_mul(c0, scale)));
            vf_store(ym + VW, vf_add(vf_load(ym + VW), vf_mul(c1, scale)));
            vf_store(ym + 2 * VW, vf_add(vf_load(ym + 2 * VW), vf_mul(c2, scale)));
            vf_store(ym + 3 * VW, vf_add(vf_load(ym + 3 * VW), vf_mul(c3, scale)));
        }
    for (; o + VW <= o1; o += VW)
        for (int64_t r = 0; r < n; ++r) {
            vf acc = vf_zero();
            for (int64_t j = 0; j < P->rank; ++j) acc = vf_fma(vf_set1(t[r][j]), vf_load(P->b + j * P->out + o), acc);
            float *ym = y + rows[r] * ldy + P->col + o;
            vf_store(ym, vf_add(vf_load(ym), vf_mul(acc, scale)));
        }
    for (; o < o1; ++o)
        for (int64_t r = 0; r < n; ++r) {
            float acc = 0.0f;
            for (int64_t j = 0; j < P->rank; ++j) acc += t[r][j] * P->b[j * P->out + o];
            y[rows[r] * ldy + P->col + o] += acc * P->scale;
        }
}

/* Rows [m0, m1), share `part` of `parts`: where the rows hold at least `parts` adapters, every `parts`-th of them
 * (in order; all their outputs), so that each adapter's weights are read once; else every adapter's rows and
 * that share of each part's output blocks of VW. Rows of one adapter go together, CHUNK at a time (its weights
 * read once per chunk, not once per row). Which call or chunk computes an output changes nothing in it. */
void specgram_lora_rows(const specgram_lora *lora, const int64_t *adapters, int64_t layers, int64_t l, int32_t p,
                        const float *x, int64_t ldx, float *y, int64_t ldy, int64_t m0, int64_t m1, int32_t part,
                        int32_t parts) {
    int64_t rows[CHUNK], present = 0;
    for (int64_t a = 0; a < lora->adapters; ++a)
        for (int64_t m = m0; m < m1; ++m)
            if (adapters[m] == a) {
                ++present;
                break;
            }
    const int by_adapter = parts > 1 && present >= parts;
    for (int64_t a = 0, seen = 0; a < lora->adapters; ++a) {
        const int64_t i = (a * layers + l) * 4 + p;
        int64_t m = m0;
        while (m < m1 && adapters[m] != a) ++m;
        if (m == m1) continue;
        if (by_adapter && seen++ % parts != part) continue;
        while (m < m1) {
            int64_t n = 0;
            for (; m < m1 && n < CHUNK; ++m)
                if (adapters[m] == a) rows[n++] = m;
            if (n == 0) break;
            for (int64_t k = lora->first[i]; k < lora->first[i + 1]; ++k) {
                const specgram_lora_part *P = lora->parts + k;
                const int64_t blocks = (P->out + VW - 1) / VW;
                const int64_t b0 = by_adapter ? 0 : blocks * part / parts;
                const int64_t b1 = by_adapter ? blocks : blocks * (part + 1) / parts;
                if (b0 < b1) part_rows(P, rows, n, x, ldx, y, ldy, b0, b1);
            }
        }
    }
}
