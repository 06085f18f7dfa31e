/* A Llama-family decoder stack for N new tokens in one call and one OpenMP region (native.py's forward).
 *
 *   tokens [N] int64   the new tokens' ids: their rows of the embedding (float32 or bfloat16, widened exactly)
 *                      start the residual stream
 *   x [N, E]           out (or NULL): the final-normed hidden states (the lm_head's input)
 *   cos, sin           rotary tables, d->rotary wide: [tables, P, rotary] by position (by_position), else
 *                      [tables, N, rotary] per token; layer l rotates by its table (specgram_layer.table)
 *   kc, vc             the whole KV cache, [layers, S, Hkv, D, P] and [layers, S, Hkv, P, D], float32 or
 *                      (kv_bf16) bfloat16
 *   slots, positions [N] int64, window (0: none)   as attention.c and rope.c take them
 *   tree [N] uint64    optional: each token's ancestor mask (tree.h: a verify row that is a tree of drafts; each
 *                      node attends to the committed tokens and its ancestors, rotated by its depth); NULL: causal
 *   head, head_rows [R], logits [R, V]   optional: the lm_head's product of the final hidden rows head_rows (all
 *                      N where head_rows is NULL), in the same region; head NULL: none
 *   lora, adapters [N] optional: LoRA adapters (lora.c) and each token's (-1: none); lora NULL: none. Each
 *                      product's updates are added to its output by the whole team (lora_share), between the
 *                      product and the phase that reads it (one more barrier per product)
 * -> 0, or before anything is written, the first of: SPECGRAM_BAD_TOKEN (an id outside the embedding),
 *    SPECGRAM_BAD_SLOT (outside [0, S)), SPECGRAM_BAD_POSITION (outside [0, P)), SPECGRAM_BAD_ROW (one slot's
 *    tokens not adjacent in consecutive positions: attention.c's rows), SPECGRAM_BAD_HEAD_ROW (outside [0, N)),
 *    SPECGRAM_BAD_TREE (an ancestor mask without its own bit 0).
 *
 * Per layer, the same kernels as their own entry points, in the same order:
 *   qkv = x W_qkv -> q/k head norms (if any) + rotary (all, part or none of each head) + cache write
 *   -> attention (within the window on sliding layers) -> h += att W_o (normed first where the layer norms its
 *   branch outputs; times residual_scale); x = rmsnorm(h) -> gu = x W_gate|up -> act = silu or gelu(gate) * up
 *   -> h += act W_down (the same way); x = rmsnorm(h) with the next layer's (or the final) norm.
 *   The embedding rows start the residual stream times embed_scale.
 * Why one region: a decode step of a small model is ~8 kernels x 30 layers, and each separate call paid for a
 * ctypes call, Python glue and an OpenMP fork and join (about 1 ms of a 5 ms int8 decode at 135M). Here the phases
 * are separated by team barriers, and the elementwise phases that are too small to share (one decode row) run on
 * one thread while the other waits at the barrier.
 * A waiting thread prefetches the first bytes of its share of the next weight product (barrier.h).
 * Exactness: every phase runs the team body of the kernel it replaces, and which thread computes a row or a
 * weight block changes no result, so the hidden states, the cache and the logits are bitwise those of the
 * kernel-by-kernel sequence (tests/unit/test_forward_stack.py compares them).
 *
 * Workspace (the calling thread's SCRATCH_PLAN buffer, grown on demand; no kernel body run here touches that
 * buffer): the residual stream and the intermediate activations, the quantized input rows of int8 x int8
 * products, every product's dealt ranges, the attention tasks (one plan for all layers: it depends on the batch
 * only), and the lm_head's gathered input rows.
 */
#include <assert.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "barrier.h"
#include "deal.h"
#include "scratch.h"
#include "specgram.h"
#include "team.h"

