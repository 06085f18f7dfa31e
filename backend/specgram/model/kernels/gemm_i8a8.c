/* Small-M products of int8 weights and activations quantized per row on the fly, on VNNI: exact integer
 * accumulation, results that do not depend on M.
 *
 * The activations are integers of D = `digits` base-256 digits (D = 1: int8, 127 levels a side; D = 2: int16,
 * 32767 levels), each digit a u8 that vpdpbusd multiplies by the int8 weights:
 *
 *   acc_d[m, n] = sum_k u_d[m, k] * q[n, k]                                                 (int32, exact)
 *   D = 1:  y[m, n] = ((float)(acc_0 - 128 colsum[n]) * wscale[n]) * xs[m]  (+ bias[n])
 *   D = 2:  y[m, n] = (((float)(acc_0 - 128 colsum[n]) * 256 + (float)acc_1) * wscale[n]) * xs[m]  (+ bias[n])
 *
 * in exactly that order, each step an fp32 operation with one rounding (int32 -> fp32 to nearest even; * 256 is
 * exact). x [M, K] fp32 (row stride ldx), y [M, ldy] fp32; the weight W [N, K] ~ wscale[n] * q[n, k] with q int8
 * in [-127, 127] (int8.py's quantize_rows: symmetric, one scale per output), packed as below, and
 * colsum[n] = sum_k q[n, k] (int32).
 *
 * Why: gemm.c's int8 weight-only product converts every weight to fp32 in the registers before its fma, and at
 * M = 1 .. 8 those conversions, not memory, bound it. vpdpbusd multiplies 4 u8 x s8 pairs per 32-bit lane and
 * adds their sum to the int32 lane in one instruction, with nothing to convert: a 128-byte k4 step of a block
 * costs D * 2 (AVX-512) or D * 4 (AVX2) instructions per row, so at M = 1 .. 4 the product runs at the weights'
 * memory bound either way, and D = 2 costs more only where the arithmetic shows (M = 8: about 1.25x).
 * Why two digits: one int8 per activation is too coarse for a language model's activations, whose largest
 * channel is 20-100x their median (SmolLM2-135M): with D = 1 the int8 copy of SmolLM2-135M agrees with the fp32
 * model on 85.6% of top-1 tokens (2000 positions of text) against 94.4% for int8 weights alone, and its greedy
 * drafts are accepted 75-83% of the time instead of 90-93%; D = 2 matches the weight-only copy.
 *
 * Activations, per row m, on the calling thread before the parallel loop (M * K is small next to M * K * N), with
 * L = 127 (D = 1) or 32767 (D = 2): amax = max_k |x[m, k]|, xs[m] = amax / L, xq[m, k] = round_half_even(x[m, k] *
 * (L / amax)) clamped to [-L, L], all in fp32 (a zero row: xs = 0 and xq = 0; x must be finite). Stored unsigned,
 * because vpdpbusd's first operand is: xq + 128 = u_0 (D = 1), xq + 32768 = 256 u_0 + u_1 (D = 2), and xq = 0 past K.
 * Hence the correction: sum_k xq q = sum_k u_0 q - 128 colsum (D = 1), 256 (sum_k u_0 q - 128 colsum) +
 * sum_k u_1 q (D = 2).
 *
 * Batch invariance: every acc_d is exact integer arithmetic (|u q| <= 255 * 127, so |acc_d| < 2^31 for K <= KMAX:
 * asserted), so its value does not depend on the summation order, the tile height, M or the thread; xs and u are
 * functions of the row alone (max is exact in any order) and the epilogue is the fixed sequence above per output.
 * A row's result is bitwise the same alone or among any others, a pure torch reference (int64 matmuls of the digits
 * and q, then the fp32 operations in the order above) reproduces it bitwise, and so do the two ISA builds (nothing
 * is summed in float).
 *
 * Packed layout: blocks of NB = 32 outputs, K padded with zero weights to K4 = ceil(K / 4) steps of 4; block b is
 * the K4 * 128 contiguous bytes at b * K4 * 128, element (k4, j, kk) at k4 * 128 + j * 4 + kk holds
 * q[32 b + j, 4 k4 + kk] (zero for outputs past N and k past K). One k4 step is the 4 k of 32 outputs: 2 zmm of 16
 * outputs x 4 k, or 4 ymm of 8, each one vpdpbusd per digit against the row's 4 u8 of that digit broadcast to every
 * 32-bit lane.
 *
 * The library is built for CPUs without VNNI too: only the functions that use it are compiled for it (between
 * vnni.h's VNNI_BEGIN and VNNI_END), and the caller must not call specgram_gemm_i8a8 where the CPU lacks it
 * (kernels.has_vnni: AVX-512 build: avx512_vnni; AVX2 build: avx_vnni).
 * Register tiling (MT rows x 32 outputs, MT <= MT_MAX(D)) and prefetching follow gemm.c; blocks are dealt to
 * threads as contiguous ranges (deal.h): at M = 1 .. 8 the whole product is a few microseconds per matrix, and
 * taking blocks two at a time from a shared counter (OpenMP's dynamic chunks) moved that counter's cache line
 * between the cores on every take and broke each thread's stream into short pieces. Measured on SmolLM2-135M's 121
 * matrices in a row (136 MB int8, from DRAM, 2 threads, D = 1, the two dealings interleaved in one process, two
 * runs): these ranges take 0.83-0.86 of the chunks' time at M = 1, 5 and 8 (M = 1: 3.1 against 3.7 ms), 0.85 at
 * M = 16, 0.93 at M = 40; as fast as a static split at M <= 8, which, unlike them, a preempted thread would hold
 * up. The AVX2 build: 0.84-0.93.
 */
