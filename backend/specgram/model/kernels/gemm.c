/* Small-M matrix products at the memory bound, with results that do not depend on M.
 *
 *   y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n])      x: [M, K] fp32, W: packed (see below), y: [M, ldy] fp32
 *
 * Decode, speculative verification and draft steps multiply a handful of rows (M = 1 .. 40) by every weight
 * matrix: the cost is streaming W from memory once, so the kernel reads each W element once per call and
 * keeps all M rows' accumulators in registers (register tile: MT <= MT_MAX rows x 32 outputs, MT_MAX = 12 with
 * AVX-512's 32 vector registers, 3 with AVX2's 16; int8 weights 8 and 3).
 *
 * Batch invariance: every output is accumulated as acc = fma(x[m,k], W[n,k], acc) for k = 0, 1, ..., K-1 in
 * that order, starting from 0, in the same instruction sequence whatever the tile height, M, or the thread
 * that computes it (each output lane is its own chain: the vector width does not change the arithmetic). So a
 * row's result is bitwise the same alone, in a batch of 8, or as one of k + 1 verify positions, which is what
 * makes greedy speculative output equal non-speculative output exactly.
 *
 * Packed layout: W [N, K] -> blocks of NB = 32 outputs, block b = packed[b * K * 32 ...], element (k, j) at
 * k * 32 + j holds W[b * 32 + j, k] (zero for padding outputs past N). One block is one contiguous stream.
 * Weights are fp32 or bf16 (upper 16 bits of an fp32; widened exactly to fp32 before the fma), or int8 with
 * one fp32 scale per output (weight-only quantization, W[n, k] ~ scale[n] * q[n, k]): each int8 is converted
 * exactly to fp32 in the registers and the fmas run as for fp32 weights, acc = fma(x[m,k], q[n,k], acc) for
 * k = 0 .. K-1; the scale multiplies the finished sum once, y = acc * scale[n] (+ bias[n]). The order is the
 * fp32 one, so int8 products are batch-invariant in the same way; a quarter of the bytes to stream.
 */
#include <assert.h>
#include <omp.h>
#include <stdint.h>

#include "deal.h"
#include "scratch.h"
#include "specgram.h"
#include "team.h"
#include "vec.h"

