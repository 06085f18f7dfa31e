/* Rotary embedding, KV-cache write and causal attention of one decoder layer for N new tokens of any rows
 * (no padding: a row is simply the tokens that share a slot), reading the cache in place.
 *
 *   qkv   [N, (H + 2*Hkv) * D] fp32   the fused projection output; q | k | v per token, heads contiguous
 *   cos, sin [N, D] fp32              rotary tables at each token's position (transformers' rotary_emb)
 *   kc [S, Hkv, D, P] fp32            this layer's K cache, positions last (16 positions per vector load)
 *   vc [S, Hkv, P, D] fp32            this layer's V cache
 *   slots, positions [N] int64        token n goes to slot slots[n] in [0, S) at position positions[n] in [0, P)
 *   out   [N, H * D] fp32             attention output
 *
 * All N tokens are written to the cache before any attends (specgram_rope_cache_write, then
 * specgram_attention), so a token sees the earlier new tokens of its own row. Token n attends to positions
 * j <= positions[n] of its slot (and j > positions[n] - window when window > 0): it reads only its own slot
 * below its own position, and its result depends on nothing else in the batch, which makes it batch- and
 * draft-width-invariant by construction. Rotary follows transformers' apply_rotary_pos_emb,
 * x*cos + rotate_half(x)*sin, rounded the same way (compiled without contraction: multiply, multiply, add).
 *
 * Tokens of one row are consecutive in the batch, in consecutive positions of their slot (the grouping below
 * relies on it). Nothing here checks ranges in a normal build (the Python caller does, once per forward); a
 * debug build (-DSPECGRAM_DEBUG, without NDEBUG) asserts them.
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vexp.h"

/* Per-thread scratch, grown on demand (doubling) and reused across calls, freed when its thread exits. The
 * OpenMP pool threads persist, so once the largest shape has run, attention allocates nothing. Two buffers
 * per thread, because the calling thread is also one of the workers: SCRATCH_PLAN (specgram_attention's
 * groups and tasks, taken on the calling thread before the parallel region) and SCRATCH_TASK (attend()'s
 * queries, outputs and scores, taken inside it). Size: Q * (2 D + len) floats for the largest task. */
enum { SCRATCH_PLAN, SCRATCH_TASK, SCRATCH_KINDS };
typedef struct {
    void *p[SCRATCH_KINDS];
    size_t cap[SCRATCH_KINDS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg) {
    scratch_set *s = arg;
    for (int i = 0; i < SCRATCH_KINDS; ++i) free(s->p[i]);
    free(s);
}

static void scratch_init(void) {
    if (pthread_key_create(&scratch_key, scratch_free) != 0) {
        fprintf(stderr, "specgram attention: pthread_key_create failed\n");
        abort();
    }
}

static void out_of_memory(size_t bytes) {
    fprintf(stderr, "specgram attention: out of memory (%zu bytes of scratch)\n", bytes);
    abort();
}

/* -> this thread's buffer `kind`, at least `bytes` long; contents undefined. */
static void *scratch(int kind, size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    scratch_set *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        if ((s = calloc(1, sizeof *s)) == NULL) out_of_memory(sizeof *s);
        pthread_setspecific(scratch_key, s);
    }
    if (s->cap[kind] < bytes) {
        size_t cap = s->cap[kind] ? s->cap[kind] : 4096;
        while (cap < bytes) cap *= 2;
        free(s->p[kind]);
        if ((s->p[kind] = malloc(cap)) == NULL) out_of_memory(cap);
        s->cap[kind] = cap;
    }
    return s->p[kind];
}

/* y[j * ystride] = rotary(x)[j] for j < D (D even): the second half rotated into the first with a minus sign.
 * ystride 1 for a query head; P for a K head, written straight into the positions-last cache. */
static inline void rope(const float *x, const float *c, const float *s, float *y, int64_t ystride, int64_t D) {
    int64_t h = D / 2;
    for (int64_t j = 0; j < h; ++j) y[j * ystride] = x[j] * c[j] + (-x[j + h]) * s[j];
    for (int64_t j = h; j < D; ++j) y[j * ystride] = x[j] * c[j] + x[j - h] * s[j];
}