#include <assert.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deal.h"
#include "scratch.h"
#include "specgram.h"
#include "team.h"
#include "vnni.h"

#define NB 32
#define NV (NB / VW)        /* int32 vectors per k4 step of a block: 2 (AVX-512) or 4 (AVX2) */
#define STEP (NB * 4)       /* bytes of one k4 step of a block */
#define KMAX 66000          /* K * 255 * 127 < 2^31 */
#define ROW_BYTES 64        /* a quantized digit row's stride is K rounded up to this (a whole number of vectors) */
/* Rows per register tile for D digits: MT * D * NV accumulators, MT * D broadcasts and one weight vector fit the
 * registers (AVX-512, D = 1: 16 + 8 + 1 of 32, D = 2: 16 + 8 + 1; AVX2, D = 1: 12 + 3 + 1 of 16, D = 2: 8 + 2 + 1,
 * two rows would need 16 accumulators alone; so the AVX2 build's D = 2 reads each block from cache once per row
 * after the first: M = 5 1.4x, M = 8 1.9x its D = 1 time, against 1.2x and 1.3x on AVX-512). */
#define MT_MAX(d) (VREGS == 32 ? 8 / (d) : (d) == 1 ? 3 : 1)
#ifndef PF
#define PF 16       /* near prefetch distance in k4 steps (128 bytes each: 2 KB ahead), into L1 */
#endif
#ifndef PF_FAR
#define PF_FAR 48   /* a single-tile call also pulls its block into L2 this many k4 steps (6 KB) ahead */
#endif

#define ALWAYS_INLINE VINLINE

/* More operations on VW int32 lanes (vnni.h): the quantized activations before packing, colsum. */
#if VW == 16
VINLINE vi vi_load(const void *p) { return _mm512_loadu_si512(p); }
VINLINE vi vi_maskz_load(vmask k, const int32_t *p) { return _mm512_maskz_loadu_epi32(k, p); }
VINLINE vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
VINLINE vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
VINLINE vi vi_shl7(vi a) { return _mm512_slli_epi32(a, 7); }
VINLINE vi vi_shr8(vi a) { return _mm512_srli_epi32(a, 8); }
/* VW int32 in [0, 255] -> VW bytes at p. */
VINLINE void vi_store_u8(uint8_t *p, vi a) { _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(a)); }
#else
VINLINE vi vi_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
VINLINE vi vi_maskz_load(vmask k, const int32_t *p) { return _mm256_maskload_epi32(p, k); }
VINLINE vi vi_sub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
VINLINE vi vi_and(vi a, vi b) { return _mm256_and_si256(a, b); }
VINLINE vi vi_shl7(vi a) { return _mm256_slli_epi32(a, 7); }
VINLINE vi vi_shr8(vi a) { return _mm256_srli_epi32(a, 8); }
VINLINE void vi_store_u8(uint8_t *p, vi a) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));   /* 8 x int16 */
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}
#endif

/* Row x [K] -> its D digit rows u_0, u_1 at u, u + ldq ([ldq] each, ldq a multiple of VW; zero activations past K)
 * and its scale *xs (see the header). */
