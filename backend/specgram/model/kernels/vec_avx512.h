/* vec.h for AVX-512 (F + BW): 16 lanes, mask registers. */
#pragma once

#define VW 16
#define VREGS 32
#define SPECGRAM_ISA "avx512"

typedef __m512 vf;
typedef __mmask16 vmask;

VINLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
VINLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
VINLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
VINLINE void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
VINLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
VINLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
VINLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
VINLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
VINLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
VINLINE vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
VINLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }

/* 16 bf16 -> 16 fp32 (exact: the bf16 bits become the upper half of the fp32). */
VINLINE vf vf_load_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 int8 -> 16 fp32 (exact: sign-extended to int32, then converted; every int8 is a float). */
VINLINE vf vf_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

VINLINE vmask vmask_first(int64_t n) {
    return n >= VW ? (vmask)0xFFFF : n > 0 ? (vmask)((1u << n) - 1) : (vmask)0;
}
VINLINE vf vf_maskz_load(vmask k, const float *p) { return _mm512_maskz_loadu_ps(k, p); }
/* The bf16 of the mask's lanes widened (0 elsewhere; the others are never read). */
VINLINE vf vf_maskz_load_bf16(vmask k, const uint16_t *p) {
    __m256i h = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16((__mmask32)k, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
VINLINE void vf_mask_store(float *p, vmask k, vf a) { _mm512_mask_storeu_ps(p, k, a); }
VINLINE vf vf_mask_max(vf a, vmask k, vf b) { return _mm512_mask_max_ps(a, k, a, b); }
VINLINE vf vf_maskz(vmask k, vf a) { return _mm512_maskz_mov_ps(k, a); }

VINLINE float vf_reduce_add(vf a) { return _mm512_reduce_add_ps(a); }
VINLINE float vf_reduce_max(vf a) { return _mm512_reduce_max_ps(a); }

VINLINE vf vf_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
VINLINE vf vf_scale2(vf a, vf n) { return _mm512_scalef_ps(a, n); }