void specgram_rope_cache_write(const float *qkv, const float *cos, const float *sin, float *kc, float *vc,
                               const int64_t *slots, const int64_t *positions, int64_t N, int64_t S, int64_t H,
                               int64_t Hkv, int64_t D, int64_t P, float *q_out, int nthreads) {
    assert(D % 2 == 0 && H >= 1 && Hkv >= 1 && nthreads >= 1);
    (void)S;                                                       /* read by the debug build's asserts only */
    int64_t width = (H + 2 * Hkv) * D;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; ++n) {
        assert(slots[n] >= 0 && slots[n] < S);
        assert(positions[n] >= 0 && positions[n] < P);
        const float *row = qkv + n * width, *c = cos + n * D, *s = sin + n * D;
        for (int64_t h = 0; h < H; ++h) rope(row + h * D, c, s, q_out + (n * H + h) * D, 1, D);
        for (int64_t h = 0; h < Hkv; ++h) {
            int64_t head = slots[n] * Hkv + h;
            rope(row + (H + h) * D, c, s, kc + head * D * P + positions[n], P, D);
            const float *v = row + (H + Hkv + h) * D;
            float *vd = vc + (head * P + positions[n]) * D;
            for (int64_t j = 0; j < D; ++j) vd[j] = v[j];
        }
    }
}

#define GMAX 16  /* query vectors per register pass: 16 score vectors (+ 1 load), or 16 output vectors of 16 lanes
                    (12 x 2 of 32 lanes up to VALUES_WIDE = 12 vectors), + loads: at most 27 of the 32 vector
                    registers. 16 = a verify row of 5 tokens (k = 4) x 3 heads per KV head in one pass */
#ifndef KPF
#define KPF 32   /* K prefetch distance in positions: K is read as D strided streams (one per dimension), more
                    than the hardware prefetcher follows */
#endif

/* The per-head accumulators are named variables, not arrays: GCC keeps arrays of vectors on the stack and
 * stores them every iteration. Unused ones (g >= GN, a compile-time constant) are optimized away. */
#define FOR_HEADS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

/* scores p[g, j] = scale * q_g . K[:, lo + j] for GN heads, j < len: 16 positions per vector, summed over d
 * in order. Meanwhile the V rows of the same 16 positions (16 * D floats = D cache lines) are pulled into L2,
 * one line per d step, so that the weighted sum that follows reads them from cache. */
#define S_DECL(g) __m512 s##g = _mm512_setzero_ps();
#define S_FMA(g) if (gn > g) s##g = _mm512_fmadd_ps(_mm512_set1_ps(qg[g * D + d]), kv, s##g);
#define S_STORE(g) if (gn > g) _mm512_mask_storeu_ps(p + g * len + j0, k, _mm512_mul_ps(s##g, vscale));
#define DEFINE_SCORES(GN)                                                                                    \
    static void scores_##GN(const float *qg, const float *Kt, int64_t P, int64_t lo, int64_t len, int64_t D,   \
                            float scale, float *p, const float *V) {                                         \
        enum { gn = GN };                                                                                    \
        __m512 vscale = _mm512_set1_ps(scale);                                                               \
        for (int64_t j0 = 0; j0 < len; j0 += 16) {                                                           \
            __mmask16 k = len - j0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j0)) - 1);          \
            FOR_HEADS(S_DECL)                                                                                \
            for (int64_t d = 0; d < D; ++d) {                                                                \
                _mm_prefetch((const char *)(Kt + d * P + lo + j0 + KPF), _MM_HINT_T0);                       \
                if (V) _mm_prefetch((const char *)(V + j0 * D + d * 16), _MM_HINT_T1);                       \
                __m512 kv = _mm512_maskz_loadu_ps(k, Kt + d * P + lo + j0);                                  \
                FOR_HEADS(S_FMA)                                                                             \
            }                                                                                                \
            FOR_HEADS(S_STORE)                                                                               \
        }                                                                                                    \
    }

/* The next task's K (D rows of `per_d` lines, P floats apart) pulled into L2 while this task computes its
 * weighted sum, which reads only cached data: the memory bus would idle there, and the next scores pass would
 * wait on memory. Two lines per step at most, spread over the whole values pass (`at` in 32.32 fixed point). */