static void quantize_row(const float *x, int64_t K, int64_t ldq, int digits, uint8_t *u, float *xs) {
    vf mx = vf_zero();
    for (int64_t k = 0; k < K; k += VW) {
        vf v = vf_maskz_load(vmask_first(K - k), x + k);
        mx = vf_max(mx, vf_max(v, vf_sub(vf_zero(), v)));
    }
    const float amax = vf_reduce_max(mx), levels = digits == 1 ? 127.0f : 32767.0f;
    if (!(amax > 0.0f)) {                            /* xq = 0: u_0 = 128 (D = 1: 0 + 128; D = 2: 32768 >> 8), u_1 = 0 */
        memset(u, 128, (size_t)ldq);
        if (digits == 2) memset(u + ldq, 0, (size_t)ldq);
        *xs = 0.0f;
        return;
    }
    *xs = amax / levels;
    const vf inv = vf_set1(levels / amax), hi = vf_set1(levels), lo = vf_set1(-levels);
    const vi offset = vi_set1(digits == 1 ? 128 : 32768), low8 = vi_set1(255);
    for (int64_t k = 0; k < ldq; k += VW) {          /* past K the masked loads give 0: xq = 0 */
        vf q = vf_round(vf_mul(vf_maskz_load(vmask_first(K - k), x + k), inv));
        vi v = vi_add(vi_from_f(vf_min(vf_max(q, lo), hi)), offset);
        if (digits == 1) {
            vi_store_u8(u + k, v);
        } else {
            vi_store_u8(u + k, vi_shr8(v));
            vi_store_u8(u + ldq + k, vi_and(v, low8));
        }
    }
}

/* Rows m0 .. m1 - 1 of x [M, K] (row stride ldx) -> their digit rows (row m's digit d at u + (m D + d) ldq) and
 * scales xs [m]; ldq = specgram_i8a8_ldq(K). Per row: any split of the rows gives the same bytes. */
void specgram_quantize_rows(const float *x, int64_t m0, int64_t m1, int64_t K, int64_t ldx, int digits, uint8_t *u,
                            float *xs) {
    const int64_t ldq = specgram_i8a8_ldq(K);
    for (int64_t m = m0; m < m1; ++m) quantize_row(x + m * ldx, K, ldq, digits, u + m * digits * ldq, xs + m);
}

int64_t specgram_i8a8_ldq(int64_t K) { return (K + ROW_BYTES - 1) / ROW_BYTES * ROW_BYTES; }

/* Everything below issues vpdpbusd: compiled for VNNI on top of the build's ISA (vnni.h), and reached only through
 * specgram_gemm_i8a8. Where the compiler cannot target it, specgram_i8a8_built() says 0 and the callers keep the
 * weight-only product. */
int specgram_i8a8_built(void) { return VNNI_BUILT; }

#if VNNI_BUILT
VNNI_BEGIN
/* One row's D x 32 accumulators -> the block's outputs that exist, in the order of the header's y. */
ALWAYS_INLINE void store_row(const int D, float *yrow, int64_t n0, int64_t N, const vi a[][NV], float xs,
                             const float *wscale, const int32_t *colsum, const float *bias) {
    for (int v = 0; v < NV; ++v) {
        int64_t n = n0 + v * VW;
        vmask k = vmask_first(N - n);                        /* outputs of this vector that exist */
        vf out = vi_to_f(vi_sub(a[0][v], vi_shl7(vi_maskz_load(k, colsum + n))));
        if (D == 2) out = vf_add(vf_mul(out, vf_set1(256.0f)), vi_to_f(a[1][v]));
        out = vf_mul(vf_mul(out, vf_maskz_load(k, wscale + n)), vf_set1(xs));
        if (bias) out = vf_add(out, vf_maskz_load(k, bias + n));
        vf_mask_store(yrow + n, k, out);
    }
}

/* One register tile: y[m0 + r, n0 .. n0 + 31] for r < MT, from the quantized rows (row m's digit d at
 * u + (m D + d) ldq; scales xs) and one packed block wb [K4, 32, 4]. D (1 or 2) and MT (1 .. MT_MAX(D)) must be
 * compile-time constants at every call site: inlined, the row loops unroll and the MT * D * NV accumulators stay in
 * registers.
 * Prefetch only (no effect on the results): each k4 step pulls its 2 lines PF steps ahead into L1; if `far` is
 * set, PF_FAR steps ahead into L2 too; if `pf` is set, one line of the next block's slice into L2 every
 * 2^32 / pf_inc steps (32.32 fixed point), spread over the whole k loop. */
