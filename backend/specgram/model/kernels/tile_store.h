/* The end of a product tile (gemm_i4_tiles.h, gemm_i8b.c): fp32 sums of MT rows x 32 outputs -> y. */
#pragma once
#include "vec.h"

/* y[m0 + r, n0 .. n0 + 31] = acc[r] (* scale[n] where scale is given) (+ bias[n] where bias is), for r < MT, the
 * outputs that exist (n < N); each step one fp32 operation, in that order. */
VINLINE void store_tile(const int MT, const float (*acc)[32], float *y, int64_t ldy, int64_t m0, int64_t n0,
                        int64_t N, const float *scale, const float *bias) {
    for (int r = 0; r < MT; ++r) {
        float *yrow = y + (m0 + r) * ldy;
        for (int v = 0; v < 32 / VW; ++v) {
            int64_t n = n0 + v * VW;
            vmask k = vmask_first(N - n);
            vf out = vf_load(acc[r] + v * VW);
            if (scale) out = vf_mul(out, vf_maskz_load(k, scale + n));
            if (bias) out = vf_add(out, vf_maskz_load(k, bias + n));
            vf_mask_store(yrow + n, k, out);
        }
    }
}
