/* The library's contract with its caller: every entry point that Python calls (through ctypes) and every struct
 * and constant it passes, declared once. abi.py builds the ctypes signatures and struct mirrors from this file;
 * each source that defines an entry point includes it, so the compiler checks every definition against its
 * declaration, and specgram_abi_sizes lets the loader's tests check the mirrors' layout against the compiler's.
 *
 * abi.py reads a plain subset of C, which this file keeps to: constants as `#define SPECGRAM_<NAME> <integer>`;
 * structs as `typedef struct { <type> <name>, <name>; ... } specgram_<name>;` (no nested definitions, no arrays);
 * prototypes as `<type> specgram_<name>(<type> <name>, ...);` (`void` for none); types are the fixed-width
 * integers, int, float, size_t, char, void, these structs, and single pointers to them.
 * Internal functions shared between the sources are declared in team.h (hidden: not part of this contract).
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* specgram_linear.kind: how a weight matmul's weights are stored (linear.py's NativeLinear.descriptor()) */
#define SPECGRAM_LIN_F32 0
#define SPECGRAM_LIN_BF16 1
#define SPECGRAM_LIN_I8 2
#define SPECGRAM_LIN_I8A8 3
#define SPECGRAM_LIN_I4 4         /* gemm_i4.c's product on VNNI */
#define SPECGRAM_LIN_I4_MADD 5    /* the same without VNNI (bitwise the same results) */
#define SPECGRAM_LIN_I8B 6        /* gemm_i8b.c's product: int8 weights x int8 activations per 256 inputs (VNNI) */

/* specgram_decoder.act: the MLP's activation of its gate */
#define SPECGRAM_ACT_SILU 0
#define SPECGRAM_ACT_GELU_TANH 1

/* the largest LoRA rank the kernels take (lora.c's per-row scratch) */
#define SPECGRAM_LORA_MAX_RANK 256

/* specgram_decoder_forward's return codes: what is wrong with the batch (nothing has been written) */
#define SPECGRAM_BAD_TOKEN 1
#define SPECGRAM_BAD_SLOT 2
#define SPECGRAM_BAD_POSITION 3
#define SPECGRAM_BAD_ROW 4
#define SPECGRAM_BAD_HEAD_ROW 5
#define SPECGRAM_BAD_TREE 6

typedef struct {
    int32_t kind, digits;       /* SPECGRAM_LIN_*; digits: the activations' base-256 digits (LIN_I8A8) */
    int64_t K, N;               /* inputs, outputs */
    const void *w;              /* packed weights (gemm.c / gemm_i8a8.c / gemm_i4.c layouts) */
    const float *scale;         /* [N] LIN_I8 and LIN_I8A8, else NULL */
    const int32_t *colsum;      /* [N] LIN_I8A8, else NULL */
    const float *bias;          /* [N] or NULL */
} specgram_linear;

typedef struct {
    specgram_linear qkv, o, gate_up, down;
    const float *w_post, *w_next;   /* the post-attention norm; the next layer's input norm (the final norm last) */
    float eps_post, eps_next;
    const float *q_norm, *k_norm;   /* [D] RMSNorm weights over each q and k head before rotary, or NULL: none */
    float qk_eps;
    int32_t rope;                   /* 1: this layer's q and k rotate; 0: not (a layer without position encoding) */
    int32_t table;                  /* which rotary table its q and k rotate by (gemma3: local or global base) */
    int32_t sliding;                /* 1: it attends within the call's window; 0: to every earlier position */
    const float *w_attn_out, *w_mlp_out;  /* norms of the attention and MLP outputs before the residual add
                                           * (gemma3), or NULL: none */
    float eps_attn_out, eps_mlp_out;
} specgram_layer;

typedef struct {
    int64_t layers, E, H, Hkv, D, I;
    const float *w_in;              /* the first layer's input norm */
    float eps_in, scaling;          /* its epsilon; attention's score scale */
    const specgram_layer *layer;    /* [layers] */
    const void *embed;              /* the embedding [vocab, E], float32 or (embed_bf16) bfloat16 */
    int64_t vocab;
    int32_t embed_bf16;
    int64_t rotary;                 /* the dimensions of each head that rotate (the tables' row width): D or fewer */
    float embed_scale;              /* the embedding rows times this */
    float residual_scale;           /* each branch's output times this as it is added to the residual stream */
    int32_t act;                    /* the MLP's activation: SPECGRAM_ACT_* */
} specgram_decoder;

/* isa.c: the instruction set of this build ("avx512" or "avx2"); sizeof of each struct above, in order. */
const char *specgram_isa(void);
void specgram_abi_sizes(int64_t *sizes);