ALWAYS_INLINE void tile(const int D, const int MT, const uint8_t *u, int64_t ldq, const float *xs, int64_t m0,
                        const int8_t *wb, int64_t K4, float *y, int64_t ldy, int64_t n0, int64_t N,
                        const float *wscale, const int32_t *colsum, const float *bias, const char *pf,
                        uint64_t pf_inc, int far) {
    const char *wbytes = (const char *)wb;
    vi acc[8][NV];                                           /* row r's digit d at [r * D + d]: MT * D <= 8 */
    uint64_t pf_at = 0;
    for (int i = 0; i < MT * D; ++i)
        for (int v = 0; v < NV; ++v) acc[i][v] = vi_zero();
    for (int64_t k4 = 0; k4 < K4; ++k4) {
        const char *at = wbytes + k4 * STEP;
        if (pf) { _mm_prefetch(pf + ((pf_at >> 32) << 6), _MM_HINT_T1); pf_at += pf_inc; }
        _mm_prefetch(at + PF * STEP, _MM_HINT_T0);
        _mm_prefetch(at + PF * STEP + 64, _MM_HINT_T0);
        if (far) {
            _mm_prefetch(at + PF_FAR * STEP, _MM_HINT_T1);
            _mm_prefetch(at + PF_FAR * STEP + 64, _MM_HINT_T1);
        }
        vi xb[8];                                            /* the digit rows' 4 bytes, broadcast */
#pragma GCC unroll 8
        for (int i = 0; i < MT * D; ++i) {
            int32_t four;
            memcpy(&four, u + (m0 * D + i) * ldq + 4 * k4, sizeof four);
            xb[i] = vi_set1(four);
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            vi wv = vi_load(at + v * VW * 4);
#pragma GCC unroll 8
            for (int i = 0; i < MT * D; ++i) acc[i][v] = vi_dpbusd(acc[i][v], xb[i], wv);
        }
    }
    for (int r = 0; r < MT; ++r)
        store_row(D, y + (m0 + r) * ldy, n0, N, acc + r * D, xs[m0 + r], wscale, colsum, bias);
}

/* tile() for a run-time digit count and height (1 .. MT_MAX(digits)): one specialised copy each, out of line. */
static void tile_any(int digits, int mt, const uint8_t *u, int64_t ldq, const float *xs, int64_t m0,
                     const int8_t *wb, int64_t K4, float *y, int64_t ldy, int64_t n0, int64_t N, const float *wscale,
                     const int32_t *colsum, const float *bias, const char *pf, uint64_t pf_inc, int far) {
/* heights below MT_MAX(D) each get their copy; MT_MAX(D) (and, never reached, the heights past it) the default */
#define TILE_CASE(D, h) case h: if (h < MT_MAX(D)) { tile(D, h < MT_MAX(D) ? h : 1, u, ldq, xs, m0, wb, K4, y, ldy, \
                                  n0, N, wscale, colsum, bias, pf, pf_inc, far); break; } __attribute__((fallthrough));
    if (digits == 1) {
        switch (mt) {
        TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3) TILE_CASE(1, 4) TILE_CASE(1, 5) TILE_CASE(1, 6) TILE_CASE(1, 7)
        default: tile(1, MT_MAX(1), u, ldq, xs, m0, wb, K4, y, ldy, n0, N, wscale, colsum, bias, pf, pf_inc, far);
        }
    } else {
        switch (mt) {
        TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3)
        default: tile(2, MT_MAX(2), u, ldq, xs, m0, wb, K4, y, ldy, n0, N, wscale, colsum, bias, pf, pf_inc, far);
        }
    }
#undef TILE_CASE
}
_Static_assert(MT_MAX(1) <= 8 && MT_MAX(2) <= 4, "tile_any() dispatches heights 1 .. 8 (D = 1) and 1 .. 4 (D = 2)");

/* Block b (outputs 32 b .. 32 b + 31) for all M rows, in tiles of MT_MAX(digits) rows (the last one shorter). With
 * more than one tile and `next` set (this thread takes block b + 1 next), tile t also prefetches lines
 * [t * per_tile, (t + 1) * per_tile) of block b + 1 into L2: memory and arithmetic overlap, as in gemm.c. */
