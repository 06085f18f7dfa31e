/* Rotary embedding, KV-cache write and causal attention of one decoder layer for N new tokens of any rows
 * (no padding: a row is simply the tokens that share a slot), reading the cache in place.
 *
 *   qkv   [N, (H + 2*Hkv) * D] fp32   the fused projection output; q | k | v per token, heads contiguous
 *   cos, sin [N, D] fp32              rotary tables at each token's position (transformers' rotary_emb)
 *   kc [S, Hkv, D, P] fp32            this layer's K cache, positions last (16 positions per vector load)
 *   vc [S, Hkv, P, D] fp32            this layer's V cache
 *   slots, positions [N] int64        token n goes to slot slots[n] at position positions[n]
 *   out   [N, H * D] fp32             attention output
 *
 * All N tokens are written to the cache before any attends (specgram_rope_cache_write, then
 * specgram_attention), so a token sees the earlier new tokens of its own row. Token n attends to positions
 * j <= positions[n] of its slot (and j > positions[n] - window when window > 0): it reads only its own slot
 * below its own position, and its result depends on nothing else in the batch, which makes it batch- and
 * draft-width-invariant by construction. Rotary follows transformers' apply_rotary_pos_emb,
 * x*cos + rotate_half(x)*sin, rounded the same way (compiled without contraction: multiply, multiply, add).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vexp.h"

static void rope(const float *x, const float *c, const float *s, float *y, int64_t D) {
    int64_t h = D / 2;
    for (int64_t j = 0; j < h; ++j) y[j] = x[j] * c[j] + (-x[j + h]) * s[j];
    for (int64_t j = h; j < D; ++j) y[j] = x[j] * c[j] + x[j - h] * s[j];
}

static inline float dot(const float *a, const float *b, int64_t D) {
    __m512 acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= D; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
    if (j < D) {
        __mmask16 k = (__mmask16)((1u << (D - j)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + j), _mm512_maskz_loadu_ps(k, b + j), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void specgram_rope_cache_write(const float *qkv, const float *cos, const float *sin, float *kc, float *vc,
                               const int64_t *slots, const int64_t *positions, int64_t N, int64_t H, int64_t Hkv,
                               int64_t D, int64_t P, float *q_out, int nthreads) {
    int64_t width = (H + 2 * Hkv) * D;
    _Pragma("omp parallel for schedule(static) num_threads(nthreads)")
    for (int64_t n = 0; n < N; ++n) {
        const float *row = qkv + n * width, *c = cos + n * D, *s = sin + n * D;
        for (int64_t h = 0; h < H; ++h) rope(row + h * D, c, s, q_out + (n * H + h) * D, D);
        float kr[D];
        for (int64_t h = 0; h < Hkv; ++h) {
            int64_t head = slots[n] * Hkv + h;
            rope(row + (H + h) * D, c, s, kr, D);
            for (int64_t j = 0; j < D; ++j) kc[(head * D + j) * P + positions[n]] = kr[j];
            const float *v = row + (H + Hkv + h) * D;
            float *vd = vc + (head * P + positions[n]) * D;
            for (int64_t j = 0; j < D; ++j) vd[j] = v[j];
        }
    }
}

#define GMAX 12  /* query vectors per register pass: 12 score vectors, or 12 x 2 output vectors (+ 2 loads: 26 of
                    the 32 vector registers) */
#ifndef KPF
#define KPF 32   /* K prefetch distance in positions: K is read as D strided streams (one per dimension), more
                    than the hardware prefetcher follows */
#endif

/* The per-head accumulators are named variables, not arrays: GCC keeps arrays of vectors on the stack and
 * stores them every iteration. Unused ones (g >= GN, a compile-time constant) are optimized away. */
#define FOR_HEADS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

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

/* o[g, d0 : d0 + 32] = sum_j p[g, j] V[lo + j, d0 : d0 + 32] for GN heads, over j in order (two vectors of
 * 16 per head: 2 GN independent accumulator chains). */
#define V_DECL(g) __m512 a##g = _mm512_setzero_ps(), b##g = _mm512_setzero_ps();
#define V_FMA(g) if (gn > g) { __m512 w = _mm512_set1_ps(p[g * len + j]);                                      \
                              a##g = _mm512_fmadd_ps(w, v0, a##g); b##g = _mm512_fmadd_ps(w, v1, b##g); }
#define V_STORE(g) if (gn > g) { _mm512_mask_storeu_ps(o + g * D + d0, k0, a##g);                              \
                                _mm512_mask_storeu_ps(o + g * D + d0 + 16, k1, b##g); }
#define DEFINE_VALUES(GN)                                                                                    \
    static void values_##GN(const float *p, int64_t len, const float *V, int64_t D, int64_t d0, float *o) {    \
        enum { gn = GN };                                                                                    \
        int64_t r0 = D - d0, r1 = D - d0 - 16;                                                               \
        __mmask16 k0 = r0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r0) - 1);                           \
        __mmask16 k1 = r1 >= 16 ? (__mmask16)0xFFFF : r1 > 0 ? (__mmask16)((1u << r1) - 1) : 0;              \
        FOR_HEADS(V_DECL)                                                                                    \
        for (int64_t j = 0; j < len; ++j) {                                                                  \
            __m512 v0 = _mm512_maskz_loadu_ps(k0, V + j * D + d0);                                           \
            __m512 v1 = _mm512_maskz_loadu_ps(k1, V + j * D + d0 + 16);                                      \
            FOR_HEADS(V_FMA)                                                                                 \
        }                                                                                                    \
        FOR_HEADS(V_STORE)                                                                                   \
    }

