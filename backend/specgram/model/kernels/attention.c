/* Causal attention of one decoder layer for N new tokens of any rows (no padding: a row is simply the tokens
 * that share a slot), reading the KV cache in place (rope.c has written the new tokens' K and V first).
 *
 *   q     [N, H * D] fp32             the rotated queries
 *   kc [S, Hkv, D, P]                 this layer's K cache, positions last (VW positions per vector load),
 *                                     float32 or (kv_bf16) bfloat16, widened exactly as it is read
 *   vc [S, Hkv, P, D]                 this layer's V cache, the same type
 *   slots, positions [N] int64        token n is at position positions[n] in [0, P) of slot slots[n] in [0, S)
 *   out   [N, H * D] fp32             attention output
 *
 * All N tokens are written to the cache before any attends, so a token sees the earlier new tokens of its own
 * row. Token n attends to positions j <= positions[n] of its slot (and j > positions[n] - window when
 * window > 0): it reads only its own slot below its own position, and its result depends on nothing else in
 * the batch, which makes it batch- and draft-width-invariant by construction.
 *
 * Tokens of one row are consecutive in the batch, in consecutive positions of their slot (the grouping below
 * relies on it). Nothing here checks ranges in a normal build (the Python caller does, once per forward); a
 * debug build (-DSPECGRAM_DEBUG, without NDEBUG) asserts them.
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "scratch.h"
#include "specgram.h"
#include "team.h"
#include "tree.h"
#include "vexp.h"

/* Query vectors per register pass (GMAX: one score vector each, + a K load and a broadcast) and the most that
 * take two output vectors each in the weighted sum (VALUES_WIDE: 2 x 12 + 3 of AVX-512's 32 registers, 2 x 6
 * + 3 of AVX2's 16). AVX-512's 16 = a verify row of 5 tokens (k = 4) x 3 heads per KV head in one pass. */
#if VREGS == 32
#define GMAX 16
#define VALUES_WIDE 12
#else
#define GMAX 12
#define VALUES_WIDE 6
#endif
#ifndef KPF
#define KPF 32   /* K prefetch distance in positions: K is read as D strided streams (one per dimension), more
                    than the hardware prefetcher follows */
#endif

/* The per-head accumulators are named variables, not arrays: GCC keeps arrays of vectors on the stack and
 * stores them every iteration. Unused ones (g >= GN, a compile-time constant) are optimized away. */
#define FOR_HEADS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

/* The cache's element types: float32, or bfloat16 widened exactly on load (kv_bf16). T below is f32 or bf16. */
typedef float kv_f32;
typedef uint16_t kv_bf16;
#define KV_LOAD_f32(k, p) vf_maskz_load(k, p)
#define KV_LOAD_bf16(k, p) vf_maskz_load_bf16(k, p)
#define LINE(T) ((int64_t)(64 / sizeof(kv_##T)))   /* elements per 64-byte line */

/* scores p[g, j] = scale * q_g . K[:, lo + j] for GN heads, j < len: VW positions per vector, summed over d
 * in order. Meanwhile the V rows of the same VW positions (VW * D elements) are pulled into L2, one 64-byte line
 * per d step, so that the weighted sum that follows reads them from cache. */
#define S_DECL(g) vf s##g = vf_zero();
#define S_FMA(g) if (gn > g) s##g = vf_fma(vf_set1(qg[g * D + d]), kv, s##g);
#define S_STORE(g) if (gn > g) vf_mask_store(p + g * len + j0, k, vf_mul(s##g, vscale));
#define DEFINE_SCORES(GN, T)                                                                                 \
    static void scores_##GN##_##T(const float *qg, const void *Kt_, int64_t P, int64_t lo, int64_t len,      \
                                  int64_t D, float scale, float *p, const void *V_) {                        \
        enum { gn = GN };                                                                                    \
        const kv_##T *Kt = Kt_, *V = V_;                                                                     \
        vf vscale = vf_set1(scale);                                                                          \
        for (int64_t j0 = 0; j0 < len; j0 += VW) {                                                           \
            vmask k = vmask_first(len - j0);                                                                 \
            FOR_HEADS(S_DECL)                                                                                \
            for (int64_t d = 0; d < D; ++d) {                                                                \
                _mm_prefetch((const char *)(Kt + d * P + lo + j0 + KPF), _MM_HINT_T0);                       \
                if (V && d * LINE(T) < VW * D)                                                               \
                    _mm_prefetch((const char *)(V + j0 * D + d * LINE(T)), _MM_HINT_T1);                     \
                vf kv = KV_LOAD_##T(k, Kt + d * P + lo + j0);                                                \
                FOR_HEADS(S_FMA)                                                                             \
            }                                                                                                \
            FOR_HEADS(S_STORE)                                                                               \
        }                                                                                                    \
    }

