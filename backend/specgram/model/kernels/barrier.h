/* A barrier for the threads of one OpenMP team that pulls weights into L2 while it waits (forward.c).
 *
 * Between the phases of a decoder layer one thread often waits on the other: an elementwise phase of one decode row
 * runs on one thread, and attention over 3 KV heads leaves one of 2 threads a head short. A waiting thread here
 * prefetches the next weight product's bytes that it will stream first (a `pull`: its share's start), so the
 * product starts from cache instead of from DRAM; past that it spins, and after SPINS spins yields the core (a
 * thread preempted by another process then gets it back sooner). Prefetching changes no result.
 * Ordering: every thread's writes before the barrier are visible to every thread after it (the arrival count is
 * acquire-release, the epoch store release and its loads acquire).
 */
#pragma once
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#ifndef SPINS
#define SPINS 20000   /* pauses before a waiting thread starts yielding */
#endif

typedef struct {
    _Alignas(64) _Atomic uint32_t arrived;
    _Alignas(64) _Atomic uint32_t epoch;
} team_barrier;

/* What a waiting thread prefetches: [at, end), advanced as it goes (per thread, kept across barriers). */
typedef struct { const char *at, *end; } pull;

/* Called by all nt threads of the team; *epoch: the thread's own count of barriers passed (0 at the start). */
static inline void team_wait(team_barrier *b, int nt, uint32_t *epoch, pull *p) {
    uint32_t e = ++*epoch;
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == (uint32_t)nt) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);      /* nobody arrives before the release */
        atomic_store_explicit(&b->epoch, e, memory_order_release);
        return;
    }
    for (uint32_t spins = 0; atomic_load_explicit(&b->epoch, memory_order_acquire) != e;) {
        if (p->at < p->end) {
            _mm_prefetch(p->at, _MM_HINT_T1);
            p->at += 64;
        } else if (++spins < SPINS) {
            _mm_pause();
        } else {
            sched_yield();
        }
    }
}
