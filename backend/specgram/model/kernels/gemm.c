/* Small-M matrix products at the memory bound, with results that do not depend on M.
 *
 *   y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n])      x: [M, K] fp32, W: packed (see below), y: [M, ldy] fp32
 *
 * Decode, speculative verification and draft steps multiply a handful of rows (M = 1 .. 40) by every weight
 * matrix: the cost is streaming W from memory once, so the kernel reads each W element once per call and
 * keeps all M rows' accumulators in registers (register tile: MT <= 8 rows x 32 outputs).
 *
 * Batch invariance: every output is accumulated as acc = fma(x[m,k], W[n,k], acc) for k = 0, 1, ..., K-1 in
 * that order, starting from 0, in the same instruction sequence whatever the tile height, M, or the thread
 * that computes it. So a row's result is bitwise the same alone, in a batch of 8, or as one of k + 1 verify
 * positions, which is what makes greedy speculative output equal non-speculative output exactly.
 *
 * Packed layout: W [N, K] -> blocks of NB = 32 outputs, block b = packed[b * K * 32 ...], element (k, j) at
 * k * 32 + j holds W[b * 32 + j, k] (zero for padding outputs past N). One block is one contiguous stream.
 * Weights are fp32 or bf16 (upper 16 bits of an fp32; widened exactly to fp32 before the fma).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define NB 32
#define MT_MAX 8
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

static inline __m512 load_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One register tile: MT rows (x rows m0 .. m0+MT-1) x one packed block. If `pf` is set, the tile also pulls
 * a slice of the next block into L2 (one line every 2^32 / pf_inc k steps, spread over the whole k loop); if
 * `far` is set, it pulls its own block into L2 PF_FAR k steps ahead. */
#define TILE_BODY(MT, LOADW)                                                                          \
    {                                                                                                 \
        __m512 acc0[MT], acc1[MT];                                                                    \
        uint64_t pf_at = 0;                                                                           \
        for (int r = 0; r < MT; ++r) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); } \
        for (int64_t k = 0; k < K; ++k) {                                                             \
            __m512 w0, w1;                                                                            \
            if (pf) { _mm_prefetch(pf + ((pf_at >> 32) << 6), _MM_HINT_T1); pf_at += pf_inc; }       \
            _mm_prefetch((const char *)(wb + (k + PF) * NB), _MM_HINT_T0);                            \
            _mm_prefetch((const char *)(wb + (k + PF) * NB + 16), _MM_HINT_T0);                       \
            if (far) {                                                                                \
                _mm_prefetch((const char *)(wb + (k + PF_FAR) * NB), _MM_HINT_T1);                    \
                _mm_prefetch((const char *)(wb + (k + PF_FAR) * NB + 16), _MM_HINT_T1);               \
            }                                                                                         \
            LOADW                                                                                     \
            _Pragma("GCC unroll 8") for (int r = 0; r < MT; ++r) {                                   \
                __m512 xb = _mm512_set1_ps(x[(m0 + r) * ldx + k]);                                    \
                acc0[r] = _mm512_fmadd_ps(xb, w0, acc0[r]);                                           \
                acc1[r] = _mm512_fmadd_ps(xb, w1, acc1[r]);                                           \
            }                                                                                         \
        }                                                                                             \
        for (int r = 0; r < MT; ++r) store_tile(y + (m0 + r) * ldy, n0, N, acc0[r], acc1[r], bias);   \
    }

static inline void store_tile(float *yrow, int64_t n0, int64_t N, __m512 a0, __m512 a1, const float *bias) {
    int64_t n = N - n0 < NB ? N - n0 : NB;                 /* outputs of this block that exist */
    __mmask16 k0 = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    __mmask16 k1 = n >= 32 ? (__mmask16)0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    if (bias) {
        a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(k0, bias + n0));
        a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(k1, bias + n0 + 16));
    }
    _mm512_mask_storeu_ps(yrow + n0, k0, a0);
    _mm512_mask_storeu_ps(yrow + n0 + 16, k1, a1);
}

#define DEFINE_TILES(SUFFIX, WT, LOADW)                                                               \
    static void tile_##SUFFIX(int MT, const float *x, int64_t ldx, int64_t m0, const WT *wb, int64_t K, \
                              float *y, int64_t ldy, int64_t n0, int64_t N, const float *bias,        \
                              const char *pf, uint64_t pf_inc, int far) {                             \
        switch (MT) {                                                                                 \
        case 1: TILE_BODY(1, LOADW) break;                                                            \
        case 2: TILE_BODY(2, LOADW) break;                                                            \
        case 3: TILE_BODY(3, LOADW) break;                                                            \
        case 4: TILE_BODY(4, LOADW) break;                                                            \
        case 5: TILE_BODY(5, LOADW) break;                                                            \
        case 6: TILE_BODY(6, LOADW) break;                                                            \
        case 7: TILE_BODY(7, LOADW) break;                                                            \
        default: TILE_BODY(8, LOADW) break;                                                           \
        }                                                                                             \
    }

