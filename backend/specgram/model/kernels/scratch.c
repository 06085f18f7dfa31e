/* Per-thread scratch, grown on demand (doubling) and reused across calls, freed when its thread exits. The
 * OpenMP pool threads persist, so once the largest shape has run, the kernels allocate nothing. */
#include "scratch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    void *p[SCRATCH_KINDS];
    size_t cap[SCRATCH_KINDS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg) {
    scratch_set *s = arg;
    for (int i = 0; i < SCRATCH_KINDS; ++i) free(s->p[i]);
    free(s);
}

static void scratch_init(void) {
    if (pthread_key_create(&scratch_key, scratch_free) != 0) {
        fprintf(stderr, "specgram kernels: pthread_key_create failed\n");
        abort();
    }
}

static void out_of_memory(size_t bytes) {
    fprintf(stderr, "specgram kernels: out of memory (%zu bytes of scratch)\n", bytes);
    abort();
}

void *specgram_scratch(int kind, size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    scratch_set *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        if ((s = calloc(1, sizeof *s)) == NULL) out_of_memory(sizeof *s);
        pthread_setspecific(scratch_key, s);
    }
    if (s->cap[kind] < bytes) {
        size_t cap = s->cap[kind] ? s->cap[kind] : 4096;
        while (cap < bytes) cap *= 2;
        free(s->p[kind]);
        if ((s->p[kind] = malloc(cap)) == NULL) out_of_memory(cap);
        s->cap[kind] = cap;
    }
    return s->p[kind];
}
