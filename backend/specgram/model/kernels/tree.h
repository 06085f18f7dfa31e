/* A token's ancestor mask in a tree of drafts (forward.c's `tree`): bit b set = the token attends to the position
 * b below its own in its slot (bit 0: itself); positions more than 63 below it are always attended (the committed
 * tokens before a verify row). A verify row's tokens sit at consecutive cache positions (a node's storage), in an
 * order where every parent comes before its children; a node attends to the committed tokens and its own
 * ancestors only, and rotates by its logical position: its depth past the row's first token (the attended
 * positions, in order, are the logical positions 0 .. logical). All bits set: plain causal attention, the
 * logical position is the storage position. Internal to the library.
 */
#pragma once
#include <stdint.h>

#define TREE_ALL (~(uint64_t)0)

/* The bits of the mask that name a position (pos - b >= 0): bits 0 .. min(pos, 63). */
static inline uint64_t tree_named(int64_t pos) { return pos >= 63 ? TREE_ALL : ((uint64_t)2 << pos) - 1; }

/* Whether the token at pos attends causally (every named bit set). */
static inline int tree_causal(uint64_t m, int64_t pos) { return (m & tree_named(pos)) == tree_named(pos); }

/* The token's logical position (its rotary position): pos less the positions it skips. */
static inline int64_t tree_logical(uint64_t m, int64_t pos) {
    return pos - (int64_t)__builtin_popcountll(~m & tree_named(pos));
}

/* The first position the token at pos attends to, the last `window` attended positions only (window > 0). */
static inline int64_t tree_first(uint64_t m, int64_t pos, int64_t window) {
    int64_t near = pos < 63 ? pos : 63, far = pos - near;    /* [0, far) always attended */
    int64_t total = tree_logical(m, pos) + 1, skip = window > 0 && window < total ? total - window : 0;
    if (skip < far) return skip;
    skip -= far;
    for (int64_t b = near; b >= 0; --b)
        if (m >> b & 1 && skip-- == 0) return pos - b;
    return pos;
}