/* The next task's K (D rows of `per_d` lines, `row` bytes apart) pulled into L2 while this task computes its
 * weighted sum, which reads only cached data: the memory bus would idle there, and the next scores pass would
 * wait on memory. Two lines per step at most, spread over the whole values pass (`at` in 32.32 fixed point). */
typedef struct {
    const char *k;
    int64_t row, per_d, lines;
    uint64_t at, inc;
} next_k;

static inline void next_k_step(next_k *f) {
    int64_t i = (int64_t)(f->at >> 32);
    if (i < f->lines) _mm_prefetch(f->k + (i / f->per_d) * f->row + (i % f->per_d) * 64, _MM_HINT_T1);
    f->at += f->inc;
}

/* o[g, d0 : d0 + W] = sum_j p[g, j] V[lo + j, d0 : d0 + W] for GN heads, over j in order: W = 2 VW (two
 * vectors per head, 2 GN independent accumulator chains) for GN <= VALUES_WIDE, W = VW (one vector per head)
 * above, where two would not fit in the registers. Either way each output element is the same fma chain. */
#define V_DECL(g) vf a##g = vf_zero(), b##g = vf_zero();
#define V_FMA(g) if (gn > g) { vf w = vf_set1(p[g * len + j]);                                                \
                              a##g = vf_fma(w, v0, a##g); if (two) b##g = vf_fma(w, v1, b##g); }
#define V_STORE(g) if (gn > g) { vf_mask_store(o + g * D + d0, k0, a##g);                                     \
                                if (two) vf_mask_store(o + g * D + d0 + VW, k1, b##g); }
#define DEFINE_VALUES(GN, T)                                                                                 \
    static void values_##GN##_##T(const float *p, int64_t len, const void *V_, int64_t D, int64_t d0, float *o, \
                                  next_k *f) {                                                               \
        enum { gn = GN, two = GN <= VALUES_WIDE };                                                           \
        const kv_##T *V = V_;                                                                                \
        vmask k0 = vmask_first(D - d0), k1 = vmask_first(D - d0 - VW);                                       \
        FOR_HEADS(V_DECL)                                                                                    \
        for (int64_t j = 0; j < len; ++j) {                                                                  \
            vf v0 = KV_LOAD_##T(k0, V + j * D + d0), v1 = v0;                                                \
            if (two) v1 = KV_LOAD_##T(k1, V + j * D + d0 + VW);                                              \
            if (f->k) { next_k_step(f); next_k_step(f); }                                                    \
            FOR_HEADS(V_FMA)                                                                                 \
        }                                                                                                    \
        FOR_HEADS(V_STORE)                                                                                   \
    }

#define DEFINE_PASS(GN) DEFINE_SCORES(GN, f32) DEFINE_VALUES(GN, f32) DEFINE_SCORES(GN, bf16) DEFINE_VALUES(GN, bf16)
DEFINE_PASS(1) DEFINE_PASS(2) DEFINE_PASS(3) DEFINE_PASS(4) DEFINE_PASS(5) DEFINE_PASS(6)
DEFINE_PASS(7) DEFINE_PASS(8) DEFINE_PASS(9) DEFINE_PASS(10) DEFINE_PASS(11) DEFINE_PASS(12)
#if GMAX > 12
DEFINE_PASS(13) DEFINE_PASS(14) DEFINE_PASS(15) DEFINE_PASS(16)
#define PASSES_PAST_12(kind, T) , kind##_13_##T, kind##_14_##T, kind##_15_##T, kind##_16_##T
#else
#define PASSES_PAST_12(kind, T)
#endif
_Static_assert(GMAX == 12 || GMAX == 16, "the pass tables below list 12 or 16 heights");

typedef void (*scores_fn)(const float *, const void *, int64_t, int64_t, int64_t, int64_t, float, float *,
                          const void *);
typedef void (*values_fn)(const float *, int64_t, const void *, int64_t, int64_t, float *, next_k *);
#define PASSES(kind, T) {0, kind##_1_##T, kind##_2_##T, kind##_3_##T, kind##_4_##T, kind##_5_##T, kind##_6_##T,    \
                         kind##_7_##T, kind##_8_##T, kind##_9_##T, kind##_10_##T, kind##_11_##T, kind##_12_##T     \
                         PASSES_PAST_12(kind, T)}