DEFINE_SCORES(1) DEFINE_SCORES(2) DEFINE_SCORES(3) DEFINE_SCORES(4) DEFINE_SCORES(5) DEFINE_SCORES(6)
DEFINE_SCORES(7) DEFINE_SCORES(8) DEFINE_SCORES(9) DEFINE_SCORES(10) DEFINE_SCORES(11) DEFINE_SCORES(12)
DEFINE_VALUES(1) DEFINE_VALUES(2) DEFINE_VALUES(3) DEFINE_VALUES(4) DEFINE_VALUES(5) DEFINE_VALUES(6)
DEFINE_VALUES(7) DEFINE_VALUES(8) DEFINE_VALUES(9) DEFINE_VALUES(10) DEFINE_VALUES(11) DEFINE_VALUES(12)

typedef void (*scores_fn)(const float *, const float *, int64_t, int64_t, int64_t, int64_t, float, float *,
                          const float *);
typedef void (*values_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *);
static const scores_fn SCORES[GMAX + 1] = {0, scores_1, scores_2, scores_3, scores_4, scores_5, scores_6,
                                           scores_7, scores_8, scores_9, scores_10, scores_11, scores_12};
static const values_fn VALUES[GMAX + 1] = {0, values_1, values_2, values_3, values_4, values_5, values_6,
                                           values_7, values_8, values_9, values_10, values_11, values_12};

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

static void weighted_values(const float *p, int64_t G, int64_t len, const float *V, int64_t D, float *o) {
    for (int64_t g0 = 0; g0 < G; g0 += GMAX)
        for (int64_t d0 = 0; d0 < D; d0 += 32)
            VALUES[G - g0 < GMAX ? G - g0 : GMAX](p + g0 * len, len, V, D, d0, o + g0 * D);
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
                   float scale, float *out) {
    int64_t G = H / Hkv, head = slots[n0] * Hkv + hk, Q = T * G;
    int64_t first = positions[n0], last = positions[n0 + T - 1];
    int64_t lo = window_lo(first, window), len = last + 1 - lo;  /* the shared range [lo, last] */
    float *qb = malloc(sizeof(float) * Q * D * 2 + sizeof(float) * Q * len);
    float *ob = qb + Q * D, *p = ob + Q * D;                      /* queries, outputs [Q, D]; scores [Q, len] */
    for (int64_t t = 0; t < T; ++t)
        memcpy(qb + t * G * D, q + ((n0 + t) * H + hk * G) * D, sizeof(float) * G * D);
    const float *V = vc + (head * P + lo) * D;                    /* [len, D] */
    scores(qb, Q, kc + head * D * P, P, lo, len, D, scale, p, V);
    for (int64_t t = 0; t < T; ++t) {
        int64_t pos = positions[n0 + t];
        int64_t own_lo = window_lo(pos, window);
        int64_t off = own_lo - lo, own = pos + 1 - own_lo;        /* this token's range within the shared one */
        for (int64_t g = 0; g < G; ++g) {
            float *pg = p + (t * G + g) * len;
            softmax_rows(pg + off, 1, own);
            memset(pg, 0, sizeof(float) * off);
            memset(pg + off + own, 0, sizeof(float) * (len - off - own));
        }
    }
    weighted_values(p, Q, len, V, D, ob);
    for (int64_t t = 0; t < T; ++t)
        memcpy(out + ((n0 + t) * H + hk * G) * D, ob + t * G * D, sizeof(float) * G * D);
    free(qb);
}

/* Tasks: with enough of them, one task = one KV head of one row (the consecutive tokens of a slot: a verify
 * row's k + 1 tokens), its tokens attended together in groups of up to GMAX / G (sharing K and V loads);
 * otherwise (a single short row) one task per token and KV head, to keep both cores busy. Either way each
 * token's result is bitwise the same (see attend()). */
#define MAX_ROWS 4096
void specgram_attention(const float *q, const float *kc, const float *vc, const int64_t *slots,
                        const int64_t *positions, int64_t N, int64_t H, int64_t Hkv, int64_t D, int64_t P,
                        int64_t window, float scale, float *out, int nthreads) {
    int64_t starts[MAX_ROWS + 1], rows = 0;
    int64_t group = H / Hkv <= GMAX ? GMAX / (H / Hkv) : 1;       /* tokens per shared pass */
    for (int64_t n = 0; n < N && rows < MAX_ROWS; ++n)
        if (n == 0 || slots[n] != slots[n - 1]) starts[rows++] = n;
    if (rows < MAX_ROWS && rows * Hkv >= 2 * nthreads && rows < N) {
        starts[rows] = N;
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nthreads)")
        for (int64_t task = 0; task < rows * Hkv; ++task) {
            int64_t r = task / Hkv, hk = task % Hkv;
            for (int64_t n = starts[r]; n < starts[r + 1]; n += group) {
                int64_t T = starts[r + 1] - n < group ? starts[r + 1] - n : group;
                attend(q, kc, vc, slots, positions, n, T, hk, H, Hkv, D, P, window, scale, out);
            }
        }
        return;
    }
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nthreads)")
    for (int64_t task = 0; task < N * Hkv; ++task)
        attend(q, kc, vc, slots, positions, task / Hkv, 1, task % Hkv, H, Hkv, D, P, window, scale, out);
}
