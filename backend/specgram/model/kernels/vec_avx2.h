/* vec.h for AVX2 + FMA: 8 lanes; a mask is a vector of lanes, all ones where a lane is in. */
#pragma once

#define VW 8
#define VREGS 16
#define SPECGRAM_ISA "avx2"

typedef __m256 vf;
typedef __m256i vmask;

VINLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
VINLINE vf vf_set1(float x) { return _mm256_set1_ps(x); }
VINLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
VINLINE void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
VINLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
VINLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
VINLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
VINLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
VINLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
VINLINE vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
VINLINE vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }

/* 8 bf16 -> 8 fp32 (exact: the bf16 bits become the upper half of the fp32). */
VINLINE vf vf_load_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 int8 -> 8 fp32 (exact: sign-extended to int32, then converted; every int8 is a float). */
VINLINE vf vf_load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

VINLINE vmask vmask_first(int64_t n) {
    int c = n >= VW ? VW : n > 0 ? (int)n : 0;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
VINLINE vf vf_maskz_load(vmask k, const float *p) { return _mm256_maskload_ps(p, k); }
/* The bf16 of the mask's lanes widened (0 elsewhere; the others are never read): AVX2 has no 16-bit masked load,
 * so a partial mask (a row's last vector) goes lane by lane. */
VINLINE vf vf_maskz_load_bf16(vmask k, const uint16_t *p) {
    int in = _mm256_movemask_ps(_mm256_castsi256_ps(k));
    if (in == 0xFF) return vf_load_bf16(p);
    uint16_t lanes[8] = {0};
    for (int i = 0; i < 8; ++i)
        if (in >> i & 1) lanes[i] = p[i];
    return vf_load_bf16(lanes);
}
VINLINE void vf_mask_store(float *p, vmask k, vf a) { _mm256_maskstore_ps(p, k, a); }
VINLINE vf vf_mask_max(vf a, vmask k, vf b) { return _mm256_blendv_ps(a, _mm256_max_ps(a, b), _mm256_castsi256_ps(k)); }
VINLINE vf vf_maskz(vmask k, vf a) { return _mm256_and_ps(_mm256_castsi256_ps(k), a); }

/* Halves, then quarters, then pairs: lanes (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1. */
VINLINE float vf_reduce_add(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
VINLINE float vf_reduce_max(vf a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

VINLINE vf vf_round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n built in the exponent field (n + 127 in [1, 254]: a normal float), then one multiply. */
VINLINE vf vf_scale2(vf a, vf n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(a, _mm256_castsi256_ps(e));
}
