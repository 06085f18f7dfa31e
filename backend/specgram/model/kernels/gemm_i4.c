/* Small-M products of 4-bit group-quantized weights and activations quantized per row on the fly: exact
 * integer sums within each group of 32 inputs, then a fixed sequence of fp32 operations per group; results that do
 * not depend on M, the tiling or the thread.
 *
 * Weights (int4.py): W [N, K], K padded with zeros to G = ceil(K / 32) groups of 32 inputs; groups come in
 * super-blocks of 8 (the last one may hold fewer). Per output n and group g: 4-bit codes q in [0, 15], and
 *   s[n, g] = d[n, b] * sc[n, g],  m[n, g] = dmin[n, b] * mn[n, g]      (fp32 products; b = g / 8 its super-block)
 * with d, dmin fp32 per output and super-block and sc, mn u8 per output and group, so that
 *   W[n, k] = s[n, g] * q[n, k] - m[n, g]                                 (k in group g)
 * This is GGUF's Q4_K block, whose 6-bit sub-scales and fp16 super-scales it holds exactly (Q4_0 and Q4_1 too, as
 * super-blocks of one group), and what int4.py's own quantizer writes with 8-bit sub-scales: 4.75 bits per weight.
 *
 * Activations, per row m, on the calling thread(s) before the product (M * K is small next to M * K * N), with
 * L = 127 (D = 1 digit) or 32639 (D = 2): amax = max_k |x[m, k]|, xs[m] = amax / L, xq[m, k] = round_half_even(
 * x[m, k] * (L / amax)) clamped to [-L, L], all in fp32 (a zero row: xs = 0, xq = 0; x must be finite); past K,
 * xq = 0. Stored as signed digits, vpdpbusd's second operand: D = 1: xq itself; D = 2: xq = 256 h + l with
 * h = (xq + 128) >> 8 and l in [-128, 127] (|h| <= 127 because L = 32639). And the group sums
 * A[m, g] = sum_{k in g} xq[m, k] (an integer, exact in fp32: |A| <= 32 L < 2^24).
 *
 * The product, per row m, output n, group g (q is the unsigned operand, the digits the signed one):
 *   I = sum_{k in g} q[n, k] xq[m, k]          (int32, exact: D = 2 as 256 sum q h + sum q l; |I| <= 15 * 32 L
 *                                               < 2^24, so (float)I is exact too)
 *   t = (float)I * s[n, g];  t = t - m[n, g] * A[m, g];  acc = acc + t      (acc = 0 before g = 0; g in order)
 *   y[m, n] = acc * xs[m]  (+ bias[n])
 * each step one fp32 operation with one rounding, in exactly that order. So a row's outputs are bitwise the same
 * alone or among any others, in either ISA build, and a pure torch reference (int64 sums per group, then these
 * fp32 operations elementwise) reproduces them bitwise (tests/unit/test_int4.py).
 *
 * Packed layout (int4.py's pack): blocks of NB = 32 outputs, each one contiguous byte stream of, per super-block,
 * a head d[32] fp32, dmin[32] fp32 (256 bytes), then per group of it sc[32] u8, mn[32] u8 and the codes: 8 k4
 * steps of 64 bytes, byte j * 4 + kk of step k4 (j < 16) holding q[32 b + j, 32 g + 4 k4 + kk] in its low nibble
 * and q[32 b + 16 + j, ...] in its high one (zero codes and scales for outputs past N). One 64-byte step yields, by
 * a mask and a shift, the 4 k of all 32 outputs as u8 lanes: AVX-512 two vectors (outputs 0-15, 16-31), AVX2 four
 * (0-7 and 16-23 from the first 32 bytes, 8-15 and 24-31 from the second).
 *
 * Why group scales and not int8.py's one scale per output: 15 levels a side cannot span an output's whole row
 * (its largest weight is many times its typical one), a group of 32 can. Why integer sums: as in gemm_i8a8.c, no
 * weight is converted to fp32 in the loop; a group costs D vpdpbusd per vector per k4 step, then its epilogue.
 * Tiles of MT rows keep MT * D * NV int32 accumulators in registers; the fp32 accumulators live in a small array
 * (touched once per group). Blocks are dealt to threads as contiguous ranges (deal.h), as gemm_i8a8.c does.
 * With VNNI (kernels.has_vnni) a group costs D vpdpbusd per vector per k4 step; without it, D times vpmaddubsw,
 * vpmaddwd and an add (vi_dpbusd_madd: exact for 4-bit codes), the same integers, so bitwise the same outputs. The
 * loops are gemm_i4_tiles.h, compiled once for each (the VNNI copy in vnni.h's region only).
 */
#include <assert.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deal.h"
#include "scratch.h"
#include "specgram.h"
#include "team.h"
#include "vnni.h"

