/* Small-M products of int8 weights (one fp32 scale per output, int8.py) and activations quantized to int8 in the call
 * per row and per block of 256 inputs, exactly as gemm_i4.c quantizes its rows (specgram_i4_quantize_rows: the same
 * interleaved int8 steps and aux words, so forward.c prepares both alike): exact integer sums over each block, then a
 * fixed sequence of fp32 operations per block; results that do not depend on M, the tiling or the thread.
 *
 * Weights: q[n, k] int8 in [-127, 127] and wscale[n] (W ~ q * wscale), packed as gemm_i8a8.c packs them (blocks of
 * 32 outputs, [K4, 32, 4] bytes each, K padded with zeros to K4 = ceil(K / 4) steps) but stored as u = q + 128, so
 * that the weights are vpdpbusd's unsigned operand and the activations its signed one, broadcast from memory.
 *
 * The product, per row m, output n and block b of 256 inputs (xq, xs[m, b] and the block's sum A_b = sum_k xq as
 * gemm_i4.c's header gives them; 0 past K):
 *   I = sum_{k in b} u[n, k] xq[m, k]                 (int32, exact: |I| <= 256 * 255 * 127 < 2^31)
 *   t = (float)(I - 128 A_b) * xs[m, b];  acc = acc + t          (acc = 0 before b = 0; b in order)
 *   y[m, n] = acc * wscale[n]  (+ bias[n])
 * each fp32 step one operation with one rounding, in that order; I - 128 A_b = sum_k q xq exactly. So a row's
 * outputs are bitwise the same alone or among any others, and a pure torch reference reproduces them
 * (int8.reference_blocks; tests/unit/test_int8_blocks.py).
 *
 * Why: gemm_i8a8.c's int16 activations per row cost two vpdpbusd per 4 inputs per row, and past a few rows the
 * product is bound by them, not by memory (Qwen2.5-7B shape, 9 rows: 1.77x a decode). One int8 digit with a scale
 * per 256 inputs halves that, and keeps an outlier channel's coarse step to its own block.
 *
 * Tiles of up to 8 rows (AVX-512: 16 int32 sums, 8 broadcasts and 2 weight vectors in registers; AVX2: 3 rows)
 * read each k4 step of the block once for every row; 9 to 12 rows one vector at a time per activation block (its
 * weights stay in L1 for the second); taller M is cut into tiles of balanced heights; the first tile of a block
 * prefetches it into L2. VNNI only (the caller checks kernels.has_vnni): the AVX-512 build broadcasts each row's 4
 * activations from memory inside vpdpbusd ({1to16}).
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
#define NV (NB / VW)
#define STEP (NB * 4)           /* bytes of one k4 step of a block */
#define BK 256                  /* inputs per activation scale */
#define BSTEPS (BK / 4)         /* k4 steps per activation block */
#define I8B_MT (VREGS == 32 ? 8 : 3)     /* tile(): both (AVX2: all four) vectors of a k4 step at once */
#define TILE1_MT (VREGS == 32 ? 12 : 3)  /* tile1(): one vector at a time, up to this many rows */
#ifndef PF
#define PF 16                   /* near prefetch distance in k4 steps (2 KB), into L1 */
#endif
#ifndef PF_FAR
#define PF_FAR 48               /* the first tile of a block also pulls it into L2 this many k4 steps ahead */
#endif

#if VNNI_BUILT
VNNI_BEGIN
/* acc + the 4 u8 of each lane of w times the 4 s8 at p, broadcast into a register (not by vpdpbusd's own memory
 * operand, as gemm_i4.c does: across a k loop of run-time length GCC keeps the sums in registers only where no asm
 * reads memory) */
VINLINE vi i8b_dp(vi acc, vi w, const int32_t *p) { return vi_dpbusd(acc, w, vi_set1(*p)); }
#if VW == 16
VINLINE vi i8b_load(const uint8_t *p) { return _mm512_loadu_si512(p); }
#else
VINLINE vi i8b_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
#endif

/* The prefetches of k4 step `at` (2 lines): PF steps ahead into L1 and, where `far`, PF_FAR steps ahead into L2. */
VINLINE void prefetch_step(const uint8_t *at, int far) {
    _mm_prefetch((const char *)at + PF * STEP, _MM_HINT_T0);
    _mm_prefetch((const char *)at + PF * STEP + 64, _MM_HINT_T0);
    if (far) {
        _mm_prefetch((const char *)at + PF_FAR * STEP, _MM_HINT_T1);
        _mm_prefetch((const char *)at + PF_FAR * STEP + 64, _MM_HINT_T1);
    }
}