/* gemm.c: y [M, N] (row stride ldy) = x [M, K] (row stride ldx) times packed weights (+ bias). */
void specgram_gemm_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *w, int64_t N,
                       const float *bias, float *y, int64_t ldy, int nthreads);
void specgram_gemm_bf16(const float *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w, int64_t N,
                        const float *bias, float *y, int64_t ldy, int nthreads);
void specgram_gemm_i8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *scale,
                      int64_t N, const float *bias, float *y, int64_t ldy, int nthreads);

/* gemm_i8a8.c: the same with the rows quantized in the call (digits 1: int8, 2: int16); whether it was built. */
void specgram_gemm_i8a8(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, const float *wscale,
                        const int32_t *colsum, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                        int nthreads);
int specgram_i8a8_built(void);

/* gemm_i4.c: 4-bit group-quantized weights times rows quantized to int8 per block of 256 in the call (vnni 1: its
 * VNNI loops, 0: the same results without VNNI); the bytes of one packed block of 32 outputs for K inputs. */
void specgram_gemm_i4(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, int vnni, int64_t N,
                      const float *bias, float *y, int64_t ldy, int nthreads);
int64_t specgram_i4_block_bytes(int64_t K);

/* gemm_i8b.c: int8 weights (stored + 128) times rows quantized to int8 per block of 256 in the call (VNNI only). */
void specgram_gemm_i8b(const float *x, int64_t M, int64_t K, int64_t ldx, const uint8_t *w, const float *wscale,
                       int64_t N, const float *bias, float *y, int64_t ldy, int nthreads);

/* rope.c, attention.c, norm.c: the layer's other kernels, each its own entry point (forward.c runs their bodies). */
void specgram_rope_cache_write(const float *qkv, const float *cos, const float *sin, void *kc, void *vc, int kv_bf16,
                               const int64_t *slots, const int64_t *positions, int64_t N, int64_t S, int64_t H,
                               int64_t Hkv, int64_t D, int64_t P, int64_t rotary, const float *q_norm,
                               const float *k_norm, float qk_eps, float *q_out, int nthreads);
void specgram_attention(const float *q, const void *kc, const void *vc, int kv_bf16, const int64_t *slots,
                        const int64_t *positions, int64_t N, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                        int64_t P, int64_t window, float scale, float *out, int nthreads);
void specgram_add_rmsnorm(float *h, const float *delta, const float *dw, float deps, float scale, const float *w,
                          float eps, float *out, int64_t M, int64_t N, int nthreads);
void specgram_act_mul(const float *gu, float *out, int64_t M, int64_t I, int act, int nthreads);

/* mask.c: a grammar's token bitmask applied to logits rows in place (-inf where a token's bit is clear). */
void specgram_apply_bitmask(float *logits, int64_t ld, int64_t V, const int32_t *mask, int64_t mask_ld, int64_t W,
                            const int64_t *rows, const int64_t *mask_rows, int64_t n);

/* One LoRA update of a product's output columns [col, col + out): a = A [rank, in] and b = B transposed,
 * [rank, out], float32 row-major, times scale (lora.c). */
typedef struct {
    const float *a, *b;
    int64_t rank, in, col, out;
    float scale;
} specgram_lora_part;

/* Every adapter's updates: adapter a's on layer l's product p (0 q|k|v, 1 o, 2 gate|up, 3 down) are parts
 * first[i] .. first[i + 1] - 1, i = (a * layers + l) * 4 + p. */
typedef struct {
    const specgram_lora_part *parts;
    const int64_t *first;           /* [adapters * layers * 4 + 1] */
    int64_t adapters;
} specgram_lora;

/* lora.c: rows [m0, m1) of product p's output y (row stride ldy) of layer l += their adapters' updates of input x
 * (row stride ldx), share `part` of `parts` of that work (by adapter or by output block); adapters [rows] (-1:
 * none). */
void specgram_lora_rows(const specgram_lora *lora, const int64_t *adapters, int64_t layers, int64_t l, int32_t p,
                        const float *x, int64_t ldx, float *y, int64_t ldy, int64_t m0, int64_t m1, int32_t part,
                        int32_t parts);

/* forward.c: a whole decoder stack for N new tokens in one call (its header says what each argument holds). */
int specgram_decoder_forward(const specgram_decoder *d, const int64_t *tokens, float *x, const float *cos,
                             const float *sin, int by_position, void *kc, void *vc, int kv_bf16, int64_t S, int64_t P,
                             const int64_t *slots, const int64_t *positions, const uint64_t *tree, int64_t N,
                             int64_t window, const specgram_linear *head, const int64_t *head_rows, int64_t R,
                             float *logits, const specgram_lora *lora, const int64_t *adapters, int nthreads);