#define NB 32
#define GK 32                           /* inputs per group */
#define SBG 8                           /* groups per super-block */
#define STEPS (GK / 4)                  /* k4 steps per group */
#define CODES (STEPS * 64)              /* code bytes of one group of a block */
#define GROUP_BYTES (2 * NB + CODES)    /* sc, mn, codes */
#define HEAD_BYTES (2 * NB * 4)         /* d, dmin */
#define NV (NB / VW)
#define MT_MAX(d) (VREGS == 32 ? 8 / (d) : (d) == 1 ? 2 : 1)
#ifndef PF_BYTES
#define PF_BYTES 2048                   /* near prefetch distance into L1 */
#endif
#ifndef PF_FAR_BYTES
#define PF_FAR_BYTES 6144               /* a single-tile call also pulls its block into L2 this far ahead */
#endif

int64_t specgram_i4_groups(int64_t K) { return (K + GK - 1) / GK; }

int64_t specgram_i4_block_bytes(int64_t K) {
    const int64_t G = specgram_i4_groups(K);
    return (G + SBG - 1) / SBG * HEAD_BYTES + G * GROUP_BYTES;
}

#if VW == 16
VINLINE vi vi_shl8(vi a) { return _mm512_slli_epi32(a, 8); }
VINLINE int32_t vi_reduce_add(vi a) { return _mm512_reduce_add_epi32(a); }
/* h = (v + 128) >> 8 (arithmetic) and l = v - 256 h, each VW int32 in [-128, 127], stored as VW int8. */
VINLINE void vi_store_digits(int8_t *ph, int8_t *pl, vi v) {
    vi h = _mm512_srai_epi32(_mm512_add_epi32(v, vi_set1(128)), 8);
    _mm_storeu_si128((__m128i *)ph, _mm512_cvtepi32_epi8(h));
    _mm_storeu_si128((__m128i *)pl, _mm512_cvtepi32_epi8(_mm512_sub_epi32(v, vi_shl8(h))));
}
VINLINE void vi_store_s8(int8_t *p, vi v) { _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(v)); }
/* VW u8 -> VW fp32 (exact) */
VINLINE vf vf_load_u8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#else
VINLINE vi vi_shl8(vi a) { return _mm256_slli_epi32(a, 8); }
VINLINE int32_t vi_reduce_add(vi a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
/* 8 int32 in [-128, 127] -> 8 int8 (signed saturation, which they never reach) */
VINLINE void vi_store_s8(int8_t *p, vi v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}
VINLINE void vi_store_digits(int8_t *ph, int8_t *pl, vi v) {
    vi h = _mm256_srai_epi32(_mm256_add_epi32(v, vi_set1(128)), 8);
    vi_store_s8(ph, h);
    vi_store_s8(pl, _mm256_sub_epi32(v, vi_shl8(h)));
}
VINLINE vf vf_load_u8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#endif

/* Row x [K] -> its D digit rows at s, s + ldq (ldq a multiple of 64 >= 32 G; zero past K), its scale *xs and its
 * group sums gs [G] (see the header). */
static void quantize_row(const float *x, int64_t K, int64_t ldq, int digits, int8_t *s, float *xs, float *gs) {
    const int64_t G = specgram_i4_groups(K);
    vf mx = vf_zero();
    for (int64_t k = 0; k < K; k += VW) {
        vf v = vf_maskz_load(vmask_first(K - k), x + k);
        mx = vf_max(mx, vf_max(v, vf_sub(vf_zero(), v)));
    }
    const float amax = vf_reduce_max(mx), levels = digits == 1 ? 127.0f : 32639.0f;
    if (!(amax > 0.0f)) {
        memset(s, 0, (size_t)(digits * ldq));
        memset(gs, 0, sizeof(float) * (size_t)G);
        *xs = 0.0f;
        return;
    }
    *xs = amax / levels;
    const vf inv = vf_set1(levels / amax), hi = vf_set1(levels), lo = vf_set1(-levels);
    int32_t sum = 0;
    for (int64_t k = 0; k < ldq; k += VW) {          /* past K the masked loads give 0: xq = 0 */
        vf q = vf_round(vf_mul(vf_maskz_load(vmask_first(K - k), x + k), inv));
        vi v = vi_from_f(vf_min(vf_max(q, lo), hi));
        if (digits == 1) vi_store_s8(s + k, v);
        else vi_store_digits(s + k, s + ldq + k, v);
        sum += vi_reduce_add(v);                     /* integers: exact in any order */
        if ((k + VW) % GK == 0) {
            if (k / GK < G) gs[k / GK] = (float)sum;
            sum = 0;
        }
    }
}

void specgram_i4_quantize_rows(const float *x, int64_t m0, int64_t m1, int64_t K, int64_t ldx, int digits, int8_t *s,
                               float *xs, float *gs) {
    const int64_t ldq = specgram_i8a8_ldq(K), G = specgram_i4_groups(K);
    for (int64_t m = m0; m < m1; ++m)
        quantize_row(x + m * ldx, K, ldq, digits, s + m * digits * ldq, xs + m, gs + m * G);
}

#if VW == 16
/* One 64-byte step of codes -> the 4 k of outputs 0-15 and 16-31. */
VINLINE void unpack(const uint8_t *p, vi w[NV]) {
    const vi low = _mm512_set1_epi8(0x0F);
    vi v = _mm512_loadu_si512(p);
    w[0] = _mm512_and_si512(v, low);
    w[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
}
#else
VINLINE void unpack(const uint8_t *p, vi w[NV]) {
    const vi low = _mm256_set1_epi8(0x0F);
    vi a = _mm256_loadu_si256((const __m256i *)p), b = _mm256_loadu_si256((const __m256i *)(p + 32));
    w[0] = _mm256_and_si256(a, low);
    w[1] = _mm256_and_si256(b, low);
    w[2] = _mm256_and_si256(_mm256_srli_epi16(a, 4), low);
    w[3] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
}
#endif

/* vi_dpbusd without VNNI, for 4-bit codes: the same sums of 4 u8 x s8 products per int32 lane, from vpmaddubsw (pairs
 * to int16: exact, as a code is at most 15, |2 * 15 * 128| < 2^15, so it never saturates) then vpmaddwd by ones
 * (pairs of those to int32). Three instructions where VNNI takes one. */
#if VW == 16
VINLINE vi vi_dpbusd_madd(vi acc, vi u, vi s) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}
#else
VINLINE vi vi_dpbusd_madd(vi acc, vi u, vi s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif

#define I4_DP vi_dpbusd_madd
#define I4_NAME(f) f##_madd
#include "gemm_i4_tiles.h"
#undef I4_DP
#undef I4_NAME

#if VNNI_BUILT
VNNI_BEGIN
#define I4_DP vi_dpbusd
#define I4_NAME(f) f##_vnni
#include "gemm_i4_tiles.h"
#undef I4_DP
#undef I4_NAME
VNNI_END
#endif

void specgram_team_i4(const int8_t *s, const float *xs, const float *gs, int64_t M, int64_t K, const uint8_t *w,
                      int digits, int vnni, int64_t N, const float *bias, float *y, int64_t ldy, deal_range *ranges,
                      int nthreads) {
#if VNNI_BUILT
    if (vnni) {
        team_vnni(s, xs, gs, M, K, w, digits, N, bias, y, ldy, ranges, nthreads);
        return;
    }
#endif
    assert(!vnni);                                   /* a build without VNNI products: the caller asks for none */
    team_madd(s, xs, gs, M, K, w, digits, N, bias, y, ldy, ranges, nthreads);
}

/* Entry point: x [M, K] (row stride ldx), w packed as the header says, digits 1 or 2, vnni 1 where the CPU has VNNI
 * (kernels.has_vnni), else 0; bias [N] or NULL, y [M, ldy]. Scratch (SCRATCH_PLAN): the digit rows
 * [M * digits, ldq] bytes, xs [M], the group sums [M, G], the ranges. */
void specgram_gemm_i4(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int digits, int vnni,
                      int64_t N, const float *bias, float *y, int64_t ldy, int nthreads) {
    assert(M >= 0 && K >= 0 && N >= 0 && nthreads >= 1 && (digits == 1 || digits == 2));
    assert(ldx >= K && ldy >= N && N <= (int64_t)UINT32_MAX * NB);
    if (M == 0 || N == 0) return;
    const int64_t ldq = specgram_i8a8_ldq(K), G = specgram_i4_groups(K), nblocks = (N + NB - 1) / NB;
    size_t digit_bytes = (size_t)(M * digits * ldq), floats = (size_t)(M + M * G);
    size_t bytes = digit_bytes + sizeof(float) * floats + 64 + sizeof(deal_range) * (size_t)(nthreads + 1);
    int8_t *s = specgram_scratch(SCRATCH_PLAN, bytes);
    float *xs = (float *)(s + digit_bytes), *gs = xs + M;
    deal_range *ranges = (deal_range *)(((uintptr_t)(gs + M * G) + 63) & ~(uintptr_t)63);
    specgram_i4_quantize_rows(x, 0, M, K, ldx, digits, s, xs, gs);
    deal_init(ranges, nblocks, nthreads);
#pragma omp parallel num_threads(nthreads)
    specgram_team_i4(s, xs, gs, M, K, w, digits, vnni, N, bias, y, ldy, ranges, nthreads);
}
