/* exp for VW floats (vec.h): exp(x) = 2^n * 2^f with n = round(x log2 e), f in [-1/2, 1/2], 2^f by a
 * degree-7 polynomial (relative error ~2e-7, about 1-2 ulp); x is clamped to [-87, 88] first (exp(-87) ~ 1.6e-38,
 * the smallest normal float's order). The same operations in the same order on either ISA. */
#pragma once
#include "vec.h"

VINLINE vf vf_exp(vf x) {
    const vf log2e = vf_set1(1.44269504088896341f);
    x = vf_max(x, vf_set1(-87.0f));
    x = vf_min(x, vf_set1(88.0f));
    vf t = vf_mul(x, log2e);
    vf n = vf_round(t);
    vf f = vf_sub(t, n);                                         /* in [-0.5, 0.5] */
    /* 2^f = e^(f ln2): Taylor coefficients of e^y in y = f ln 2, Horner form */
    vf y = vf_mul(f, vf_set1(0.69314718055994531f));
    vf p = vf_set1(1.0f / 5040.0f);
    p = vf_fma(p, y, vf_set1(1.0f / 720.0f));
    p = vf_fma(p, y, vf_set1(1.0f / 120.0f));
    p = vf_fma(p, y, vf_set1(1.0f / 24.0f));
    p = vf_fma(p, y, vf_set1(1.0f / 6.0f));
    p = vf_fma(p, y, vf_set1(0.5f));
    p = vf_fma(p, y, vf_set1(1.0f));
    p = vf_fma(p, y, vf_set1(1.0f));
    return vf_scale2(p, n);
}
