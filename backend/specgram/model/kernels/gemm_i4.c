/* Small-M products of 4-bit group-quantized weights and activations quantized to int8 in the call, per row and per
 * block of 256 inputs (llama.cpp's Q8_K): exact integer sums over each super-block of 256 inputs, then a fixed
 * sequence of fp32 operations per super-block; results that do not depend on M, the tiling or the thread.
 *
 * Weights (int4.py): W [N, K], K padded with zeros to G = ceil(K / 32) groups of 32 inputs; groups come in
 * super-blocks of 8 (SB = ceil(G / 8); the last one may hold fewer). Per output n and group g: 4-bit codes q in
 * [0, 15], u8 sub-scales sc[n, g] and mins mn[n, g], and per super-block b fp32 d[n, b] and dmin[n, b], so that
 *   W[n, k] = d[n, b] * sc[n, g] * q[n, k] - dmin[n, b] * mn[n, g]          (k in group g, g in super-block b)
 * This is GGUF's Q4_K block, whose 6-bit sub-scales and fp16 super-scales it holds exactly, and what int4.py's own
 * quantizer writes with 8-bit sub-scales: 4.75 bits per weight.
 *
 * Activations, per row m and super-block b (inputs [256 b, 256 b + 256) of K), on the calling thread(s) before
 * the product (M * K is small next to M * K * N): amax = max |x[m, k]| over the block, xs[m, b] = amax / 127,
 * xq[m, k] = round_half_even(x[m, k] * (127 / amax)) clamped to [-127, 127], all in fp32 (a zero block: xs = 0,
 * xq = 0; x must be finite); past K, xq = 0. Stored 4 at a time, the M rows of each k4 step side by side: the int32
 * word j M + m holds row m's xq for inputs 4 j .. 4 j + 3, so that a tile's rows are one address plus 4 r, each
 * broadcast by vpdpbusd's own memory operand ({1to16}). And per row AW = specgram_i4_aux_words(K) 32-bit words:
 * xs[SB] (fp32), then the group sums A[m, g] = sum_{k in g} xq[m, k] (|A| <= 32 * 127 < 2^15) as int16 pairs,
 * word 4 b + p holding A[8 b + 2 p] in its low half and A[8 b + 2 p + 1] in its high one (0 past G).
 *
 * Why blocks of 256 and not a scale per row: a language model's activations have a few channels 20-100x their
 * median, which one int8 scale per row (1536-8960 inputs) rounds the rest of the row away with; a block's scale
 * sees only its 256 inputs, and the product stays in integers over exactly the span where the weights' d and dmin
 * are constant. int16 activations per row (two int8 digits) were a little more accurate (docs/models.md) and cost
 * two products per weight: a 9-row verify of a 1.5B model took twice the time.
 *
 * The product, per row m, output n, super-block b (q is vpdpbusd's unsigned operand, xq the signed one):
 *   I_g = sum_{k in g} q[n, k] xq[m, k]          (int32 per group, exact: |I_g| <= 15 * 127 * 32)
 *   S   = sum_{g in b} sc[n, g] I_g              (int32, exact: |S| <= 8 * 255 * 60960 < 2^31)
 *   Mn  = sum_{g in b} mn[n, g] A[m, g]          (int32, exact: vpdpwssd on the int16 pairs)
 *   t = (float)S * d[n, b];  t = t - (float)Mn * dmin[n, b];  t = t * xs[m, b];  acc = acc + t
 *                                                (acc = 0 before b = 0; b in order)
 *   y[m, n] = acc  (+ bias[n])
 * each fp32 step one operation with one rounding, in exactly that order (int32 -> fp32 to nearest even). So a row's
 * outputs are bitwise the same alone or among any others, in either ISA build, with or without VNNI, and a pure
 * torch reference (int64 sums, then these fp32 operations elementwise) reproduces them bitwise
 * (tests/unit/test_int4.py). A super-block's fp32 work is a few operations per 64 vpdpbusd of its codes: the
 * products stay at the integer units' rate as rows are added.
 *
 * Packed layout (int4.py's pack): blocks of NB = 32 outputs, each one contiguous byte stream of, per super-block,
 * a head of 768 bytes: d[32] fp32, dmin[32] fp32, sc[8][32] u8 (group-major), mn as [4][32][2] u8 (pair p, output
 * j: mn[j, 2 p], mn[j, 2 p + 1], which vpmovzxbw widens to the int16 pairs vpdpwssd takes); zero for groups past
 * G; then per group of it the codes: 8 k4 steps of 64 bytes, byte j * 4 + kk of step k4 (j < 16) holding
 * q[32 b + j, 32 g + 4 k4 + kk] in its low nibble and q[32 b + 16 + j, ...] in its high one (zero codes and scales
 * for outputs past N). One 64-byte step yields, by a mask and a shift, the 4 k of all 32 outputs as u8 lanes:
 * AVX-512 two vectors (outputs 0-15, 16-31), AVX2 four (0-7 and 16-23 from the first 32 bytes, 8-15 and 24-31 from
 * the second): vector v holds outputs VW v .. VW v + VW - 1 either way, whose scales are contiguous in the head.
 *
 * Tiles: up to 8 rows (AVX-512) take both vectors of each k4 step from one unpack; 9 to 12 rows (a verify of 8 or
 * more drafts) one vector at a time per super-block, whose codes stay in L1 for the second, so that the sums of 12
 * rows fit the registers: one pass over the weights where two tiles of 5 and 4 rows cost a second unpack and
 * epilogue (Qwen2-1.5B shape, 9 rows: 1.45x a decode against 1.79x). Larger M is cut into tiles of balanced
 * heights (16 rows: 8 + 8); the fp32 accumulators live in a small array (touched once per super-block); the first
 * tile of a block prefetches it into L2 ahead of its loads, the others read it from L1 and L2. Blocks are dealt to threads as contiguous ranges (deal.h), as gemm_i8a8.c
 * does. With VNNI (kernels.has_vnni) a group costs one vpdpbusd per vector per k4 step per row; without it,
 * vpmaddubsw, vpmaddwd and an add (vi_dpbusd_madd: exact for 4-bit codes), and vpmaddwd + an add for vpdpwssd: the
 * same integers, so bitwise the same outputs. The loops are gemm_i4_tiles.h, compiled once for each (the VNNI copy
 * in vnni.h's region only).
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
#include "tile_store.h"
#include "vnni.h"

#define NB 32
#define GK 32                           /* inputs per group */
#define SBG 8                           /* groups per super-block */
#define SBK (GK * SBG)                  /* inputs per super-block: one activation scale */
#define STEPS (GK / 4)                  /* k4 steps per group */
#define CODES (STEPS * 64)              /* code bytes of one group of a block */
#define HEAD_BYTES (2 * NB * 4 + 2 * SBG * NB)   /* d, dmin; sc; mn pairs */
#define SC_AT (2 * NB * 4)              /* sc's offset in a head */
#define MN_AT (SC_AT + SBG * NB)        /* mn pairs' offset in a head */
#define NV (NB / VW)
/* Rows per register tile (gemm_i4_tiles.h): up to TILE2_MT rows take both (AVX2: all four) vectors of a k4 step at
 * once, 2 MT group sums in registers; 9 .. I4_MT rows one vector at a time, MT group sums and MT super-block sums in
 * registers (AVX-512: 24 of 32 at 12 rows; AVX2: 12 of 16 at 6). */