typedef struct {
    const float *k;
    int64_t P, per_d, lines;
    uint64_t at, inc;
} next_k;

static inline void next_k_step(next_k *f) {
    int64_t i = (int64_t)(f->at >> 32);
    if (i < f->lines) _mm_prefetch((const char *)(f->k + (i / f->per_d) * f->P + (i % f->per_d) * 16), _MM_HINT_T1);
    f->at += f->inc;
}

/* o[g, d0 : d0 + W] = sum_j p[g, j] V[lo + j, d0 : d0 + W] for GN heads, over j in order: W = 32 (two vectors
 * per head, 2 GN independent accumulator chains) for GN <= 12, W = 16 (one vector per head) above, where two
 * would not fit in the registers. Either way each output element is the same fma chain. */
#define V_DECL(g) __m512 a##g = _mm512_setzero_ps(), b##g = _mm512_setzero_ps();
#define V_FMA(g) if (gn > g) { __m512 w = _mm512_set1_ps(p[g * len + j]);                                      \
                              a##g = _mm512_fmadd_ps(w, v0, a##g); b##g = _mm512_fmadd_ps(w, v1, b##g); }
#define V_STORE(g) if (gn > g) { _mm512_mask_storeu_ps(o + g * D + d0, k0, a##g);                              \
                                _mm512_mask_storeu_ps(o + g * D + d0 + 16, k1, b##g); }
#define DEFINE_VALUES(GN)                                                                                    \
    static void values_##GN(const float *p, int64_t len, const float *V, int64_t D, int64_t d0, float *o,     \
                            next_k *f) {                                                                     \
        enum { gn = GN };                                                                                    \
        int64_t r0 = D - d0, r1 = D - d0 - 16;                                                               \
        __mmask16 k0 = r0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r0) - 1);                           \
        __mmask16 k1 = r1 >= 16 ? (__mmask16)0xFFFF : r1 > 0 ? (__mmask16)((1u << r1) - 1) : 0;              \
        FOR_HEADS(V_DECL)                                                                                    \
        for (int64_t j = 0; j < len; ++j) {                                                                  \
            __m512 v0 = _mm512_maskz_loadu_ps(k0, V + j * D + d0);                                           \
            __m512 v1 = _mm512_maskz_loadu_ps(k1, V + j * D + d0 + 16);                                      \
            if (f->k) { next_k_step(f); next_k_step(f); }                                                    \
            FOR_HEADS(V_FMA)                                                                                 \
        }                                                                                                    \
        FOR_HEADS(V_STORE)                                                                                   \
    }

#define V16_FMA(g) if (gn > g) a##g = _mm512_fmadd_ps(_mm512_set1_ps(p[g * len + j]), v0, a##g);
#define V16_STORE(g) if (gn > g) _mm512_mask_storeu_ps(o + g * D + d0, k0, a##g);
#define DEFINE_VALUES16(GN)                                                                                  \
    static void values_##GN(const float *p, int64_t len, const float *V, int64_t D, int64_t d0, float *o,     \
                            next_k *f) {                                                                     \
        enum { gn = GN };                                                                                    \
        int64_t r0 = D - d0;                                                                                 \
        __mmask16 k0 = r0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r0) - 1);                           \
        FOR_HEADS(V_DECL)                                                                                    \
        for (int64_t j = 0; j < len; ++j) {                                                                  \
            __m512 v0 = _mm512_maskz_loadu_ps(k0, V + j * D + d0);                                           \
            if (f->k) { next_k_step(f); next_k_step(f); }                                                    \
            FOR_HEADS(V16_FMA)                                                                               \
        }                                                                                                    \
        FOR_HEADS(V16_STORE)                                                                                 \
    }

