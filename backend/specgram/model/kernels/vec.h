/* The vector-width abstraction the kernels are written over: one implementation per instruction set, chosen
 * by the compiler flags of the build (kernels/__init__.py compiles the same sources once per ISA).
 *
 *   vec_avx512.h   VW = 16 lanes (__m512, masks __mmask16)        -mavx512f -mavx512bw -mfma
 *   vec_avx2.h     VW = 8 lanes  (__m256, masks a lane vector)     -mavx2 -mfma
 *
 * Each provides, for vf (VW floats) and vmask (a subset of its lanes):
 *   vf_zero, vf_set1, vf_load, vf_store, vf_add, vf_sub, vf_mul, vf_div, vf_max, vf_min, vf_fma (a * b + c,
 *   one rounding), vf_load_bf16 (VW bf16 widened exactly; vf_maskz_load_bf16 masked), vf_load_i8 (VW int8
 *   converted exactly), vmask_first(n) (lanes 0 .. n - 1; none for n <= 0, all for n >= VW), vf_maskz_load (0
 *   in the lanes outside the mask, which are never read), vf_mask_store, vf_mask_max (max in the mask's lanes, a
 *   elsewhere), vf_maskz (0 outside the mask), vf_reduce_add (a fixed tree: the same lanes are added in the
 *   same order every call), vf_reduce_max, vf_round (to nearest even), vf_scale2 (a * 2^n for integral n in
 *   [-126, 127], one rounding), VREGS (vector registers).
 * Nothing in them depends on the data's shape: an ISA's results are a function of the inputs, which is all the
 * kernels' batch invariance needs. The two ISAs differ where a sum runs lane-parallel (softmax, SiLU's tail),
 * so an AVX2 build's results need not be bitwise those of an AVX-512 build; each is invariant on its own.
 */
#pragma once
#include <immintrin.h>
#include <stdint.h>

#define VINLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include "vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "vec_avx2.h"
#else
#error "the kernels need -mavx512f -mavx512bw -mfma or -mavx2 -mfma"
#endif