#ifndef I4_MT
#define I4_MT (VREGS == 32 ? 12 : 6)
#endif
#define TILE2_MT (VREGS == 32 ? 8 : 2)  /* tiles this high or lower take both vectors of a k4 step at once */
#ifndef PF_BYTES
#define PF_BYTES 2048                   /* near prefetch distance into L1 */
#endif
#ifndef PF_FAR_BYTES
#define PF_FAR_BYTES 6144               /* a single-tile call also pulls its block into L2 this far ahead */
#endif

int64_t specgram_i4_groups(int64_t K) { return (K + GK - 1) / GK; }

static inline int64_t super_blocks(int64_t K) { return (specgram_i4_groups(K) + SBG - 1) / SBG; }

int64_t specgram_i4_block_bytes(int64_t K) { return super_blocks(K) * HEAD_BYTES + specgram_i4_groups(K) * CODES; }

int64_t specgram_i4_aux_words(int64_t K) { return 5 * super_blocks(K); }

#if VW == 16
VINLINE int32_t vi_reduce_add(vi a) { return _mm512_reduce_add_epi32(a); }
VINLINE void vi_store_s8(int8_t *p, vi v) { _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(v)); }
VINLINE vi vi_mullo(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
/* VW u8 -> VW int32 lanes (zero-extended) */
VINLINE vi vi_load_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
/* 2 VW u8 -> VW int32 lanes, each two zero-extended int16 (bytes 2 j, 2 j + 1 -> lane j's low and high halves) */
VINLINE vi vi_load_u8_pairs(const uint8_t *p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
VINLINE vi vi_madd16(vi a, vi b) { return _mm512_madd_epi16(a, b); }
#else
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
VINLINE vi vi_mullo(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
VINLINE vi vi_load_u8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
VINLINE vi vi_load_u8_pairs(const uint8_t *p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)); }
VINLINE vi vi_madd16(vi a, vi b) { return _mm256_madd_epi16(a, b); }
#endif

/* VW int32 in [-127, 127] -> VW int8, the 4 of each k4 step at p + j * stride */
VINLINE void vi_store_s8_steps(int8_t *p, int64_t stride, vi v) {
    int8_t tmp[VW];
    vi_store_s8(tmp, v);
    for (int j = 0; j < VW / 4; ++j) memcpy(p + j * stride, tmp + 4 * j, 4);
}

/* Row x [K] -> its int8 activations, 4 at a time (k4 step j at s + 4 (j M); 8 G steps: zero past K), and its aux
 * words (see the header). */
static void quantize_row(const float *x, int64_t K, int64_t M, int8_t *s, int32_t *aux) {
    const int64_t G = specgram_i4_groups(K), SB = super_blocks(K);
    float *xs = (float *)aux;
    int32_t *pairs = aux + SB;
    for (int64_t b = 0; b < SB; ++b) {
        const int64_t k0 = b * SBK, k1 = (b + 1) * SBK < GK * G ? (b + 1) * SBK : GK * G;   /* inputs of b's groups */
        vf mx = vf_zero();
        for (int64_t k = k0; k < k1; k += VW) {
            vf v = vf_maskz_load(vmask_first(K - k), x + k);
            mx = vf_max(mx, vf_max(v, vf_sub(vf_zero(), v)));
        }
        const float amax = vf_reduce_max(mx);
        int32_t sums[SBG] = {0};
        if (!(amax > 0.0f)) {
            for (int64_t j = k0 / 4; j < k1 / 4; ++j) memset(s + 4 * j * M, 0, 4);
            xs[b] = 0.0f;
        } else {
            xs[b] = amax / 127.0f;
            const vf inv = vf_set1(127.0f / amax), hi = vf_set1(127.0f), lo = vf_set1(-127.0f);
            for (int64_t k = k0; k < k1; k += VW) {          /* past K the masked loads give 0: xq = 0 */
                vf q = vf_round(vf_mul(vf_maskz_load(vmask_first(K - k), x + k), inv));
                vi v = vi_from_f(vf_min(vf_max(q, lo), hi));
                vi_store_s8_steps(s + k / 4 * 4 * M, 4 * M, v);
                sums[(k - k0) / GK] += vi_reduce_add(v);     /* integers: exact in any order */
            }
        }
        for (int p = 0; p < SBG / 2; ++p)
            pairs[b * (SBG / 2) + p] = (int32_t)((uint32_t)(uint16_t)sums[2 * p] | (uint32_t)sums[2 * p + 1] << 16);
    }
}

void specgram_i4_quantize_rows(const float *x, int64_t m0, int64_t m1, int64_t M, int64_t K, int64_t ldx, int8_t *s,
                               int32_t *aux) {
    const int64_t aw = specgram_i4_aux_words(K);
    for (int64_t m = m0; m < m1; ++m) quantize_row(x + m * ldx, K, M, s + 4 * m, aux + m * aw);
}

#if VW == 16
/* One 64-byte step of codes -> the 4 k of the 16 outputs of vector v (0: the low nibbles, 1: the high ones). */
VINLINE vi unpack_one(const uint8_t *p, int v) {
    vi c = _mm512_loadu_si512(p);
    return _mm512_and_si512(v ? _mm512_srli_epi16(c, 4) : c, _mm512_set1_epi8(0x0F));
}
/* One 64-byte step of codes -> the 4 k of outputs 0-15 and 16-31. */
VINLINE void unpack(const uint8_t *p, vi w[NV]) {
    const vi low = _mm512_set1_epi8(0x0F);
    vi v = _mm512_loadu_si512(p);
    w[0] = _mm512_and_si512(v, low);
    w[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
}
#else
/* vector v: outputs 8 v .. 8 v + 7 (v = 0, 1: the low nibbles of the first / second 32 bytes; 2, 3: the high) */
VINLINE vi unpack_one(const uint8_t *p, int v) {
    vi c = _mm256_loadu_si256((const __m256i *)(p + 32 * (v & 1)));
    return _mm256_and_si256(v & 2 ? _mm256_srli_epi16(c, 4) : c, _mm256_set1_epi8(0x0F));
}
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
/* vpdpwssd without VNNI: pairs of int16 products summed into each int32 lane (exact here: mn <= 255, |A| < 2^15) */
VINLINE vi vi_dpwssd_madd(vi acc, vi a, vi b) { return vi_add(acc, vi_madd16(a, b)); }

/* acc + the 4 u8 of each lane of w times the 4 s8 at p (broadcast) */
VINLINE vi vi_dpbusd_madd_at(vi acc, vi w, const int32_t *p) { return vi_dpbusd_madd(acc, w, vi_set1(*p)); }
#define I4_DPB vi_dpbusd_madd_at
#define I4_DPW vi_dpwssd_madd
#define I4_NAME(f) f##_madd
#include "gemm_i4_tiles.h"
#undef I4_DPB
#undef I4_DPW
#undef I4_NAME

#if VNNI_BUILT
VNNI_BEGIN
#if VW == 16
VINLINE vi vi_dpwssd(vi acc, vi a, vi b) { return _mm512_dpwssd_epi32(acc, a, b); }
#else
VINLINE vi vi_dpwssd(vi acc, vi a, vi b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
#endif
#if VW == 16
/* vpdpbusd with the activations' 4 bytes broadcast from memory by the instruction itself ({1to16}): no broadcast
 * instruction, one address register for every row of a tile (the rows' steps are interleaved: see the header) */
VINLINE vi vi_dpbusd_at(vi acc, vi w, const int32_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}
#else
VINLINE vi vi_dpbusd_at(vi acc, vi w, const int32_t *p) { return vi_dpbusd(acc, w, vi_set1(*p)); }
#endif
#define I4_DPB vi_dpbusd_at
#define I4_DPW vi_dpwssd
#define I4_NAME(f) f##_vnni
#include "gemm_i4_tiles.h"
#undef I4_DPB
#undef I4_DPW
#undef I4_NAME
VNNI_END
#endif

void specgram_team_i4(const int8_t *s, const int32_t *aux, int64_t M, int64_t K, const uint8_t *w, int vnni, int64_t N,
                      const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads) {
#if VNNI_BUILT
    if (vnni) {
        team_vnni(s, aux, M, K, w, N, bias, y, ldy, ranges, nthreads);
        return;
    }
#endif
    assert(!vnni);                                   /* a build without VNNI products: the caller asks for none */
    team_madd(s, aux, M, K, w, N, bias, y, ldy, ranges, nthreads);
}

/* An entry point's rows (this one's and gemm_i8b.c's): x [M, K] (row stride ldx) quantized into the calling thread's
 * SCRATCH_PLAN buffer (the int8 steps [M, ldq] bytes, then *aux [M, AW] words, then *ranges [nthreads], dealt
 * for nblocks blocks) -> the int8 steps. */
const int8_t *specgram_i4_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int64_t nblocks, int nthreads,
                               int32_t **aux, deal_range **ranges) {
    const int64_t aw = specgram_i4_aux_words(K);
    size_t row_bytes = (size_t)(M * specgram_i8a8_ldq(K)), words = (size_t)(M * aw);
    size_t bytes = row_bytes + sizeof(int32_t) * words + 64 + sizeof(deal_range) * (size_t)(nthreads + 1);
    int8_t *s = specgram_scratch(SCRATCH_PLAN, bytes);
    *aux = (int32_t *)(s + row_bytes);
    *ranges = (deal_range *)(((uintptr_t)(*aux + words) + 63) & ~(uintptr_t)63);
    specgram_i4_quantize_rows(x, 0, M, M, K, ldx, s, *aux);
    deal_init(*ranges, nblocks, nthreads);
    return s;
}

/* Entry point: x [M, K] (row stride ldx), w packed as the header says, vnni 1 where the CPU has VNNI
 * (kernels.has_vnni), else 0; bias [N] or NULL, y [M, ldy]. Scratch: specgram_i4_rows'. */
void specgram_gemm_i4(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int vnni, int64_t N,
                      const float *bias, float *y, int64_t ldy, int nthreads) {
    assert(M >= 0 && K >= 0 && N >= 0 && nthreads >= 1);
    assert(ldx >= K && ldy >= N && N <= (int64_t)UINT32_MAX * NB);
    if (M == 0 || N == 0) return;
    int32_t *aux;
    deal_range *ranges;
    const int8_t *s = specgram_i4_rows(x, M, K, ldx, (N + NB - 1) / NB, nthreads, &aux, &ranges);
#pragma omp parallel num_threads(nthreads)
    specgram_team_i4(s, aux, M, K, w, vnni, N, bias, y, ldy, ranges, nthreads);
}