/* The batch's indices against the shapes they index (see the header) -> 0 or the first error's code. */
static int check(const int64_t *tokens, const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t N,
                 int64_t vocab, int64_t S, int64_t P, const int64_t *head_rows, int64_t R) {
    for (int64_t n = 0; n < N; ++n) {
        if (tokens[n] < 0 || tokens[n] >= vocab) return SPECGRAM_BAD_TOKEN;
        if (slots[n] < 0 || slots[n] >= S) return SPECGRAM_BAD_SLOT;
        if (positions[n] < 0 || positions[n] >= P) return SPECGRAM_BAD_POSITION;
    }
    for (int64_t n = 1; n < N; ++n)
        if (slots[n] == slots[n - 1] && positions[n] != positions[n - 1] + 1) return SPECGRAM_BAD_ROW;
    for (int64_t r = 0; head_rows && r < R; ++r)
        if (head_rows[r] < 0 || head_rows[r] >= N) return SPECGRAM_BAD_HEAD_ROW;
    for (int64_t n = 0; tree && n < N; ++n)
        if (!(tree[n] & 1)) return SPECGRAM_BAD_TREE;
    return 0;
}

/* h[n] = the embedding row of tokens[n] (times embed_scale), for n in [n0, n1). */
static void embed_rows(const specgram_decoder *d, const int64_t *tokens, int64_t n0, int64_t n1, float *h) {
    const int64_t E = d->E;
    for (int64_t n = n0; n < n1; ++n) {
        float *y = h + n * E;
        if (d->embed_bf16) {
            const uint16_t *e = (const uint16_t *)d->embed + tokens[n] * E;
            for (int64_t j = 0; j < E; ++j) {
                uint32_t u = (uint32_t)e[j] << 16;
                memcpy(y + j, &u, sizeof u);
            }
        } else {
            memcpy(y, (const float *)d->embed + tokens[n] * E, sizeof(float) * (size_t)E);
        }
        if (d->embed_scale != 1.0f)
            for (int64_t j = 0; j < E; ++j) y[j] = y[j] * d->embed_scale;
    }
}

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

/* Rows [*m0, *m1) of M for this thread: an equal share each, or all on thread 0 where M * width values are too few
 * to be worth sharing (the others skip to the barrier). */
static inline void share(int64_t M, int64_t width, int64_t *m0, int64_t *m1) {
    int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    if (M * width < SERIAL_WORK) nt = 1;
    *m0 = id < nt ? M * id / nt : M;
    *m1 = id < nt ? M * (id + 1) / nt : M;
}

/* Whether product L is gemm_i4.c's (with or without VNNI). */
static inline int is_i4(const specgram_linear *L) {
    return L->kind == SPECGRAM_LIN_I4 || L->kind == SPECGRAM_LIN_I4_MADD;
}

/* Whether product L reads its rows as gemm_i4.c quantizes them (int8 per block of 256): int4 and gemm_i8b.c's. */
static inline int blocks8(const specgram_linear *L) { return is_i4(L) || L->kind == SPECGRAM_LIN_I8B; }

/* Whether product L reads its input rows quantized (prepare()). */
static inline int quantized(const specgram_linear *L) {
    return L->kind == SPECGRAM_LIN_I8A8 || blocks8(L);
}

/* The product's input rows [m0, m1) as it reads them: quantized digit rows (u, xs) for int8 x int8 products;
 * int8 steps (u) and their aux words (block scales and group sums, at gs) for int4 and gemm_i8b.c's products. */
static inline void prepare(const specgram_linear *L, const float *x, int64_t m0, int64_t m1, int64_t M, uint8_t *u,
                           float *xs, int32_t *gs) {
    if (L->kind == SPECGRAM_LIN_I8A8) specgram_quantize_rows(x, m0, m1, L->K, L->K, L->digits, u, xs);
    if (blocks8(L)) specgram_i4_quantize_rows(x, m0, m1, M, L->K, L->K, (int8_t *)u, gs);
}

/* One residual add of d's stream h, this thread's share of its N rows: h += norm_dw(delta) * residual_scale (dw
 * NULL: delta as it is), then x = norm_w(h), as product `next` reads it (NULL: no product follows here). */
static inline void add_norm_rows(const specgram_decoder *d, float *h, const float *delta, const float *dw, float deps,
                                 const float *w, float eps, float *x, int64_t N, const specgram_linear *next,
                                 uint8_t *u, float *xs, int32_t *gs) {
    int64_t m0, m1;
    share(N, d->E, &m0, &m1);
    specgram_add_rmsnorm_rows(h, delta, dw, deps, d->residual_scale, w, eps, x, m0, m1, d->E);
    if (next != NULL) prepare(next, x, m0, m1, N, u, xs, gs);
}