/* The block sums A_b of a row from its aux words: the int16 halves of its 4 pair words of block b. */
static inline int32_t block_sum(const int32_t *aux, int64_t SB, int64_t b) {
    int32_t a = 0;
    for (int p = 0; p < 4; ++p) {
        uint32_t w = (uint32_t)aux[SB + 4 * b + p];
        a += (int16_t)(w & 0xFFFF) + (int16_t)(w >> 16);
    }
    return a;
}

/* One register tile: rows m0 .. m0 + MT - 1 of y, outputs n0 .. n0 + 31, from block wb [K4, 32, 4]. MT must be a
 * compile-time constant at every call site. */
VINLINE void tile(const int MT, const int8_t *s, int64_t M, const int32_t *aux, int64_t aw, int64_t K,
                  int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N, const float *wscale,
                  const float *bias, int far) {
    const int64_t K4 = (K + 3) / 4, SB = (K4 + BSTEPS - 1) / BSTEPS;
    float acc[I8B_MT][NB] __attribute__((aligned(64)));
    for (int r = 0; r < MT; ++r)
        for (int v = 0; v < NV; ++v) vf_store(acc[r] + v * VW, vf_zero());
    for (int64_t b = 0; b < SB; ++b) {
        const int64_t j0 = b * BSTEPS, j1 = j0 + BSTEPS < K4 ? j0 + BSTEPS : K4;
        vi ia[8][NV];                                /* row r, vector v: MT <= 8 */
        for (int r = 0; r < MT; ++r)
            for (int v = 0; v < NV; ++v) ia[r][v] = vi_zero();
        for (int64_t j = j0; j < j1; ++j) {
            const uint8_t *at = wb + j * STEP;
            prefetch_step(at, far);
            const int32_t *a4 = (const int32_t *)s + j * M + m0;
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                vi w = i8b_load(at + v * VW * 4);
#pragma GCC unroll 8
                for (int r = 0; r < MT; ++r) ia[r][v] = i8b_dp(ia[r][v], w, a4 + r);
            }
        }
        for (int r = 0; r < MT; ++r) {
            const int32_t *ra = aux + (m0 + r) * aw;
            const vi corr = vi_set1(-128 * block_sum(ra, SB, b));   /* I - 128 A_b = sum_k q xq */
            const vf xs = vf_set1(((const float *)ra)[b]);
            for (int v = 0; v < NV; ++v)
                vf_store(acc[r] + v * VW, vf_add(vf_load(acc[r] + v * VW), vf_mul(vi_to_f(vi_add(ia[r][v], corr)), xs)));
        }
    }
    store_tile(MT, (const float(*)[NB])acc, y, ldy, m0, n0, N, wscale, bias);
}

/* One register tile of 9 .. 12 rows (AVX-512): per activation block, the 16 outputs of one vector at a time (the
 * block's 8 KB of weights stay in L1 for the second), so that 12 rows' sums and their broadcasts fit the registers
 * (24 of 32): one pass over the weights where two tiles of 5 and 4 rows would read them twice. */
VINLINE void tile1(const int MT, const int8_t *s, int64_t M, const int32_t *aux, int64_t aw, int64_t K,
                   int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N, const float *wscale,
                   const float *bias, int far) {
    const int64_t K4 = (K + 3) / 4, SB = (K4 + BSTEPS - 1) / BSTEPS;
    float acc[TILE1_MT][NB] __attribute__((aligned(64)));
    for (int r = 0; r < MT; ++r)
        for (int v = 0; v < NV; ++v) vf_store(acc[r] + v * VW, vf_zero());
    for (int64_t b = 0; b < SB; ++b) {
        const int64_t j0 = b * BSTEPS, j1 = j0 + BSTEPS < K4 ? j0 + BSTEPS : K4;
        for (int v = 0; v < NV; ++v) {
            vi ia[TILE1_MT];
            for (int r = 0; r < MT; ++r) ia[r] = vi_zero();
            for (int64_t j = j0; j < j1; ++j) {
                const uint8_t *at = wb + j * STEP;
                if (v == 0) {
                    prefetch_step(at, far);
                } else if (far) {                    /* the later passes read L1: keep memory busy with the next block */
                    _mm_prefetch((const char *)at + BSTEPS * STEP, _MM_HINT_T1);
                    _mm_prefetch((const char *)at + BSTEPS * STEP + 64, _MM_HINT_T1);
                }
                const int32_t *a4 = (const int32_t *)s + j * M + m0;
                vi w = i8b_load(at + v * VW * 4);
#pragma GCC unroll 16
                for (int r = 0; r < MT; ++r) ia[r] = i8b_dp(ia[r], w, a4 + r);
            }
            for (int r = 0; r < MT; ++r) {
                const int32_t *ra = aux + (m0 + r) * aw;
                const vi corr = vi_set1(-128 * block_sum(ra, SB, b));   /* I - 128 A_b = sum_k q xq */
                vf t = vf_mul(vi_to_f(vi_add(ia[r], corr)), vf_set1(((const float *)ra)[b]));
                vf_store(acc[r] + v * VW, vf_add(vf_load(acc[r] + v * VW), t));
            }
        }
    }
    store_tile(MT, (const float(*)[NB])acc, y, ldy, m0, n0, N, wscale, bias);
}

