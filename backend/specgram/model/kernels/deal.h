/* Dealing a product's weight blocks to the threads of its OpenMP region (gemm.c, gemm_i8a8.c).
 *
 * Thread t owns the contiguous range [t * nblocks / nt, (t + 1) * nblocks / nt) and takes its blocks front to back,
 * one long stream that the prefetches run ahead in; a thread done with its own takes blocks from the back of the
 * others' ranges, so a preempted thread (2 cores shared with a server) holds up the call by at most the block it is
 * in. A range is one 64-bit word (lo in the low half, hi in the high half) on a cache line of its own, which only its
 * owner touches until someone takes from its back. Which thread computes a block changes no result.
 * Why not OpenMP's dynamic schedule: taking blocks two at a time from a shared counter moved that counter's cache
 * line between the cores on every take and broke each thread's stream into short pieces (int8 products of
 * SmolLM2-135M's 121 matrices from DRAM: these ranges take 0.83-0.86 of the chunks' time at 1-8 rows).
 */
#pragma once
#include <stdatomic.h>
#include <stdint.h>

typedef struct { _Alignas(64) _Atomic uint64_t lohi; } deal_range;

/* ranges [nthreads]: thread t's share of nblocks blocks. */
static inline void deal_init(deal_range *ranges, int64_t nblocks, int nthreads) {
    for (int t = 0; t < nthreads; ++t) {
        uint64_t lo = (uint64_t)(nblocks * t / nthreads), hi = (uint64_t)(nblocks * (t + 1) / nthreads);
        atomic_store_explicit(&ranges[t].lohi, lo | hi << 32, memory_order_relaxed);
    }
}

/* The next block of range r from its front -> 1 and *b (*more: r holds the block after it too), or 0 when empty. */
static inline int deal_take_front(deal_range *r, int64_t *b, int *more) {
    uint64_t v = atomic_load_explicit(&r->lohi, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo >= hi) return 0;
        if (atomic_compare_exchange_weak_explicit(&r->lohi, &v, v + 1, memory_order_relaxed, memory_order_relaxed)) {
            *b = lo, *more = lo + 1 < hi;
            return 1;
        }
    }
}

/* The last block of range r -> 1 and *b, or 0 when empty. */
static inline int deal_take_back(deal_range *r, int64_t *b) {
    uint64_t v = atomic_load_explicit(&r->lohi, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo >= hi) return 0;
        if (atomic_compare_exchange_weak_explicit(&r->lohi, &v, v - ((uint64_t)1 << 32), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *b = hi - 1;
            return 1;
        }
    }
}

/* Inside `#pragma omp parallel num_threads(nthreads)`: BLOCK(b, more) for every block, each exactly once, own range
 * first (a team smaller than nthreads still takes every block: absent threads' ranges are taken from the back). */
#define DEAL_BLOCKS(ranges, nthreads, BLOCK)                                                                      \
    do {                                                                                                         \
        int deal_id_ = omp_get_thread_num(), deal_more_;                                                         \
        int64_t deal_b_;                                                                                         \
        while (deal_take_front(&(ranges)[deal_id_], &deal_b_, &deal_more_)) BLOCK(deal_b_, deal_more_);          \
        for (int deal_i_ = 1; deal_i_ < (nthreads); ++deal_i_)                                                   \
            while (deal_take_back(&(ranges)[(deal_id_ + deal_i_) % (nthreads)], &deal_b_)) BLOCK(deal_b_, 0);    \
    } while (0)