static void block(int64_t b, int next, const uint8_t *u, int64_t ldq, int digits, const float *xs, int64_t M,
                  int64_t K4, const int8_t *w, int64_t N, const float *wscale, const int32_t *colsum,
                  const float *bias, float *y, int64_t ldy) {
    const int64_t mt_max = MT_MAX(digits), block_bytes = K4 * STEP, ntiles = (M + mt_max - 1) / mt_max;
    const int64_t lines = block_bytes / 64, per_tile = (lines + ntiles - 1) / ntiles;
    const int8_t *wb = w + b * block_bytes;
    next = next && ntiles > 1;
    for (int64_t t = 0; t < ntiles; ++t) {
        int64_t m0 = t * mt_max, first = t * per_tile;
        int mt = (int)(M - m0 < mt_max ? M - m0 : mt_max);
        int64_t count = lines - first < per_tile ? lines - first : per_tile;
        const char *pf = next && count > 0 ? (const char *)wb + block_bytes + first * 64 : NULL;
        uint64_t inc = pf ? ((uint64_t)count << 32) / (uint64_t)K4 : 0;
        tile_any(digits, mt, u, ldq, xs, m0, wb, K4, y, ldy, b * NB, N, wscale, colsum, bias, pf, inc, ntiles == 1);
    }
}

/* Every thread of the caller's OpenMP team: the blocks of one product of the quantized rows (u, xs:
 * specgram_quantize_rows, done before any thread gets here) by w; ranges: nthreads ranges deal_init'ed for its
 * blocks. No closing barrier. */
void specgram_team_i8a8(const uint8_t *u, const float *xs, int64_t M, int64_t K, const int8_t *w, const float *wscale,
                        const int32_t *colsum, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                        deal_range *ranges, int nthreads) {
    const int64_t K4 = (K + 3) / 4, ldq = specgram_i8a8_ldq(K);
#define I8A8_BLOCK(b, more) block(b, more, u, ldq, digits, xs, M, K4, w, N, wscale, colsum, bias, y, ldy)
    DEAL_BLOCKS(ranges, nthreads, I8A8_BLOCK);
#undef I8A8_BLOCK
}

/* Entry point: x [M, K] (row stride ldx), w packed [ceil(N / 32), ceil(K / 4), 32, 4] int8, wscale [N] fp32,
 * colsum [N] int32, digits 1 or 2 (the activations' base-256 digits), bias [N] or NULL, y [M, ldy]. Scratch (the
 * calling thread's SCRATCH_PLAN buffer, read by every thread of the region): the digit rows u [M * digits, ldq]
 * bytes, xs [M] floats, then the nthreads ranges of the deal. */
void specgram_gemm_i8a8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *wscale,
                        const int32_t *colsum, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                        int nthreads) {
    assert(M >= 0 && K >= 0 && N >= 0 && nthreads >= 1 && (digits == 1 || digits == 2));
    assert(ldx >= K && ldy >= N && K <= KMAX && N <= (int64_t)UINT32_MAX * NB);
    assert(wscale != NULL && colsum != NULL);
    if (M == 0 || N == 0) return;
    const int64_t ldq = specgram_i8a8_ldq(K), nblocks = (N + NB - 1) / NB, rows = M * digits;
    size_t bytes = (size_t)(rows * ldq) + sizeof(float) * (size_t)M + sizeof(deal_range) * (size_t)(nthreads + 1);
    uint8_t *u = specgram_scratch(SCRATCH_PLAN, bytes);
    float *xs = (float *)(u + rows * ldq);               /* ldq is a multiple of 64: aligned */
    deal_range *ranges = (deal_range *)(((uintptr_t)(xs + M) + 63) & ~(uintptr_t)63);
    specgram_quantize_rows(x, 0, M, K, ldx, digits, u, xs);
    deal_init(ranges, nblocks, nthreads);
#pragma omp parallel num_threads(nthreads)
    specgram_team_i8a8(u, xs, M, K, w, wscale, colsum, digits, N, bias, y, ldy, ranges, nthreads);
}
VNNI_END
#else
void specgram_gemm_i8a8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *wscale,
                        const int32_t *colsum, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                        int nthreads) {
    (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)wscale, (void)colsum, (void)digits, (void)N, (void)bias,
        (void)y, (void)ldy, (void)nthreads;
    abort();                                             /* never called: specgram_i8a8_built() is 0 */
}

void specgram_team_i8a8(const uint8_t *u, const float *xs, int64_t M, int64_t K, const int8_t *w, const float *wscale,
                        const int32_t *colsum, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                        deal_range *ranges, int nthreads) {
    (void)u, (void)xs, (void)M, (void)K, (void)w, (void)wscale, (void)colsum, (void)digits, (void)N, (void)bias,
        (void)y, (void)ldy, (void)ranges, (void)nthreads;
    abort();                                             /* never called: specgram_i8a8_built() is 0 */
}
#endif