static const scores_fn SCORES[2][GMAX + 1] = {PASSES(scores, f32), PASSES(scores, bf16)};   /* [kv_bf16][gn] */
static const values_fn VALUES[2][GMAX + 1] = {PASSES(values, f32), PASSES(values, bf16)};

/* Query vectors in passes of at most GMAX; every vector's result is computed by the same instruction sequence
 * (each score and each output element is its own chain of fmas in a fixed order), whichever vectors share
 * the pass. */
static void scores(const float *qg, int64_t G, const void *Kt, int bf16, int64_t P, int64_t lo, int64_t len,
                   int64_t D, float scale, float *p, const void *V) {
    for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
        int64_t gn = G - g0 < GMAX ? G - g0 : GMAX;
        SCORES[bf16][gn](qg + g0 * D, Kt, P, lo, len, D, scale, p + g0 * len, g0 == 0 ? V : NULL);
    }
}

static void weighted_values(const float *p, int64_t G, int64_t len, const void *V, int bf16, int64_t D, float *o,
                            next_k *f) {
    int64_t steps = 0;                                             /* j steps of the whole pass */
    for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
        int64_t step = G - g0 > VALUES_WIDE ? VW : 2 * VW;
        steps += len * ((D + step - 1) / step);
    }
    if (f->k) f->inc = ((uint64_t)f->lines << 32) / (uint64_t)(2 * steps) + 1;
    for (int64_t g0 = 0; g0 < G; g0 += GMAX) {
        int64_t gn = G - g0 < GMAX ? G - g0 : GMAX, step = gn > VALUES_WIDE ? VW : 2 * VW;
        for (int64_t d0 = 0; d0 < D; d0 += step)
            VALUES[bf16][gn](p + g0 * len, len, V, D, d0, o + g0 * D, f);
    }
}

/* p[:len] <- softmax(p[:len]): the max and the sum lane-parallel over VW-position blocks (a block's tail lanes
 * masked off), then a fixed tree over the lanes. */
static void softmax_row(float *p, int64_t len) {
    vf vm = vf_set1(-INFINITY), vsum = vf_zero();
    int64_t full = len - len % VW;
    for (int64_t j = 0; j < full; j += VW) vm = vf_max(vm, vf_load(p + j));
    if (full < len) {
        vmask k = vmask_first(len - full);
        vm = vf_mask_max(vm, k, vf_maskz_load(k, p + full));
    }
    vm = vf_set1(vf_reduce_max(vm));
    for (int64_t j = 0; j < full; j += VW) {
        vf e = vf_exp(vf_sub(vf_load(p + j), vm));
        vf_store(p + j, e);
        vsum = vf_add(vsum, e);
    }
    if (full < len) {
        vmask k = vmask_first(len - full);
        vf e = vf_maskz(k, vf_exp(vf_sub(vf_maskz_load(k, p + full), vm)));
        vf_mask_store(p + full, k, e);
        vsum = vf_add(vsum, e);
    }
    vf inv = vf_set1(1.0f / vf_reduce_add(vsum));
    for (int64_t j = 0; j < full; j += VW) vf_store(p + j, vf_mul(vf_load(p + j), inv));
    if (full < len) {
        vmask k = vmask_first(len - full);
        vf_mask_store(p + full, k, vf_mul(vf_maskz_load(k, p + full), inv));
    }
}