DEFINE_SCORES(1) DEFINE_SCORES(2) DEFINE_SCORES(3) DEFINE_SCORES(4) DEFINE_SCORES(5) DEFINE_SCORES(6)
DEFINE_SCORES(7) DEFINE_SCORES(8) DEFINE_SCORES(9) DEFINE_SCORES(10) DEFINE_SCORES(11) DEFINE_SCORES(12)
DEFINE_SCORES(13) DEFINE_SCORES(14) DEFINE_SCORES(15) DEFINE_SCORES(16)
DEFINE_VALUES(1) DEFINE_VALUES(2) DEFINE_VALUES(3) DEFINE_VALUES(4) DEFINE_VALUES(5) DEFINE_VALUES(6)
DEFINE_VALUES(7) DEFINE_VALUES(8) DEFINE_VALUES(9) DEFINE_VALUES(10) DEFINE_VALUES(11) DEFINE_VALUES(12)
DEFINE_VALUES16(13) DEFINE_VALUES16(14) DEFINE_VALUES16(15) DEFINE_VALUES16(16)
#define VALUES_WIDE 12   /* the most vectors a 32-lane values pass takes */

typedef void (*scores_fn)(const float *, const float *, int64_t, int64_t, int64_t, int64_t, float, float *,
                          const float *);
typedef void (*values_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, next_k *);
static const scores_fn SCORES[GMAX + 1] = {0, scores_1, scores_2, scores_3, scores_4, scores_5, scores_6,
                                           scores_7, scores_8, scores_9, scores_10, scores_11, scores_12,
                                           scores_13, scores_14, scores_15, scores_16};
static const values_fn VALUES[GMAX + 1] = {0, values_1, values_2, values_3, values_4, values_5, values_6,
                                           values_7, values_8, values_9, values_10, values_11, values_12,
                                           values_13, values_14, values_15, values_16};

/* Query vectors in passes of at most GMAX; every vector's result is computed by the same instruction sequence
 * (each score and each output element is its own chain of fmas in a fixed order), whichever vectors share
 * the pass. */
static void scores(const float *qg, int64_t G, const float *Kt, int64_t P, int64_t lo, int64_t len, int64_t D,
                   float scale, float *p, const float *V) {
    for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
        int64_t gn = G - g0 < GMAX ? G - g0 : GMAX;
        SCORES[gn](qg + g0 * D, Kt, P, lo, len, D, scale, p + g0 * len, g0 == 0 ? V : NULL);
    }
}

static void weighted_values(const float *p, int64_t G, int64_t len, const float *V, int64_t D, float *o,
                            next_k *f) {
    int64_t steps = 0;                                             /* j steps of the whole pass */
    for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
        int64_t step = G - g0 > VALUES_WIDE ? 16 : 32;
        steps += len * ((D + step - 1) / step);
    }
    if (f->k) f->inc = ((uint64_t)f->lines << 32) / (uint64_t)(2 * steps) + 1;
    for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
        int64_t gn = G - g0 < GMAX ? G - g0 : GMAX, step = gn > VALUES_WIDE ? 16 : 32;
        for (int64_t d0 = 0; d0 < D; d0 += step)
            VALUES[gn](p + g0 * len, len, V, D, d0, o + g0 * D, f);
    }
}

/* p[g, :len] <- softmax(p[g, :len]) */
static void softmax_rows(float *p, int64_t G, int64_t len) {
    for (int64_t g = 0; g < G; ++g) {
        float *pg = p + g * len;
        __m512 vm = _mm512_set1_ps(-INFINITY), vsum = _mm512_setzero_ps();
        for (int64_t j = 0; j < len; j += 16) {
            __mmask16 k = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
            vm = _mm512_mask_max_ps(vm, k, vm, _mm512_maskz_loadu_ps(k, pg + j));
        }
        vm = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
        for (int64_t j = 0; j < len; j += 16) {
            __mmask16 k = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
            __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, pg + j), vm)));
            _mm512_mask_storeu_ps(pg + j, k, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
        for (int64_t j = 0; j < len; j += 16) {
            __mmask16 k = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
            _mm512_mask_storeu_ps(pg + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, pg + j), inv));
        }
    }
}

