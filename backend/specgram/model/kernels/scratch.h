/* Per-thread scratch memory for the kernels (scratch.c). */
#pragma once
#include <stddef.h>

/* Two buffers per thread, because the calling thread is also one of an OpenMP region's workers: SCRATCH_PLAN
 * for work taken on the calling thread before a parallel region, SCRATCH_TASK for work inside it. */
enum { SCRATCH_PLAN, SCRATCH_TASK, SCRATCH_KINDS };

/* -> this thread's buffer `kind`, at least `bytes` long; contents undefined. Aborts when out of memory. */
__attribute__((visibility("hidden"))) void *specgram_scratch(int kind, size_t bytes);