/* The first position a token at `pos` attends to (window > 0: a sliding window of that many positions). */
static inline int64_t window_lo(int64_t pos, int64_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* The first position any of tokens n0 .. n0+T-1 attends to: the start of the range their scores share. */
static int64_t group_lo(const int64_t *positions, const uint64_t *tree, int64_t n0, int64_t T, int64_t window) {
    int64_t lo = window_lo(positions[n0], window);
    for (int64_t t = 0; tree && t < T; ++t) {
        int64_t first = tree_first(tree[n0 + t], positions[n0 + t], window);
        lo = first < lo ? first : lo;
    }
    return lo;
}

/* A tree token's scores (a row pg of the shared range [lo, lo + len)) -> its softmax over the positions it attends
 * (tree.h), 0 elsewhere. The attended scores are packed first, so the softmax sees them in the lanes and order it
 * would for the token's own path verified as a plain row: the token's result is bitwise that row's. */
static void tree_softmax(float *pg, int64_t lo, int64_t len, int64_t pos, uint64_t m, int64_t window, float *packed) {
    int64_t from = tree_first(m, pos, window), n = 0;
    for (int64_t j = from; j <= pos; ++j)
        if (pos - j > 63 || m >> (pos - j) & 1) packed[n++] = pg[j - lo];
    softmax_row(packed, n);
    memset(pg, 0, sizeof(float) * (size_t)len);
    for (int64_t j = from, i = 0; j <= pos; ++j)
        if (pos - j > 63 || m >> (pos - j) & 1) pg[j - lo] = packed[i++];
}

/* Consecutive tokens n0 .. n0+T-1 of one row (one slot, consecutive positions) and one KV head: their
 * T * G query vectors (G = H / Hkv heads each) share every K and V vector loaded, so a verify row's k + 1
 * tokens cost little more than one. Each token still gets exactly what it would alone: its scores are the
 * same dot products, its softmax runs over its own range [lo_t, pos_t] (a row of p starting there, so the
 * vector lanes line up as they would alone), and the weighted sum runs over the shared range with p = 0
 * outside its own - fma(0, v, acc) leaves acc unchanged (v is finite: positions the row has written). */
static void attend(const float *q, const void *kc, const void *vc, int bf16, const int64_t *slots,
                   const int64_t *positions, const uint64_t *tree, int64_t n0, int64_t T, int64_t hk, int64_t H,
                   int64_t Hkv, int64_t D, int64_t P, int64_t window, float scale, float *out, next_k *f) {
    int64_t G = H / Hkv, head = slots[n0] * Hkv + hk, Q = T * G;
    int64_t first = positions[n0], last = positions[n0 + T - 1];
    int64_t lo = group_lo(positions, tree, n0, T, window), len = last + 1 - lo;  /* the shared range [lo, last] */
    assert(T >= 1 && last == first + T - 1 && lo >= 0 && last < P);
    float *qb = specgram_scratch(SCRATCH_TASK, sizeof(float) * (size_t)(Q * D * 2 + Q * len + len));
    float *ob = qb + Q * D, *p = ob + Q * D;                      /* queries, outputs [Q, D]; scores [Q, len] */
    float *packed = p + Q * len;                                  /* a tree token's attended scores [len] */
    for (int64_t t = 0; t < T; ++t)
        memcpy(qb + t * G * D, q + ((n0 + t) * H + hk * G) * D, sizeof(float) * G * D);
    const int64_t esz = bf16 ? 2 : 4;                             /* bytes per cache element */
    const char *V = (const char *)vc + (head * P + lo) * D * esz;  /* [len, D] */
    scores(qb, Q, (const char *)kc + head * D * P * esz, bf16, P, lo, len, D, scale, p, V);
    for (int64_t t = 0; t < T; ++t) {
        int64_t pos = positions[n0 + t];
        uint64_t m = tree ? tree[n0 + t] : TREE_ALL;
        if (!tree_causal(m, pos)) {
            for (int64_t g = 0; g < G; ++g) tree_softmax(p + (t * G + g) * len, lo, len, pos, m, window, packed);
            continue;
        }
        int64_t own_lo = window_lo(pos, window);
        int64_t off = own_lo - lo, own = pos + 1 - own_lo;        /* this token's range within the shared one */
        assert(slots[n0 + t] == slots[n0] && pos == first + t && off >= 0 && own >= 1 && off + own <= len);
        for (int64_t g = 0; g < G; ++g) {
            float *pg = p + (t * G + g) * len;
            softmax_row(pg + off, own);
            memset(pg, 0, sizeof(float) * off);
            memset(pg + off + own, 0, sizeof(float) * (len - off - own));
        }
    }
    weighted_values(p, Q, len, V, bf16, D, ob, f);
    for (int64_t t = 0; t < T; ++t)
        memcpy(out + ((n0 + t) * H + hk * G) * D, ob + t * G * D, sizeof(float) * G * D);
}

/* Tasks: one task = one KV head of a group of consecutive tokens of one row (a slot's tokens: a verify row's
 * k + 1, or a prompt chunk), attended together (sharing every K and V load). Each token's result is bitwise
 * the same whatever its group and thread (see attend()). Measured against one task per row and KV head in
 * groups of 4 (30 layers, 300 cached positions, weights streamed between layers): a 5-token verify row
 * 2.0 -> 1.5 ms, 8 such rows 8.5 -> 7.8 ms, 8 decode rows 5.4 -> 5.0 ms, a 219-token prompt 17 -> 15 ms. */
size_t specgram_attention_plan_bytes(int64_t N, int64_t Hkv) { return sizeof(int64_t) * (size_t)(N + 1 + 3 * N * Hkv); }

attention_plan specgram_attention_plan(void *mem, const int64_t *slots, const int64_t *positions, int64_t N,
                                       int64_t H, int64_t Hkv, int64_t window, int nthreads) {
    /* Group sizes: a row whose query vectors fit one pass (a verify row: k + 1 tokens x G heads <= GMAX) is one
     * group; longer rows (prompt chunks) go in groups of VALUES_WIDE / G tokens, the most that the 32-lane
     * weighted sum takes. Fewer than two tasks per thread (a single short row): sizes halved until there are
     * enough or groups are single tokens, to keep both cores busy.
     * mem: group_n0 [groups + 1] (first token of each group, then N), then task_g, task_h, task_cost
     * [groups * Hkv] each; groups <= N. */
    attention_plan a = {.group_n0 = mem};
    int64_t *group_n0 = a.group_n0, G = H / Hkv, groups = 0, tasks = 0;
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
     * up the call, where the GEMM's dealt ranges would not; attention is a small share of a forward.) */
    a.task_g = group_n0 + groups + 1, a.task_h = a.task_g + groups * Hkv, a.task_cost = a.task_h + groups * Hkv;
    int64_t total = 0;
    for (int64_t g0 = 0, g1; g0 < groups; g0 = g1) {               /* g0 .. g1 - 1: the groups of one row */
        for (g1 = g0 + 1; g1 < groups && slots[group_n0[g1]] == slots[group_n0[g0]]; ++g1) {}
        for (int64_t hk = 0; hk < Hkv; ++hk)
            for (int64_t g = g0; g < g1; ++g) {
                int64_t lo = group_n0[g], hi = group_n0[g + 1] - 1;
                a.task_g[tasks] = g, a.task_h[tasks] = hk;
                a.task_cost[tasks++] = (hi + 1 - lo) * (positions[hi] + 1 - window_lo(positions[lo], window));
                total += a.task_cost[tasks - 1];
            }
    }
    a.tasks = tasks, a.total = total;
    return a;
}

void specgram_team_attention(const attention_plan *a, const float *q, const void *kc, const void *vc, int kv_bf16,
                             const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t H,
                             int64_t Hkv, int64_t D, int64_t P, int64_t window, float scale, float *out) {
    const int64_t tasks = a->tasks, *group_n0 = a->group_n0, *task_g = a->task_g, *task_h = a->task_h;
    int64_t nt = omp_get_num_threads(), id = omp_get_thread_num(), begin = tasks, end = tasks;
    for (int64_t t = 0, before = 0; t < tasks; before += a->task_cost[t++]) {   /* owner: its cost's midpoint */
        int64_t owner = (int64_t)((double)nt * (before + a->task_cost[t] / 2.0) / (double)a->total);
        if (owner >= id && begin == tasks) begin = t;
        if (owner > id) { end = t; break; }
    }
    for (int64_t t = begin; t < end; ++t) {
        int64_t g = task_g[t], n0 = group_n0[g], T = group_n0[g + 1] - n0;
        next_k f = {0};                                            /* the thread's next task's K, prefetched */
        if (t + 1 < end) {
            int64_t g1 = task_g[t + 1], lo_n = group_n0[g1], hi_n = group_n0[g1 + 1] - 1;
            int64_t esz = kv_bf16 ? 2 : 4, line = 64 / esz;           /* elements per line */
            int64_t lo = window_lo(positions[lo_n], window) / line * line;    /* from its first line */
            f.k = (const char *)kc + ((slots[lo_n] * Hkv + task_h[t + 1]) * D * P + lo) * esz;
            f.row = P * esz;
            f.per_d = (positions[hi_n] + 1 - lo + line - 1) / line;
            f.lines = f.per_d * D;
        }
        attend(q, kc, vc, kv_bf16, slots, positions, tree, n0, T, task_h[t], H, Hkv, D, P, window, scale, out,
               &f);
    }
}

void specgram_attention(const float *q, const void *kc, const void *vc, int kv_bf16, const int64_t *slots,
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
    void *mem = specgram_scratch(SCRATCH_PLAN, specgram_attention_plan_bytes(N, Hkv));
    attention_plan a = specgram_attention_plan(mem, slots, positions, N, H, Hkv, window, nthreads);
#pragma omp parallel num_threads(nthreads)
    specgram_team_attention(&a, q, kc, vc, kv_bf16, slots, positions, NULL, H, Hkv, D, P, window, scale, out);
}
