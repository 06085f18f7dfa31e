/* A grammar's token mask applied to rows of logits: bit t of a mask row (word t / 32, bit t % 32) says whether
 * vocabulary entry t may follow; every entry whose bit is clear becomes -inf, the others keep their value. The
 * same rule as xgrammar's apply_token_bitmask_inplace on CPU (the tests compare the two), without its cost: a
 * word of all ones is skipped, a word of zeros is 32 stores of -inf, only a mixed word reads its bits one by
 * one. Columns past the mask's width * 32 are left as they are; so are the mask's bits past V.
 *
 * logits [.., V] with row stride ld; mask rows of W int32 words with row stride mask_ld; rows[i] / mask_rows[i]:
 * the i-th logits row to mask and the mask row it takes. Single-threaded: a row is ~0.6 MB of stores at a
 * 152k vocabulary, a few tens of µs, less than waking a team for. */
#include <math.h>

#include "specgram.h"

void specgram_apply_bitmask(float *logits, int64_t ld, int64_t V, const int32_t *mask, int64_t mask_ld, int64_t W,
                            const int64_t *rows, const int64_t *mask_rows, int64_t n) {
    const int64_t cols = V < 32 * W ? V : 32 * W;
    const int64_t full = cols / 32; /* words whose 32 entries are all columns */
    for (int64_t i = 0; i < n; i++) {
        float *l = logits + rows[i] * ld;
        const uint32_t *m = (const uint32_t *)(mask + mask_rows[i] * mask_ld);
        for (int64_t w = 0; w < full; w++) {
            const uint32_t bits = m[w];
            float *p = l + 32 * w;
            if (bits == 0xffffffffu)
                continue;
            if (bits == 0) {
                for (int b = 0; b < 32; b++)
                    p[b] = -INFINITY;
                continue;
            }
            for (int b = 0; b < 32; b++)
                if (!((bits >> b) & 1u))
                    p[b] = -INFINITY;
        }
        for (int64_t t = 32 * full; t < cols; t++) /* the last, partial word */
            if (!((m[t / 32] >> (t % 32)) & 1u))
                l[t] = -INFINITY;
    }
}
