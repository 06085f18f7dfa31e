/* Which instruction set this build of the kernels targets (vec.h): "avx512" or "avx2". The loader checks it
 * against the build it asked for. */
#include "vec.h"

const char *specgram_isa(void) { return SPECGRAM_ISA; }
