/* gemm_i4.c's product loops, included by it twice: once where the CPU has VNNI (I4_DPB = vi_dpbusd_at, I4_DPW =
 * vpdpwssd: one instruction each), once where it does not (vpmaddubsw, vpmaddwd and adds). Both form the same exact
 * int32 sums (gemm_i4.c's header), so the two give bitwise the same outputs. I4_NAME(f) names this copy's
 * functions. */

/* One register tile of up to 8 rows: rows m0 .. m0 + MT - 1 of y, outputs n0 .. n0 + 31, from block wb, both vectors of
 * each k4 step at once (one unpack for 2 MT products; the super-block sums spill to L1 once per group at MT = 8).
 * MT must be a compile-time constant at every call site (inlined: the loops unroll, the sums stay in registers). */
VINLINE void I4_NAME(tile2)(const int MT, const int8_t *s, int64_t M, const int32_t *aux, int64_t aw, int64_t K,
                           int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N,
                           const float *bias, int far) {
    const int64_t G = specgram_i4_groups(K), SB = (G + SBG - 1) / SBG;
    float acc[8][NB] __attribute__((aligned(64)));
    for (int r = 0; r < MT; ++r)
        for (int v = 0; v < NV; ++v) vf_store(acc[r] + v * VW, vf_zero());
    const uint8_t *at = wb;
    for (int64_t b = 0; b < SB; ++b) {
        const uint8_t *head = at;
        const int gb = G - b * SBG < SBG ? (int)(G - b * SBG) : SBG;   /* groups in this super-block */
        at += HEAD_BYTES;
        vi S[8][NV];                             /* sum_g sc I_g, row r, vector v */
        for (int r = 0; r < MT; ++r)
            for (int v = 0; v < NV; ++v) S[r][v] = vi_zero();
        for (int gi = 0; gi < gb; ++gi, at += CODES) {
            const int32_t *a4 = (const int32_t *)s + (b * SBG + gi) * STEPS * M + m0;   /* step 0, row m0 */
            vi ia[8][NV];                        /* I_g, row r, vector v */
            for (int r = 0; r < MT; ++r)
                for (int v = 0; v < NV; ++v) ia[r][v] = vi_zero();
#pragma GCC unroll 8
            for (int k4 = 0; k4 < STEPS; ++k4) {
                const uint8_t *p = at + k4 * 64;
                _mm_prefetch((const char *)p + PF_BYTES, _MM_HINT_T0);
                if (far) _mm_prefetch((const char *)p + PF_FAR_BYTES, _MM_HINT_T1);
                vi w[NV];
                unpack(p, w);
#pragma GCC unroll 8
                for (int r = 0; r < MT; ++r)
#pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) ia[r][v] = I4_DPB(ia[r][v], w[v], a4 + k4 * M + r);
            }
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                vi sc = vi_load_u8(head + SC_AT + gi * NB + v * VW);
#pragma GCC unroll 8
                for (int r = 0; r < MT; ++r) S[r][v] = vi_add(S[r][v], vi_mullo(ia[r][v], sc));
            }
        }
        vi mn_sum[8][NV];                        /* sum_g mn A_g, row r, vector v */
        for (int r = 0; r < MT; ++r)
            for (int v = 0; v < NV; ++v) mn_sum[r][v] = vi_zero();
        for (int p = 0; p < (gb + 1) / 2; ++p)
            for (int v = 0; v < NV; ++v) {
                vi mn = vi_load_u8_pairs(head + MN_AT + p * 2 * NB + v * 2 * VW);
                for (int r = 0; r < MT; ++r)
                    mn_sum[r][v] = I4_DPW(mn_sum[r][v], mn, vi_set1(aux[(m0 + r) * aw + SB + b * (SBG / 2) + p]));
            }
        for (int v = 0; v < NV; ++v) {
            vf d = vf_load((const float *)head + v * VW), dmin = vf_load((const float *)head + NB + v * VW);
            for (int r = 0; r < MT; ++r) {
                vf t = vf_mul(vi_to_f(S[r][v]), d);
                t = vf_sub(t, vf_mul(vi_to_f(mn_sum[r][v]), dmin));
                t = vf_mul(t, vf_set1(((const float *)aux)[(m0 + r) * aw + b]));
                vf_store(acc[r] + v * VW, vf_add(vf_load(acc[r] + v * VW), t));
            }
        }
    }
    store_tile(MT, (const float(*)[NB])acc, y, ldy, m0, n0, N, NULL, bias);
}

/* One register tile of 9 .. I4_MT rows: rows m0 .. m0 + MT - 1 of y, outputs n0 .. n0 + 31, from block wb; per super-block, the VW
 * outputs of one vector at a time (the super-block's codes stay in L1 for the next), so that a tile's registers hold
 * MT group sums and MT super-block sums (AVX-512: 24 of 32 at MT = 12). MT must be a compile-time constant at every
 * call site (inlined: the loops unroll, the sums stay in registers). */