DEFINE_TILES(f32, float, { w0 = _mm512_loadu_ps(wb + k * NB); w1 = _mm512_loadu_ps(wb + k * NB + 16); })
DEFINE_TILES(bf16, uint16_t, { w0 = load_bf16(wb + k * NB); w1 = load_bf16(wb + k * NB + 16); })

/* Blocks go to threads in chunks of consecutive blocks (dynamic: a preempted thread - 2 cores shared with a
 * server - does not hold up the call); within a block the rows go in tiles of MT_MAX, so a block is read from
 * memory once and from cache for later tiles. With more than one tile, the first tile would wait on memory
 * while the FMA units idle, and the later tiles compute while the memory bus idles: so the tiles of a block
 * also prefetch the chunk's next block into L2, one slice each, and memory and arithmetic overlap
 * (measured on 30 layers' weights from DRAM: M = 40 rows 45 -> 35 ms, 16 rows 26 -> 21 ms; M <= 8 unchanged).
 * Prefetching changes no arithmetic: the results are bitwise those without it. */
static inline int64_t chunk_blocks(int64_t nblocks, int nthreads, int64_t ntiles) {
    if (ntiles < 2) return 2;                          /* one tile: memory-bound, nothing to overlap */
    if (ntiles >= 16) return 1;                        /* prefill: compute-bound, the streaming is a small
                                                          share; balance the threads' shares instead (18
                                                          blocks: 9 + 9, not 10 + 8; prefill -2 to 3%) */
    /* Otherwise chunks of 2 to 8 blocks, dealt to the threads in turn: the size whose busiest thread gets the
     * fewest blocks (the larger size on a tie: a chunk's first block is not prefetched). An uneven deal costs
     * the whole call: 18 blocks (a 576-wide projection) in chunks of 4 give 10 + 8, in chunks of 3 9 + 9
     * (M = 40, 30 layers: the 576-wide products 3.8 -> 3.6 ms and 9.3 -> 8.9 ms). */
    int64_t best = 2, best_load = INT64_MAX;
    for (int64_t c = 2; c <= 8; ++c) {
        int64_t chunks = (nblocks + c - 1) / c, load = 0;
        for (int64_t t = 0; t < nthreads && t < chunks; ++t) {
            int64_t count = (chunks - t + nthreads - 1) / nthreads, last = t + (count - 1) * nthreads;
            int64_t blocks = count * c - (last == chunks - 1 ? chunks * c - nblocks : 0);
            load = blocks > load ? blocks : load;
        }
        if (load <= best_load) best = c, best_load = load;
    }
    return best;
}

#define DEFINE_GEMM(SUFFIX, WT)                                                                       \
    void specgram_gemm_##SUFFIX(const float *x, int64_t M, int64_t K, int64_t ldx, const WT *w, int64_t N, \
                                const float *bias, float *y, int64_t ldy, int nthreads) {             \
        int64_t nblocks = (N + NB - 1) / NB, ntiles = (M + MT_MAX - 1) / MT_MAX;                      \
        int64_t chunk = chunk_blocks(nblocks, nthreads, ntiles);                                      \
        int64_t lines = K * NB * (int64_t)sizeof(WT) / 64, per_tile = (lines + ntiles - 1) / ntiles;  \
        _Pragma("omp parallel for schedule(dynamic, chunk) num_threads(nthreads)")                   \
        for (int64_t b = 0; b < nblocks; ++b) {                                                       \
            const WT *wb = w + b * K * NB;                                                            \
            int next = ntiles > 1 && (b + 1) % chunk != 0 && b + 1 < nblocks;  /* same chunk: this thread's */ \
            for (int64_t t = 0; t < ntiles; ++t) {                                                    \
                int64_t m0 = t * MT_MAX, first = t * per_tile;                                        \
                int mt = (int)(M - m0 < MT_MAX ? M - m0 : MT_MAX);                                   \
                int64_t count = lines - first < per_tile ? lines - first : per_tile;                  \
                const char *pf = next && count > 0 ? (const char *)(wb + K * NB) + first * 64 : NULL; \
                uint64_t inc = pf ? ((uint64_t)count << 32) / (uint64_t)K : 0;                        \
                tile_##SUFFIX(mt, x, ldx, m0, wb, K, y, ldy, b * NB, N, bias, pf, inc, ntiles == 1);  \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_GEMM(f32, float)
DEFINE_GEMM(bf16, uint16_t)
