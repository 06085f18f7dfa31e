/* exp for 16 floats (AVX-512F): exp(x) = 2^n * 2^f with n = round(x log2 e), f in [-1/2, 1/2], 2^f by a
 * degree-7 polynomial (relative error ~2e-7, about 1-2 ulp); below -87 the result flushes to 0. */
#pragma once
#include <immintrin.h>

static inline __m512 exp512(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    __m512 t = _mm512_mul_ps(x, log2e);
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);                              /* in [-0.5, 0.5] */
    /* 2^f = e^(f ln2): Taylor coefficients of e^y in y = f ln 2, Horner form */
    __m512 y = _mm512_mul_ps(f, _mm512_set1_ps(0.69314718055994531f));
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