/* y [M, N] = x [M, K] W (+ bias), as every thread of the team's share. */
static void linear(const specgram_linear *L, const float *x, int64_t M, const uint8_t *u, const float *xs,
                   const int32_t *gs, float *y, deal_range *ranges, int nthreads) {
    switch (L->kind) {
    case SPECGRAM_LIN_F32:
        specgram_team_gemm_f32(x, M, L->K, L->K, L->w, L->N, L->bias, y, L->N, ranges, nthreads);
        break;
    case SPECGRAM_LIN_BF16:
        specgram_team_gemm_bf16(x, M, L->K, L->K, L->w, L->N, L->bias, y, L->N, ranges, nthreads);
        break;
    case SPECGRAM_LIN_I8:
        specgram_team_gemm_i8(x, M, L->K, L->K, L->w, L->scale, L->N, L->bias, y, L->N, ranges, nthreads);
        break;
    case SPECGRAM_LIN_I8B:
        specgram_team_i8b((const int8_t *)u, gs, M, L->K, L->w, L->scale, L->N, L->bias, y, L->N, ranges, nthreads);
        break;
    case SPECGRAM_LIN_I4:
    case SPECGRAM_LIN_I4_MADD:
        specgram_team_i4((const int8_t *)u, gs, M, L->K, L->w, L->kind == SPECGRAM_LIN_I4, L->N, L->bias, y, L->N,
                         ranges, nthreads);
        break;
    default:
        specgram_team_i8a8(u, xs, M, L->K, L->w, L->scale, L->colsum, L->digits, L->N, L->bias, y, L->N, ranges,
                           nthreads);
    }
}

/* Product p's LoRA updates of its output y, this thread's share: rows where there are many (a prefill), else its
 * share of the adapters or of each update's output blocks (specgram_lora_rows). */
static inline void lora_share(const specgram_lora *lora, const int64_t *adapters, int64_t layers, int64_t l, int32_t p,
                              const float *x, int64_t ldx, float *y, int64_t ldy, int64_t N) {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    if (N >= 32 * nt)
        specgram_lora_rows(lora, adapters, layers, l, p, x, ldx, y, ldy, N * id / nt, N * (id + 1) / nt, 0, 1);
    else
        specgram_lora_rows(lora, adapters, layers, l, p, x, ldx, y, ldy, 0, N, id, nt);
}

#ifndef PULL_MAX
#define PULL_MAX (256 * 1024)   /* bytes of a product that a waiting thread prefetches at most (of a 1 MB L2) */
#endif

/* The first bytes this thread streams of product L (its dealt range's start, deal.h): what it prefetches while
 * waiting before the product; nothing for a prefill-sized one (compute-bound) or none at all. */
static inline pull pull_of(const specgram_linear *L, const deal_range *ranges, int nthreads) {
    pull p = {NULL, NULL};
    if (L == NULL || ranges == NULL) return p;
    int64_t id = omp_get_thread_num(), nblocks = (L->N + 31) / 32;
    int64_t block = L->kind == SPECGRAM_LIN_I8A8 || L->kind == SPECGRAM_LIN_I8B ? (L->K + 3) / 4 * 128
                    : is_i4(L) ? specgram_i4_block_bytes(L->K)
                    : L->K * 32 * (L->kind == SPECGRAM_LIN_F32 ? 4 : L->kind == SPECGRAM_LIN_BF16 ? 2 : 1);
    int64_t b0 = nblocks * id / nthreads, b1 = nblocks * (id + 1) / nthreads;
    size_t bytes = (size_t)((b1 - b0) * block);
    p.at = (const char *)L->w + b0 * block;
    p.end = p.at + (bytes < PULL_MAX ? bytes : PULL_MAX);
    return p;
}

/* The dealt ranges for a product of M rows (NULL: the dynamic schedule of a prefill-sized one). */
static deal_range *ranges_for(const specgram_linear *L, int64_t M, deal_range *mem, int nthreads) {
    if (!quantized(L) && !specgram_gemm_deals(M)) return NULL;
    deal_init(mem, (L->N + 31) / 32, nthreads);
    return mem;
}

