/* Facts about this build: which instruction set it targets (vec.h: "avx512" or "avx2"; the loader checks it
 * against the build it asked for), and the size of each struct of specgram.h as this compiler lays it out (the
 * tests check abi.py's ctypes mirrors against them). */
#include "specgram.h"
#include "vec.h"

const char *specgram_isa(void) { return SPECGRAM_ISA; }

void specgram_abi_sizes(int64_t *sizes) {
    sizes[0] = (int64_t)sizeof(specgram_linear);
    sizes[1] = (int64_t)sizeof(specgram_layer);
    sizes[2] = (int64_t)sizeof(specgram_decoder);
    sizes[3] = (int64_t)sizeof(specgram_lora_part);
    sizes[4] = (int64_t)sizeof(specgram_lora);
}