/* The first position a token at `pos` attends to (window > 0: a sliding window of that many positions). */
static inline int64_t window_lo(int64_t pos, int64_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* Consecutive tokens n0 .. n0+T-1 of one row (one slot, consecutive positions) and one KV head: their
 * T * G query vectors (G = H / Hkv heads each) share every K and V vector loaded, so a verify row's k + 1
 * tokens cost little more than one. Each token still gets exactly what it would alone: its scores are the
 * same dot products, its softmax runs over its own range [lo_t, pos_t] (a row of p starting there, so the
 * vector lanes line up as they would alone), and the weighted sum runs over the shared range with p = 0
 * outside its own - fma(0, v, acc) leaves acc unchanged (v is finite: positions the row has written). */
static void attend(const float *q, const float *kc, const float *vc, const int64_t *slots, const int64_t *positions,
                   int64_t n0, int64_t T, int64_t hk, int64_t H, int64_t Hkv, int64_t D, int64_t P, int64_t window,
                   float scale, float *out, next_k *f) {
    int64_t G = H / Hkv, head = slots[n0] * Hkv + hk, Q = T * G;
    int64_t first = positions[n0], last = positions[n0 + T - 1];
    int64_t lo = window_lo(first, window), len = last + 1 - lo;  /* the shared range [lo, last] */
    assert(T >= 1 && last == first + T - 1 && lo >= 0 && last < P);
    float *qb = scratch(SCRATCH_TASK, sizeof(float) * (size_t)(Q * D * 2 + Q * len));
    float *ob = qb + Q * D, *p = ob + Q * D;                      /* queries, outputs [Q, D]; scores [Q, len] */
    for (int64_t t = 0; t < T; ++t)
        memcpy(qb + t * G * D, q + ((n0 + t) * H + hk * G) * D, sizeof(float) * G * D);
    const float *V = vc + (head * P + lo) * D;                    /* [len, D] */
    scores(qb, Q, kc + head * D * P, P, lo, len, D, scale, p, V);
    for (int64_t t = 0; t < T; ++t) {
        int64_t pos = positions[n0 + t];
        int64_t own_lo = window_lo(pos, window);
        int64_t off = own_lo - lo, own = pos + 1 - own_lo;        /* this token's range within the shared one */
        assert(slots[n0 + t] == slots[n0] && pos == first + t && off >= 0 && own >= 1 && off + own <= len);
        for (int64_t g = 0; g < G; ++g) {
            float *pg = p + (t * G + g) * len;
            softmax_rows(pg + off, 1, own);
            memset(pg, 0, sizeof(float) * off);
            memset(pg + off + own, 0, sizeof(float) * (len - off - own));
        }
    }
    weighted_values(p, Q, len, V, D, ob, f);
    for (int64_t t = 0; t < T; ++t)
        memcpy(out + ((n0 + t) * H + hk * G) * D, ob + t * G * D, sizeof(float) * G * D);
}

/* Tasks: one task = one KV head of a group of consecutive tokens of one row (a slot's tokens: a verify row's
 * k + 1, or a prompt chunk), attended together (sharing every K and V load). Each token's result is bitwise
 * the same whatever its group and thread (see attend()). Measured against one task per row and KV head in
 * groups of 4 (30 layers, 300 cached positions, weights streamed between layers): a 5-token verify row
 * 2.0 -> 1.5 ms, 8 such rows 8.5 -> 7.8 ms, 8 decode rows 5.4 -> 5.0 ms, a 219-token prompt 17 -> 15 ms. */
void specgram_attention(const float *q, const float *kc, const float *vc, const int64_t *slots,
                        const int64_t *positions, int64_t N, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                        int64_t P, int64_t window, float scale, float *out, int nthreads) {
    assert(H >= 1 && Hkv >= 1 && H % Hkv == 0 && D >= 1 && window >= 0 && nthreads >= 1);
#ifdef SPECGRAM_DEBUG
    for (int64_t n = 0; n < N; ++n) {
        assert(slots[n] >= 0 && slots[n] < S && positions[n] >= 0 && positions[n] < P);
        assert(n == 0 || slots[n] != slots[n - 1] || positions[n] == positions[n - 1] + 1);
    }
#endif
    (void)S;                                                       /* read by the debug build's asserts only */
    /* Group sizes: a row whose query vectors fit one pass (a verify row: k + 1 tokens x G heads <= GMAX) is one
     * group; longer rows (prompt chunks) go in groups of VALUES_WIDE / G tokens, the most that the 32-lane
     * weighted sum takes. Fewer than two tasks per thread (a single short row): sizes halved until there are
     * enough or groups are single tokens, to keep both cores busy.
     * Scratch: group_n0 [groups + 1] (first token of each group, then N), then task_g, task_h, task_cost
     * [groups * Hkv] each; groups <= N. */
    int64_t *group_n0 = scratch(SCRATCH_PLAN, sizeof(int64_t) * (size_t)(N + 1 + 3 * N * Hkv));
    int64_t G = H / Hkv, groups = 0, tasks = 0;
    for (int64_t split = 1;; split *= 2) {
        int64_t largest = 1;
        groups = 0;
        for (int64_t r0 = 0, r1; r0 < N; r0 = r1) {                /* r0 .. r1 - 1: the tokens of one row */
            for (r1 = r0 + 1; r1 < N && slots[r1] == slots[r0]; ++r1) {}
            int64_t size = (r1 - r0) * G <= GMAX ? r1 - r0 : G <= VALUES_WIDE ? VALUES_WIDE / G : 1;
            size = (size + split - 1) / split;
            largest = size > largest ? size : largest;
            for (int64_t n = r0; n < r1; n += size) group_n0[groups++] = n;
        }
        if (largest == 1 || groups * Hkv >= 2 * nthreads) break;
    }
    group_n0[groups] = N;
    /* Tasks in order row -> KV head -> group, split into one contiguous range per thread of about equal cost
     * (query vectors x positions attended: a prompt chunk's later groups cost more). A thread so walks
     * consecutive groups of one row and head (their K and V already in its cache from the previous group) and
     * knows its next task, whose K it prefetches. (A static split: a thread preempted by another process holds
     * up the call, where the GEMM's dynamic chunks would not; attention is a small share of a forward.) */
    int64_t *task_g = group_n0 + groups + 1, *task_h = task_g + groups * Hkv;
    int64_t *task_cost = task_h + groups * Hkv, total = 0;
    for (int64_t g0 = 0, g1; g0 < groups; g0 = g1) {               /* g0 .. g1 - 1: the groups of one row */
        for (g1 = g0 + 1; g1 < groups && slots[group_n0[g1]] == slots[group_n0[g0]]; ++g1) {}
        for (int64_t hk = 0; hk < Hkv; ++hk)
            for (int64_t g = g0; g < g1; ++g) {
                int64_t a = group_n0[g], b = group_n0[g + 1] - 1;
                task_g[tasks] = g, task_h[tasks] = hk;
                task_cost[tasks++] = (b + 1 - a) * (positions[b] + 1 - window_lo(positions[a], window));
                total += task_cost[tasks - 1];
            }
    }
    _Pragma("omp parallel num_threads(nthreads)")
    {
        int64_t nt = omp_get_num_threads(), id = omp_get_thread_num(), begin = tasks, end = tasks;
        for (int64_t t = 0, before = 0; t < tasks; before += task_cost[t++]) {   /* owner: its cost's midpoint */
            int64_t owner = (int64_t)((double)nt * (before + task_cost[t] / 2.0) / (double)total);
            if (owner >= id && begin == tasks) begin = t;
            if (owner > id) { end = t; break; }
        }
        for (int64_t t = begin; t < end; ++t) {
            int64_t g = task_g[t], n0 = group_n0[g], T = group_n0[g + 1] - n0;
            next_k f = {0};                                        /* the thread's next task's K, prefetched */
            if (t + 1 < end) {
                int64_t g1 = task_g[t + 1], a = group_n0[g1], b = group_n0[g1 + 1] - 1;
                int64_t lo = window_lo(positions[a], window) & ~(int64_t)15;   /* from its first line */
                f.k = kc + (slots[a] * Hkv + task_h[t + 1]) * D * P + lo;
                f.P = P;
                f.per_d = (positions[b] + 1 - lo + 15) / 16;
                f.lines = f.per_d * D;
            }
            attend(q, kc, vc, slots, positions, n0, T, task_h[t], H, Hkv, D, P, window, scale, out, &f);
        }
    }
}
