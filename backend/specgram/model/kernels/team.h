/* The kernels' bodies as the threads of a team run them, shared by their own entry points (one OpenMP region per
 * call) and by forward.c (one region for a whole decoder stack). Internal to the library.
 *
 * A team body is called by every thread of the current OpenMP team and ends without a barrier: the caller puts one
 * between a body and whatever reads its output. The _rows functions compute a subset of the rows; which thread
 * computes a row, and in which split, never changes its result.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "deal.h"

#ifndef SERIAL_WORK
#define SERIAL_WORK 16384   /* elementwise values below which a call runs on one thread: the team costs more */
#endif

#pragma GCC visibility push(hidden)

/* gemm.c: whether M rows deal ranges (else the dynamic schedule: ranges NULL), and the bodies by weight type. */
int specgram_gemm_deals(int64_t M);
void specgram_team_gemm_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *w, int64_t N,
                            const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads);
void specgram_team_gemm_bf16(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w, int64_t N,
                             const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads);
void specgram_team_gemm_i8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *scale,
                           int64_t N, const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads);

/* gemm_i8a8.c: the digit rows' stride for K inputs, quantizing rows, and the product's body (VNNI only). */
int64_t specgram_i8a8_ldq(int64_t K);
void specgram_quantize_rows(const float *x, int64_t m0, int64_t m1, int64_t K, int64_t ldx, int digits, uint8_t *u,
                            float *xs);
void specgram_team_i8a8(const uint8_t *u, const float *xs, int64_t M, int64_t K, const int8_t *w, const float *wscale,
                        const int32_t *colsum, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                        deal_range *ranges, int nthreads);

/* gemm_i4.c: groups of K inputs, the aux words per quantized row (block scales, group sums), quantizing rows to
 * int8 per block of 256, and the product's body. */
int64_t specgram_i4_groups(int64_t K);
int64_t specgram_i4_aux_words(int64_t K);
void specgram_i4_quantize_rows(const float *x, int64_t m0, int64_t m1, int64_t M, int64_t K, int64_t ldx, int8_t *s,
                               int32_t *aux);
const int8_t *specgram_i4_rows(const float *x, int64_t M, int64_t K, int64_t ldx, int64_t nblocks, int nthreads,
                               int32_t **aux, deal_range **ranges);
void specgram_team_i8b(const int8_t *s, const int32_t *aux, int64_t M, int64_t K, const uint8_t *w,
                       const float *wscale, int64_t N, const float *bias, float *y, int64_t ldy, deal_range *ranges,
                       int nthreads);
void specgram_team_i4(const int8_t *s, const int32_t *aux, int64_t M, int64_t K, const uint8_t *w, int vnni, int64_t N,
                      const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads);

/* attention.c: the tasks of one batch (the same for every layer) in caller memory, and the body. */
typedef struct {
    int64_t *group_n0, *task_g, *task_h, *task_cost;
    int64_t tasks, total;
} attention_plan;
size_t specgram_attention_plan_bytes(int64_t N, int64_t Hkv);
attention_plan specgram_attention_plan(void *mem, const int64_t *slots, const int64_t *positions, int64_t N,
                                       int64_t H, int64_t Hkv, int64_t window, int nthreads);
void specgram_team_attention(const attention_plan *a, const float *q, const void *kc, const void *vc, int kv_bf16,
                             const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t H,
                             int64_t Hkv, int64_t D, int64_t P, int64_t window, float scale, float *out);

/* norm.c and rope.c, rows m0 .. m1 - 1. */
void specgram_add_rmsnorm_rows(float *h, const float *delta, const float *dw, float deps, float scale, const float *w,
                               float eps, float *out, int64_t m0, int64_t m1, int64_t N);
void specgram_rmsnorm_row(const float *x, const float *w, float eps, float *y, int64_t N);
void specgram_act_mul_rows(const float *gu, float *out, int64_t m0, int64_t m1, int64_t I, int act);
void specgram_rope_rows(const float *qkv, const float *cos, const float *sin, int by_position, void *kc, void *vc,
                        int kv_bf16, const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t n0,
                        int64_t n1, int64_t S, int64_t H, int64_t Hkv, int64_t D, int64_t P, int64_t rotary,
                        const float *q_norm, const float *k_norm, float qk_eps, float *q_out);

#pragma GCC visibility pop