#define NB 32
#define NV (NB / VW)        /* vectors per k step of a block: 2 (AVX-512) or 4 (AVX2) */
#ifndef MT_MAX   /* rows per register tile: MT_MAX * NV accumulators, NV weight vectors and a broadcast fit the
                    registers (AVX-512: 24 + 2 + 1 of 32; AVX2: 12 + 3 + 1 of 16, the fourth weight vector read
                    as the fmas' memory operand; 4 rows would need 16 accumulators alone). 12, not 8: a verify of
                    8 streams with a few drafts (9 - 12 rows) is then one pass over the weights, not an 8-row pass
                    from memory and a second from cache (SmolLM2-135M fp32, 9 rows: 17.2 -> 14.7 ms, 8 rows 14.3) */
#define MT_MAX (VREGS == 32 ? 12 : 3)
#endif
#ifndef MT_MAX_I8   /* int8 tiles also keep their MT broadcasts live (16 + 8 + 1 of 32 at 8 rows) */
#define MT_MAX_I8 (VREGS == 32 ? 8 : 3)
#endif
_Static_assert(MT_MAX >= 1 && MT_MAX <= 12 && MT_MAX_I8 >= 1 && MT_MAX_I8 <= MT_MAX,
               "tile_any() dispatches heights 1 .. 12");
#ifndef PF
#define PF 16   /* prefetch distance in k steps of 128 bytes: keeps 2 KB of the stream in flight (measured best of 6-64) */
#endif
#ifndef PF_FAR
#define PF_FAR 48 /* a single-tile call also pulls the stream into L2 this many k steps (6 KB) ahead: without it the
                     near prefetches alone leave the loads waiting on memory and every row's arithmetic adds to the
                     streaming time (30 layers' weights at M = 5: 23.5 -> 19.9 ms, M = 8: 25.0 -> 21.1 ms, M = 1
                     19.1 -> 18.5 ms; 32-96 about as good, 192 worse). Multi-tile calls get the next-block
                     prefetch instead (an extra far stream there cost 2-5 ms at M = 40). */
#endif

#define ALWAYS_INLINE VINLINE

/* Weight types, a compile-time constant at every call site: one specialised copy of the loops each. */
enum { WT_F32 = 0, WT_BF16 = 1, WT_I8 = 2 };
#define WT_BYTES(wt) ((wt) == WT_F32 ? 4 : (wt) == WT_BF16 ? 2 : 1)
#define MT_OF(wt) ((wt) == WT_I8 ? MT_MAX_I8 : MT_MAX)      /* the tallest tile of a weight type */

/* The NV weight vectors (outputs j = 0 .. 31, VW per vector) of step k of a packed fp32 or bf16 block (int8
 * blocks are loaded one vector at a time, in tile()). */
ALWAYS_INLINE void load_w(const int wt, const void *wb, int64_t k, vf w[NV]) {
    for (int v = 0; v < NV; ++v)
        w[v] = wt == WT_BF16 ? vf_load_bf16((const uint16_t *)wb + k * NB + v * VW)
                             : vf_load((const float *)wb + k * NB + v * VW);
}

/* Scales (int8 weights: scale != NULL) and adds the bias (if any) to one row's 32 accumulators, and stores the
 * outputs of the block that exist: out = acc * scale[n] + bias[n], in that order. */
ALWAYS_INLINE void store_tile(float *yrow, int64_t n0, int64_t N, const vf a[NV], const float *scale,
                              const float *bias) {
    for (int v = 0; v < NV; ++v) {
        vmask k = vmask_first(N - n0 - v * VW);            /* outputs of this vector that exist */
        vf out = a[v];
        if (scale) out = vf_mul(out, vf_maskz_load(k, scale + n0 + v * VW));
        if (bias) out = vf_add(out, vf_maskz_load(k, bias + n0 + v * VW));
        vf_mask_store(yrow + n0 + v * VW, k, out);
    }
}

/* One register tile: y[m0 + r, n0 .. n0 + 31] for r < MT, from x rows m0 .. m0 + MT - 1 [.., K] (row stride
 * ldx) and one packed block wb [K, 32] of weight type wt (int8: with the call's scale [N]). MT (1 .. MT_OF(wt))
 * and wt must be compile-time constants at every call site: inlined, the row loops unroll completely and the
 * NV * MT accumulators stay in registers.
 * Prefetch only (no effect on the results): if `pf` is set, the tile also pulls a slice of the next block into
 * L2, one line every 2^32 / pf_inc k steps (32.32 fixed point), spread over the whole k loop; if `far` is set,
 * it pulls its own block into L2 PF_FAR k steps ahead. The distances are in k steps of fp32 and bf16 blocks;
 * an int8 step is 32 bytes, so int8 blocks prefetch the same bytes ahead as fp32 ones (PF * 128 and
 * PF_FAR * 128), with one prefetch per k step (two per 64-byte line). */
ALWAYS_INLINE void tile(const int MT, const int wt, const float *x, int64_t ldx, int64_t m0, const void *wb,
                        int64_t K, float *y, int64_t ldy, int64_t n0, int64_t N, const float *scale,
                        const float *bias, const char *pf, uint64_t pf_inc, int far) {
    const int64_t step = NB * WT_BYTES(wt);                 /* bytes of one k step of the block */
    const int64_t near = wt == WT_I8 ? PF * 128 : PF * step, away = wt == WT_I8 ? PF_FAR * 128 : PF_FAR * step;
    const char *wbytes = (const char *)wb;
    vf acc[MT_MAX][NV];
    uint64_t pf_at = 0;
    for (int r = 0; r < MT; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = vf_zero();
    for (int64_t k = 0; k < K; ++k) {
        vf w[NV];
        if (pf) { _mm_prefetch(pf + ((pf_at >> 32) << 6), _MM_HINT_T1); pf_at += pf_inc; }
        _mm_prefetch(wbytes + k * step + near, _MM_HINT_T0);
        if (wt != WT_I8) _mm_prefetch(wbytes + k * step + near + step / 2, _MM_HINT_T0);
        if (far) {
            _mm_prefetch(wbytes + k * step + away, _MM_HINT_T1);
            if (wt != WT_I8) _mm_prefetch(wbytes + k * step + away + step / 2, _MM_HINT_T1);
        }
        if (wt == WT_I8) {     /* one weight vector live at a time, converted from int8 (AVX2: 12 accumulators,
                                  3 broadcasts and 1 weight vector fill the 16 registers without a spill) */
            vf xb[MT_MAX];
#pragma GCC unroll 16
            for (int r = 0; r < MT; ++r) xb[r] = vf_set1(x[(m0 + r) * ldx + k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                vf wv = vf_load_i8((const int8_t *)wb + k * NB + v * VW);
#pragma GCC unroll 16
                for (int r = 0; r < MT; ++r) acc[r][v] = vf_fma(xb[r], wv, acc[r][v]);
            }
            continue;
        }
        load_w(wt, wb, k, w);
#pragma GCC unroll 16
        for (int r = 0; r < MT; ++r) {
            vf xb = vf_set1(x[(m0 + r) * ldx + k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[r][v] = vf_fma(xb, w[v], acc[r][v]);
        }
    }
    for (int r = 0; r < MT; ++r) store_tile(y + (m0 + r) * ldy, n0, N, acc[r], scale, bias);
}

/* tile() for a run-time height mt (1 .. MT_OF(wt)): one specialised copy per height. */
ALWAYS_INLINE void tile_any(const int wt, int mt, const float *x, int64_t ldx, int64_t m0, const void *wb,
                            int64_t K, float *y, int64_t ldy, int64_t n0, int64_t N, const float *scale,
                            const float *bias, const char *pf, uint64_t pf_inc, int far) {
    switch (mt) {
/* heights below MT_OF(wt) each get their copy; MT_OF(wt) (and, never reached, the heights past it) the default */
#define TILE_CASE(h) case h: if (h < MT_OF(wt)) { tile(h < MT_OF(wt) ? h : 1, wt, x, ldx, m0, wb, K, y, ldy, n0, N, \
                                                       scale, bias, pf, pf_inc, far); break; }                  \
                         __attribute__((fallthrough));
    TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
    TILE_CASE(9) TILE_CASE(10) TILE_CASE(11)
    default: tile(MT_OF(wt), wt, x, ldx, m0, wb, K, y, ldy, n0, N, scale, bias, pf, pf_inc, far); break;
#undef TILE_CASE
    }
}

/* Out of line, one per weight type: the tile heights are compiled once, not at every caller. */
static void tile_f32(int mt, const float *x, int64_t ldx, int64_t m0, const float *wb, int64_t K, float *y,
                     int64_t ldy, int64_t n0, int64_t N, const float *bias, const char *pf, uint64_t pf_inc,
                     int far) {
    tile_any(WT_F32, mt, x, ldx, m0, wb, K, y, ldy, n0, N, NULL, bias, pf, pf_inc, far);
}

static void tile_bf16(int mt, const float *x, int64_t ldx, int64_t m0, const uint16_t *wb, int64_t K, float *y,
                      int64_t ldy, int64_t n0, int64_t N, const float *bias, const char *pf, uint64_t pf_inc,
                      int far) {
    tile_any(WT_BF16, mt, x, ldx, m0, wb, K, y, ldy, n0, N, NULL, bias, pf, pf_inc, far);
}

static void tile_i8(int mt, const float *x, int64_t ldx, int64_t m0, const int8_t *wb, int64_t K, float *y,
                    int64_t ldy, int64_t n0, int64_t N, const float *scale, const float *bias, const char *pf,
                    uint64_t pf_inc, int far) {
    tile_any(WT_I8, mt, x, ldx, m0, wb, K, y, ldy, n0, N, scale, bias, pf, pf_inc, far);
}

/* Blocks go to threads as contiguous ranges, a thread done with its own taking from the back of the others'
 * (deal.h: a preempted thread - 2 cores shared with a server - does not hold up the call, and each thread streams
 * one long run of blocks); within a block the rows go in tiles of at most MT_OF(wt), so a block is read from memory
 * once and from cache for later tiles. With more than one tile, the first tile would wait on memory while the FMA units
 * idle, and the later tiles compute while the memory bus idles: so the tiles of a block also prefetch the
 * thread's next block into L2, one slice each, and memory and arithmetic overlap (measured on 30 layers' weights
 * from DRAM: M = 40 rows 45 -> 35 ms, 16 rows 26 -> 21 ms; M <= 8 unchanged). Prefill-sized calls (121 rows or
 * more, 16 tiles of 8: compute-bound, the streaming a small share) take single blocks from OpenMP's dynamic
 * schedule instead, which balances the threads' shares block by block. Neither dealing nor prefetching changes
 * any arithmetic: the results are bitwise the same whichever thread computes a block. */
#define PREFILL_TILES 16   /* of 8 rows, whatever MT_MAX */

/* Block b (outputs 32 b .. 32 b + 31) for all M rows, in the fewest tiles of at most MT_OF(wt) rows, of balanced
 * heights (16 rows: 8 + 8, which ran faster than 12 + 4: each tile computes as long while its share of the next
 * block's prefetch goes out). With more than one tile, tile t also prefetches lines [t * per_tile, (t + 1) *
 * per_tile) of block b + 1 when `ours` says the same thread takes that block next. */
ALWAYS_INLINE void gemm_block(const int wt, int64_t b, int ours, const float *x, int64_t M, int64_t K,
                              int64_t ldx, const void *w, int64_t N, const float *scale, const float *bias, float *y,
                              int64_t ldy) {
    const int64_t block_bytes = K * NB * WT_BYTES(wt);
    const int64_t MT = MT_OF(wt);
    int64_t nblocks = (N + NB - 1) / NB, ntiles = (M + MT - 1) / MT, base = M / ntiles, taller = M % ntiles;
    int64_t lines = block_bytes / 64, per_tile = (lines + ntiles - 1) / ntiles;
    const char *wb = (const char *)w + b * block_bytes;
    int next = ntiles > 1 && ours && b + 1 < nblocks;
    for (int64_t t = 0; t < ntiles; ++t) {
        int64_t m0 = t * base + (t < taller ? t : taller), first = t * per_tile;   /* the first `taller` tiles */
        int mt = (int)(base + (t < taller));                                        /* one row more */
        int64_t count = lines - first < per_tile ? lines - first : per_tile;
        const char *pf = next && count > 0 ? wb + block_bytes + first * 64 : NULL;
        uint64_t inc = pf ? ((uint64_t)count << 32) / (uint64_t)K : 0;
        if (wt == WT_I8)
            tile_i8(mt, x, ldx, m0, (const int8_t *)wb, K, y, ldy, b * NB, N, scale, bias, pf, inc, ntiles == 1);
        else if (wt == WT_BF16)
            tile_bf16(mt, x, ldx, m0, (const uint16_t *)wb, K, y, ldy, b * NB, N, bias, pf, inc, ntiles == 1);
        else
            tile_f32(mt, x, ldx, m0, (const float *)wb, K, y, ldy, b * NB, N, bias, pf, inc, ntiles == 1);
    }
}

/* Whether a product of M rows deals its blocks as ranges (deal.h), or, prefill-sized, takes them one at a time from
 * OpenMP's dynamic schedule. */
int specgram_gemm_deals(int64_t M) { return (M + 7) / 8 < PREFILL_TILES; }   /* M < 121 rows */

/* Every thread of the caller's OpenMP team: the blocks of one product, x [M, K] (row stride ldx) by w of weight
 * type wt into y [M, ldy]. ranges: nthreads ranges deal_init'ed for the product's blocks before any thread gets
 * here (specgram_gemm_deals(M)), else NULL (the dynamic schedule, without its closing barrier: the caller's
 * barrier ends the product). A team smaller than nthreads still takes every block. */
ALWAYS_INLINE void gemm_team(const int wt, const float *x, int64_t M, int64_t K, int64_t ldx, const void *w,
                             int64_t N, const float *scale, const float *bias, float *y, int64_t ldy,
                             deal_range *ranges, int nthreads) {
    if (ranges == NULL) {
        int64_t nblocks = (N + NB - 1) / NB;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t b = 0; b < nblocks; ++b) gemm_block(wt, b, 0, x, M, K, ldx, w, N, scale, bias, y, ldy);
    } else {
#define GEMM_BLOCK(b, more) gemm_block(wt, b, more, x, M, K, ldx, w, N, scale, bias, y, ldy)
        DEAL_BLOCKS(ranges, nthreads, GEMM_BLOCK);
#undef GEMM_BLOCK
    }
}

/* gemm_team for one weight type each, out of line (the weight type a constant inside). */
void specgram_team_gemm_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *w, int64_t N,
                            const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads) {
    gemm_team(WT_F32, x, M, K, ldx, w, N, NULL, bias, y, ldy, ranges, nthreads);
}

void specgram_team_gemm_bf16(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w, int64_t N,
                             const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads) {
    gemm_team(WT_BF16, x, M, K, ldx, w, N, NULL, bias, y, ldy, ranges, nthreads);
}

void specgram_team_gemm_i8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *scale,
                           int64_t N, const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads) {
    gemm_team(WT_I8, x, M, K, ldx, w, N, scale, bias, y, ldy, ranges, nthreads);
}

