/* What the VNNI products share (gemm_i8a8.c: int8 weights; gemm_i4.c: 4-bit codes): VW int32 lanes (vi) and their
 * common operations, whether this compiler targets VNNI for the build's ISA (VNNI_BUILT), the region that compiles
 * for it (VNNI_BEGIN ... VNNI_END: only the functions inside use VNNI, so the library still loads on CPUs without
 * it; kernels.has_vnni says whether they may be called), and vpdpbusd itself. */
#pragma once
#include "vec.h"

#if VW == 16
typedef __m512i vi;
VINLINE vi vi_zero(void) { return _mm512_setzero_si512(); }
VINLINE vi vi_set1(int32_t a) { return _mm512_set1_epi32(a); }
VINLINE vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
VINLINE vi vi_from_f(vf a) { return _mm512_cvtps_epi32(a); }      /* integral values: exact */
VINLINE vf vi_to_f(vi a) { return _mm512_cvtepi32_ps(a); }        /* round to nearest even */
#define VNNI_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx512vnni\")")
#else
typedef __m256i vi;
VINLINE vi vi_zero(void) { return _mm256_setzero_si256(); }
VINLINE vi vi_set1(int32_t a) { return _mm256_set1_epi32(a); }
VINLINE vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
VINLINE vi vi_from_f(vf a) { return _mm256_cvtps_epi32(a); }
VINLINE vf vi_to_f(vi a) { return _mm256_cvtepi32_ps(a); }
#define VNNI_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avxvnni\")")
#endif
#define VNNI_END _Pragma("GCC pop_options")

/* A compiler that cannot target AVX-VNNI (gcc before 11) builds the AVX2 library without the VNNI products. */
#if VW != 16 && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 11
#define VNNI_BUILT 0
#else
#define VNNI_BUILT 1
#endif

#if VNNI_BUILT
VNNI_BEGIN
#if VW == 16
/* acc + sum of the 4 products u8 (each 32-bit lane of u) x s8 (the same lane of s), per 32-bit lane; no saturation.
 * The instruction itself, in inline assembly: GCC 12 compiles the intrinsic in a tile's loop with two vector moves
 * around every vpdpbusd (the accumulator copied out and back), which held the product to ~half the VNNI peak
 * (int8 x int16, 37 rows, weights in cache: 261 -> 371 GMAC/s; the same instruction, the same results). */
VINLINE vi vi_dpbusd(vi acc, vi u, vi s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}
#else
/* (the AVX2 build's loops compile without those moves, and fold the weight loads into the instruction) */
VINLINE vi vi_dpbusd(vi acc, vi u, vi s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif
VNNI_END
#endif