int specgram_decoder_forward(const specgram_decoder *d, const int64_t *tokens, float *x, const float *cos,
                             const float *sin, int by_position, void *kc, void *vc, int kv_bf16, int64_t S, int64_t P,
                             const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t N,
                             int64_t window, const specgram_linear *head, const int64_t *head_rows, int64_t R,
                             float *logits, const specgram_lora *lora, const int64_t *adapters, int nthreads) {
    assert(N >= 0 && nthreads >= 1 && d->layers >= 1 && d->H % d->Hkv == 0 && d->D % 2 == 0);
    assert(d->rotary >= 0 && d->rotary <= d->D && d->rotary % 2 == 0);
    assert(head == NULL || (R >= 0 && (head_rows != NULL || R == N) && head->K == d->E));
    if (head == NULL) R = 0;
    int bad = check(tokens, slots, positions, tree, N, d->vocab, S, P, head_rows, R);
    if (bad || N == 0) return bad;
    const int64_t E = d->E, H = d->H, Hkv = d->Hkv, D = d->D, I = d->I, Lc = d->layers;
    const int64_t width = (H + 2 * Hkv) * D, kv_layer = S * Hkv * D * P;   /* one layer's K (and V) cache */
    const int64_t esz = kv_bf16 ? 2 : 4;                                    /* bytes per cache element */
    const int64_t table = (by_position ? P : N) * d->rotary;                /* one rotary table's floats */
    const int64_t widest = E > H * D ? (E > I ? E : I) : (H * D > I ? H * D : I);
    const size_t f = sizeof(float);
    /* workspace: q, att [N, H D]; qkv [N, width]; delta [N, E] (o's and down's output); gu [N, 2 I]; act [N, I];
     * u [2 N, ldq] then the int4 aux words [N, AW]; xs [N]; ranges [4 layers + 1][nthreads]; the attention
     * plan; the head's input rows [R, E]; the residual stream h [N, E]; x [N, E] unless the caller's */
    size_t sizes[] = {N * H * D * f, N * H * D * f, N * width * f, N * E * f, N * 2 * I * f, N * I * f,
                      (size_t)(2 * N * specgram_i8a8_ldq(widest)) + N * specgram_i4_aux_words(widest) * f, N * f,
                      sizeof(deal_range) * (size_t)((4 * Lc + 1) * nthreads), specgram_attention_plan_bytes(N, Hkv),
                      R * E * f, N * E * f, x ? 0 : N * E * f};
    enum { Q, ATT, QKV, DELTA, GU, ACT, U, XS, RANGES, PLAN, HEAD_X, H_RES, X_OWN, PARTS };
    size_t offset[PARTS], total = 64;
    for (int i = 0; i < PARTS; ++i) offset[i] = total, total += ALIGN64(sizes[i]);
    char *base = specgram_scratch(SCRATCH_PLAN, total);
    base = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    float *q = (float *)(base + offset[Q]), *att = (float *)(base + offset[ATT]), *qkv = (float *)(base + offset[QKV]);
    float *delta = (float *)(base + offset[DELTA]), *gu = (float *)(base + offset[GU]);
    float *act = (float *)(base + offset[ACT]), *xs = (float *)(base + offset[XS]);
    uint8_t *u = (uint8_t *)(base + offset[U]);
    int32_t *gs = (int32_t *)(u + 2 * N * specgram_i8a8_ldq(widest));   /* after u's digit rows: int4 aux words */
    float *h = (float *)(base + offset[H_RES]);
    if (x == NULL) x = (float *)(base + offset[X_OWN]);
    deal_range *all_ranges = (deal_range *)(base + offset[RANGES]);
    /* product j: layer j / 4's qkv, o, gate_up, down (in that order), its dealt ranges */
    const specgram_linear *lin[4 * Lc + 1];
    deal_range *rg[4 * Lc + 1];
    for (int64_t j = 0; j < 4 * Lc; ++j) {
        const specgram_layer *L = d->layer + j / 4;
        lin[j] = j % 4 == 0 ? &L->qkv : j % 4 == 1 ? &L->o : j % 4 == 2 ? &L->gate_up : &L->down;
        rg[j] = ranges_for(lin[j], N, all_ranges + j * nthreads, nthreads);
    }
    /* then the lm_head over the R rows head_rows (all N where NULL), if asked for */
    lin[4 * Lc] = head, rg[4 * Lc] = head ? ranges_for(head, R, all_ranges + 4 * Lc * nthreads, nthreads) : NULL;
    const float *head_x = head_rows ? (const float *)(base + offset[HEAD_X]) : x;
    const attention_plan plan = specgram_attention_plan(base + offset[PLAN], slots, positions, N, H, Hkv, window,
                                                        nthreads);
    team_barrier bar = {0};

#pragma omp parallel num_threads(nthreads)
    {
        const int nt = omp_get_num_threads();
        uint32_t epoch = 0;
        int64_t m0, m1, pulling = -1;
        pull ahead = {NULL, NULL};
/* every thread: wait for the others, prefetching product j's first bytes of this thread's share meanwhile */
#define WAIT(j)                                                                                                  \
        do {                                                                                                     \
            if (pulling != (j)) pulling = (j), ahead = pull_of(lin[j], rg[j], nthreads);                        \
            team_wait(&bar, nt, &epoch, &ahead);                                                                 \
        } while (0)
/* every thread: product p's LoRA updates of its output y (input x), this thread's share, then a barrier */
#define LORA(p, x_in, ldx, y_out, ldy, j)                                                                        \
        do {                                                                                                     \
            if (lora) {                                                                                          \
                lora_share(lora, adapters, Lc, l, p, x_in, ldx, y_out, ldy, N);                                  \
                WAIT(j);                                                                                         \
            }                                                                                                    \
        } while (0)
        share(N, E, &m0, &m1);
        embed_rows(d, tokens, m0, m1, h);
        specgram_add_rmsnorm_rows(h, NULL, NULL, 0.0f, 1.0f, d->w_in, d->eps_in, x, m0, m1, E);
        prepare(lin[0], x, m0, m1, N, u, xs, gs);
        WAIT(0);
        for (int64_t l = 0, j = 0; l < Lc; ++l, j += 4) {
            const specgram_layer *L = d->layer + l;
            char *kl = (char *)kc + l * kv_layer * esz, *vl = (char *)vc + l * kv_layer * esz;
            linear(&L->qkv, x, N, u, xs, gs, qkv, rg[j], nthreads);
            WAIT(j + 1);
            LORA(0, x, E, qkv, width, j + 1);
            share(N, width, &m0, &m1);
            specgram_rope_rows(qkv, cos + L->table * table, sin + L->table * table, by_position, kl, vl, kv_bf16, slots,
                               positions, tree, m0, m1, S, H, Hkv, D, P, L->rope ? d->rotary : 0, L->q_norm, L->k_norm,
                               L->qk_eps, q);
            WAIT(j + 1);
            specgram_team_attention(&plan, q, kl, vl, kv_bf16, slots, positions, tree, H, Hkv, D, P,
                                    L->sliding ? window : 0, d->scaling, att);
            WAIT(j + 1);
            if (quantized(&L->o)) {
                share(N, H * D, &m0, &m1);
                prepare(&L->o, att, m0, m1, N, u, xs, gs);
                WAIT(j + 1);
            }
            linear(&L->o, att, N, u, xs, gs, delta, rg[j + 1], nthreads);
            WAIT(j + 2);
            LORA(1, att, H * D, delta, E, j + 2);
            add_norm_rows(d, h, delta, L->w_attn_out, L->eps_attn_out, L->w_post, L->eps_post, x, N, &L->gate_up, u,
                          xs, gs);
            WAIT(j + 2);
            linear(&L->gate_up, x, N, u, xs, gs, gu, rg[j + 2], nthreads);
            WAIT(j + 3);
            LORA(2, x, E, gu, 2 * I, j + 3);
            share(N, I, &m0, &m1);
            specgram_act_mul_rows(gu, act, m0, m1, I, d->act);
            prepare(&L->down, act, m0, m1, N, u, xs, gs);
            WAIT(j + 3);
            linear(&L->down, act, N, u, xs, gs, delta, rg[j + 3], nthreads);
            WAIT(j + 4);
            LORA(3, act, I, delta, E, j + 4);
            add_norm_rows(d, h, delta, L->w_mlp_out, L->eps_mlp_out, L->w_next, L->eps_next, x, N,
                          l + 1 < Lc ? lin[j + 4] : NULL, u, xs, gs);
            WAIT(j + 4);
        }
        if (R > 0) {
            share(R, E, &m0, &m1);
            for (int64_t r = m0; r < m1 && head_rows; ++r)
                memcpy((float *)head_x + r * E, x + head_rows[r] * E, sizeof(float) * (size_t)E);
            prepare(head, head_x, m0, m1, R, u, xs, gs);
            WAIT(4 * Lc);
            linear(head, head_x, R, u, xs, gs, logits, rg[4 * Lc], nthreads);
        }
#undef LORA
#undef WAIT
    }
    return 0;
}
