/* gemm_i4.c's product loops, included by it twice: once where the CPU has VNNI (I4_DP = vi_dpbusd, one
 * instruction), once where it does not (I4_DP = vi_dpbusd_madd: vpmaddubsw, vpmaddwd, an add). Both form the same
 * exact int32 per group (gemm_i4.c's header), so the two give bitwise the same outputs. I4_NAME(f) names this
 * copy's functions. */
/* One register tile: rows m0 .. m0 + MT - 1 of y, outputs n0 .. n0 + 31, from block wb. D and MT must be
 * compile-time constants at every call site (inlined: the loops unroll, the accumulators stay in registers). */
VINLINE void I4_NAME(tile)(const int D, const int MT, const int8_t *s, int64_t ldq, const float *xs, const float *gs,
                  int64_t G, int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N,
                  const float *bias, int far) {
    float acc[8][NB] __attribute__((aligned(64)));
    for (int r = 0; r < MT; ++r)
        for (int v = 0; v < NV; ++v) vf_store(acc[r] + v * VW, vf_zero());
    const uint8_t *at = wb, *head = wb;
    for (int64_t g = 0; g < G; ++g) {
        if (g % SBG == 0) head = at, at += HEAD_BYTES;
        const uint8_t *sc = at, *mn = at + NB, *codes = at + 2 * NB;
        at += GROUP_BYTES;
        vi ia[8][NV];                                /* row r's digit d at [r * D + d]: MT * D <= 8 */
        for (int i = 0; i < MT * D; ++i)
            for (int v = 0; v < NV; ++v) ia[i][v] = vi_zero();
#pragma GCC unroll 8
        for (int k4 = 0; k4 < STEPS; ++k4) {
            const uint8_t *p = codes + k4 * 64;
            _mm_prefetch((const char *)p + PF_BYTES, _MM_HINT_T0);
            if (far) _mm_prefetch((const char *)p + PF_FAR_BYTES, _MM_HINT_T1);
            vi w[NV];
            unpack(p, w);
#pragma GCC unroll 8
            for (int i = 0; i < MT * D; ++i) {
                int32_t four;
                memcpy(&four, s + (m0 * D + i) * ldq + g * GK + 4 * k4, sizeof four);
                vi a = vi_set1(four);
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) ia[i][v] = I4_DP(ia[i][v], w[v], a);
            }
        }
        for (int v = 0; v < NV; ++v) {
            vf sv = vf_mul(vf_load((const float *)head + v * VW), vf_load_u8(sc + v * VW));
            vf mv = vf_mul(vf_load((const float *)head + NB + v * VW), vf_load_u8(mn + v * VW));
            for (int r = 0; r < MT; ++r) {
                vi I = D == 1 ? ia[r][v] : vi_add(vi_shl8(ia[r * D][v]), ia[r * D + 1][v]);
                vf t = vf_mul(vi_to_f(I), sv);
                t = vf_sub(t, vf_mul(mv, vf_set1(gs[(m0 + r) * G + g])));
                vf_store(acc[r] + v * VW, vf_add(vf_load(acc[r] + v * VW), t));
            }
        }
    }
    for (int r = 0; r < MT; ++r) {
        float *yrow = y + (m0 + r) * ldy;
        for (int v = 0; v < NV; ++v) {
            int64_t n = n0 + v * VW;
            vmask k = vmask_first(N - n);
            vf out = vf_mul(vf_load(acc[r] + v * VW), vf_set1(xs[m0 + r]));
            if (bias) out = vf_add(out, vf_maskz_load(k, bias + n));
            vf_mask_store(yrow + n, k, out);
        }
    }
}

static void I4_NAME(tile_any)(int digits, int mt, const int8_t *s, int64_t ldq, const float *xs, const float *gs,
                              int64_t G, int64_t m0, const uint8_t *wb, float *y, int64_t ldy, int64_t n0, int64_t N,
                              const float *bias, int far) {
#define TILE_CASE(D, h) case h: if (h < MT_MAX(D)) { I4_NAME(tile)(D, h < MT_MAX(D) ? h : 1, s, ldq, xs, gs, G, m0, \
                                  wb, y, ldy, n0, N, bias, far); break; } __attribute__((fallthrough));
    if (digits == 1) {
        switch (mt) {
        TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3) TILE_CASE(1, 4) TILE_CASE(1, 5) TILE_CASE(1, 6) TILE_CASE(1, 7)
        default: I4_NAME(tile)(1, MT_MAX(1), s, ldq, xs, gs, G, m0, wb, y, ldy, n0, N, bias, far);
        }
    } else {
        switch (mt) {
        TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3)
        default: I4_NAME(tile)(2, MT_MAX(2), s, ldq, xs, gs, G, m0, wb, y, ldy, n0, N, bias, far);
        }
    }
#undef TILE_CASE
}

static void I4_NAME(block)(int64_t b, const int8_t *s, int64_t ldq, int digits, const float *xs, const float *gs,
                           int64_t M, int64_t K, const uint8_t *w, int64_t N, const float *bias, float *y,
                           int64_t ldy) {
    const int64_t mt_max = MT_MAX(digits), G = specgram_i4_groups(K), ntiles = (M + mt_max - 1) / mt_max;
    const uint8_t *wb = w + b * specgram_i4_block_bytes(K);
    for (int64_t t = 0; t < ntiles; ++t) {
        int64_t m0 = t * mt_max;
        int mt = (int)(M - m0 < mt_max ? M - m0 : mt_max);
        I4_NAME(tile_any)(digits, mt, s, ldq, xs, gs, G, m0, wb, y, ldy, b * NB, N, bias, ntiles == 1);
    }
}

static void I4_NAME(team)(const int8_t *s, const float *xs, const float *gs, int64_t M, int64_t K,
                          const uint8_t *w, int digits, int64_t N, const float *bias, float *y, int64_t ldy,
                          deal_range *ranges, int nthreads) {
    const int64_t ldq = specgram_i8a8_ldq(K);
#define I4_BLOCK(b, more) ((void)(more), I4_NAME(block)(b, s, ldq, digits, xs, gs, M, K, w, N, bias, y, ldy))
    DEAL_BLOCKS(ranges, nthreads, I4_BLOCK);
#undef I4_BLOCK
}