/* The dealing's ranges for a product of M rows and N outputs on nthreads threads (the calling thread's scratch),
 * or NULL for prefill-sized calls. */
static deal_range *plan(int64_t M, int64_t K, int64_t ldx, int64_t N, int64_t ldy, int nthreads) {
    assert(M >= 0 && K >= 0 && N >= 0 && nthreads >= 1);
    assert(ldx >= K && ldy >= N);
    (void)K, (void)ldx, (void)ldy;
    if (!specgram_gemm_deals(M)) return NULL;
    deal_range *ranges = specgram_scratch(SCRATCH_PLAN, sizeof(deal_range) * (size_t)(nthreads + 1));
    ranges = (deal_range *)(((uintptr_t)ranges + 63) & ~(uintptr_t)63);
    deal_init(ranges, (N + NB - 1) / NB, nthreads);
    return ranges;
}

/* Entry points, each its own parallel region: x [M, K] (row stride ldx), w packed [ceil(N / 32), K, 32], bias [N]
 * or NULL, y [M, ldy]; int8 weights also take scale [N] (fp32, one per output). forward.c runs the same team
 * bodies inside one region for a whole decoder stack. */
void specgram_gemm_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *w, int64_t N,
                       const float *bias, float *y, int64_t ldy, int nthreads) {
    deal_range *ranges = plan(M, K, ldx, N, ldy, nthreads);
#pragma omp parallel num_threads(nthreads)
    specgram_team_gemm_f32(x, M, K, ldx, w, N, bias, y, ldy, ranges, nthreads);
}

void specgram_gemm_bf16(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w, int64_t N,
                        const float *bias, float *y, int64_t ldy, int nthreads) {
    deal_range *ranges = plan(M, K, ldx, N, ldy, nthreads);
#pragma omp parallel num_threads(nthreads)
    specgram_team_gemm_bf16(x, M, K, ldx, w, N, bias, y, ldy, ranges, nthreads);
}

void specgram_gemm_i8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *scale,
                      int64_t N, const float *bias, float *y, int64_t ldy, int nthreads) {
    assert(scale != NULL);
    deal_range *ranges = plan(M, K, ldx, N, ldy, nthreads);
#pragma omp parallel num_threads(nthreads)
    specgram_team_gemm_i8(x, M, K, ldx, w, scale, N, bias, y, ldy, ranges, nthreads);
}