VINLINE void I4_NAME(tile1)(const int MT, const int8_t *s, int64_t M, const int32_t *aux, int64_t aw, int64_t K,
                            int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N,
                            const float *bias, int far) {
    const int64_t G = specgram_i4_groups(K), SB = (G + SBG - 1) / SBG;
    float acc[I4_MT][NB] __attribute__((aligned(64)));
    for (int r = 0; r < MT; ++r)
        for (int v = 0; v < NV; ++v) vf_store(acc[r] + v * VW, vf_zero());
    const uint8_t *head = wb;
    for (int64_t b = 0; b < SB; ++b) {
        const int gb = G - b * SBG < SBG ? (int)(G - b * SBG) : SBG;   /* groups in this super-block */
        const uint8_t *codes = head + HEAD_BYTES;
        const int32_t *a0 = (const int32_t *)s + b * SBG * STEPS * M + m0;   /* group 0's step 0, row m0 */
        for (int v = 0; v < NV; ++v) {
            vi S[I4_MT];                             /* sum_g sc I_g, row r */
            for (int r = 0; r < MT; ++r) S[r] = vi_zero();
            for (int gi = 0; gi < gb; ++gi) {
                const uint8_t *at = codes + gi * CODES;
                const int32_t *a4 = a0 + gi * STEPS * M;
                vi ia[I4_MT];                        /* I_g, row r */
                for (int r = 0; r < MT; ++r) ia[r] = vi_zero();
#pragma GCC unroll 8
                for (int k4 = 0; k4 < STEPS; ++k4) {
                    const uint8_t *p = at + k4 * 64;
                    if (v == 0) {                    /* the later vectors read the same lines from L1 */
                        _mm_prefetch((const char *)p + PF_BYTES, _MM_HINT_T0);
                        if (far) _mm_prefetch((const char *)p + PF_FAR_BYTES, _MM_HINT_T1);
                    } else if (far) {                /* meanwhile keep memory busy: the next super-block into L2 */
                        _mm_prefetch((const char *)p + HEAD_BYTES + SBG * CODES, _MM_HINT_T1);
                    }
                    vi w = unpack_one(p, v);
#pragma GCC unroll 16
                    for (int r = 0; r < MT; ++r) ia[r] = I4_DPB(ia[r], w, a4 + k4 * M + r);
                }
                vi sc = vi_load_u8(head + SC_AT + gi * NB + v * VW);
#pragma GCC unroll 16
                for (int r = 0; r < MT; ++r) S[r] = vi_add(S[r], vi_mullo(ia[r], sc));
            }
            vi mn_sum[I4_MT];                        /* sum_g mn A_g, row r */
            for (int r = 0; r < MT; ++r) mn_sum[r] = vi_zero();
            for (int p = 0; p < (gb + 1) / 2; ++p) {
                vi mn = vi_load_u8_pairs(head + MN_AT + p * 2 * NB + v * 2 * VW);
                for (int r = 0; r < MT; ++r)
                    mn_sum[r] = I4_DPW(mn_sum[r], mn, vi_set1(aux[(m0 + r) * aw + SB + b * (SBG / 2) + p]));
            }
            vf d = vf_load((const float *)head + v * VW), dmin = vf_load((const float *)head + NB + v * VW);
            for (int r = 0; r < MT; ++r) {
                vf t = vf_mul(vi_to_f(S[r]), d);
                t = vf_sub(t, vf_mul(vi_to_f(mn_sum[r]), dmin));
                t = vf_mul(t, vf_set1(((const float *)aux)[(m0 + r) * aw + b]));
                vf_store(acc[r] + v * VW, vf_add(vf_load(acc[r] + v * VW), t));
            }
        }
        head = codes + gb * CODES;
    }
    store_tile(MT, (const float(*)[NB])acc, y, ldy, m0, n0, N, NULL, bias);
}

/* A tile of mt rows (1 .. I4_MT), each height its own compiled copy. */
static void I4_NAME(tile_any)(int mt, const int8_t *s, int64_t M, const int32_t *aux, int64_t aw, int64_t K,
                              int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N,
                              const float *bias, int far) {
#define TILE_CASE(h)                                                                                              \
    case h:                                                                                                       \
        if (h <= I4_MT) {                                                                                         \
            if (h <= TILE2_MT)                                                                                    \
                I4_NAME(tile2)(h <= TILE2_MT ? h : 1, s, M, aux, aw, K, m0, wb, y, ldy, n0, N, bias, far);        \
            else                                                                                                  \
                I4_NAME(tile1)(h <= I4_MT ? h : 1, s, M, aux, aw, K, m0, wb, y, ldy, n0, N, bias, far);           \
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

/* Block b for all M rows: ceil(M / I4_MT) tiles of balanced heights (the first reads the block from memory, the
 * others from L1). */
static void I4_NAME(block)(int64_t b, const int8_t *s, const int32_t *aux, int64_t aw, int64_t M,
                           int64_t K, const uint8_t *w, int64_t N, const float *bias, float *y, int64_t ldy) {
    const int64_t ntiles = (M + I4_MT - 1) / I4_MT;
    const uint8_t *wb = w + b * specgram_i4_block_bytes(K);
    for (int64_t t = 0; t < ntiles; ++t) {
        int64_t m0 = M * t / ntiles, m1 = M * (t + 1) / ntiles;
        I4_NAME(tile_any)((int)(m1 - m0), s, M, aux, aw, K, m0, wb, y, ldy, b * NB, N, bias, t == 0);
    }
}

static void I4_NAME(team)(const int8_t *s, const int32_t *aux, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                          const float *bias, float *y, int64_t ldy, deal_range *ranges, int nthreads) {
    const int64_t aw = specgram_i4_aux_words(K);
#define I4_BLOCK(b, more) ((void)(more), I4_NAME(block)(b, s, aux, aw, M, K, w, N, bias, y, ldy))
    DEAL_BLOCKS(ranges, nthreads, I4_BLOCK);
#undef I4_BLOCK
}