static void tile_any(int mt, const int8_t *s, int64_t M, const int32_t *aux, int64_t aw, int64_t K, int64_t m0,
                     const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N, const float *wscale,
                     const float *bias, int far) {
#define TILE_CASE(h)                                                                                              \
    case h:                                                                                                       \
        if (h <= I8B_MT) {                                                                                        \
            tile(h <= I8B_MT ? h : 1, s, M, aux, aw, K, m0, wb, y, ldy, n0, N, wscale, bias, far);               \
            break;                                                                                                \
        }                                                                                                         \
        if (h <= TILE1_MT) {                                                                                      \
            tile1(h <= TILE1_MT ? h : 1, s, M, aux, aw, K, m0, wb, y, ldy, n0, N, wscale, bias, far);            \
            break;                                                                                                \
        }                                                                                                         \
        __attribute__((fallthrough));
    switch (mt) {
    TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
    TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12)
    default: assert(0);
    }
#undef TILE_CASE
}

/* Every thread of the caller's OpenMP team: the blocks of one product of rows quantized by
 * specgram_i4_quantize_rows (done before any thread gets here); ranges deal_init'ed for its blocks. */
void specgram_team_i8b(const int8_t *s, const int32_t *aux, int64_t M, int64_t K, const uint8_t *w,
                       const float *wscale, int64_t N, const float *bias, float *y, int64_t ldy, deal_range *ranges,
                       int nthreads) {
    const int64_t aw = specgram_i4_aux_words(K), block_bytes = (K + 3) / 4 * STEP;
    const int64_t ntiles = (M + TILE1_MT - 1) / TILE1_MT;
#define I8B_BLOCK(b, more)                                                                                        \
    do {                                                                                                          \
        (void)(more);                                                                                             \
        for (int64_t t = 0; t < ntiles; ++t) {                                                                    \
            int64_t m0 = M * t / ntiles, m1 = M * (t + 1) / ntiles;                                               \
            tile_any((int)(m1 - m0), s, M, aux, aw, K, m0, w + (b) * block_bytes, y, ldy, (b) * NB, N, wscale,   \
                     bias, t == 0);                                                                               \
        }                                                                                                         \
    } while (0)
    DEAL_BLOCKS(ranges, nthreads, I8B_BLOCK);
#undef I8B_BLOCK
}

/* Entry point: x [M, K] (row stride ldx), w packed as the header says (u8), wscale [N], bias [N] or NULL,
 * y [M, ldy]. Scratch: specgram_i4_rows'. */
void specgram_gemm_i8b(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, const float *wscale,
                       int64_t N, const float *bias, float *y, int64_t ldy, int nthreads) {
    assert(M >= 0 && K >= 0 && N >= 0 && nthreads >= 1);
    assert(ldx >= K && ldy >= N && N <= (int64_t)UINT32_MAX * NB);
    if (M == 0 || N == 0) return;
    int32_t *aux;
    deal_range *ranges;
    const int8_t *s = specgram_i4_rows(x, M, K, ldx, (N + NB - 1) / NB, nthreads, &aux, &ranges);
#pragma omp parallel num_threads(nthreads)
    specgram_team_i8b(s, aux, M, K, w, wscale, N, bias, y, ldy, ranges, nthreads);
}
VNNI_END
#else
void specgram_gemm_i8b(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, const float *wscale,
                       int64_t N, const float *bias, float *y, int64_t ldy, int nthreads) {
    (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)wscale, (void)N, (void)bias, (void)y, (void)ldy,
        (void)nthreads;
    abort();                                             /* never called: specgram_i8a8_built() is 0 */
}

void specgram_team_i8b(const int8_t *s, const int32_t *aux, int64_t M, int64_t K, const uint8_t *w,
                       const float *wscale, int64_t N, const float *bias, float *y, int64_t ldy, deal_range *ranges,
                       int nthreads) {
    (void)s, (void)aux, (void)M, (void)K, (void)w, (void)wscale, (void)N, (void)bias, (void)y, (void)ldy,
        (void)ranges, (void)nthreads;
    abort();                                             /* never called: specgram_i8a8_built() is 0 */
}
#endif
