/* The FMA peak a matrix product could reach here: each of nthreads threads runs 24 independent chains of
 * vector fmas in registers (no memory traffic), iters rounds -> the flops done (2 per lane per fma). Built
 * for the ISA the native kernels use (-mavx512f: 16 lanes; -mavx2 -mfma: 8 lanes) by benchlib/peak.py. */
#include <immintrin.h>
#include <stdint.h>

#ifdef __AVX512F__
typedef __m512 v;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define STORE _mm512_storeu_ps
#else
typedef __m256 v;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define STORE _mm256_storeu_ps
#endif
#define CHAINS 24   /* more independent chains than FMA latency x pipes, so the pipes never wait */

double fma_flops(int64_t iters, int nthreads) {
    double total = 0;
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
    {
        v a[CHAINS], b = SET1(1.0000001f), c = SET1(1e-7f);
        for (int i = 0; i < CHAINS; ++i) a[i] = SET1((float)i);
        for (int64_t t = 0; t < iters; ++t)
#pragma GCC unroll 24
            for (int i = 0; i < CHAINS; ++i) a[i] = FMA(a[i], b, c);
        float sink = 0, lane[LANES];
        for (int i = 0; i < CHAINS; ++i) STORE(lane, a[i]), sink += lane[0];
        total += (double)iters * CHAINS * LANES * 2 + (sink == -1.0f);   /* the results are used: not elided */
    }
    return total;
}
