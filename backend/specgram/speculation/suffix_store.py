"""The suffix store: recent outputs of finished requests, and the likeliest continuation of a context among them.

What suffix decoding (Arctic Inference, vLLM's `method: suffix`) drafts from: a request's last tokens are looked
up in the outputs that other requests produced lately, and the continuation those outputs agree on is drafted, as
deep as their counts say it is likely. Prompt lookup (ngram.py) reads only the request's own prompt and output;
this store carries what recurs *across* requests (one instruction applied to a stream of inputs, an agent's tool
calls).

Layout: outputs (entries, int32 arrays) in least-recently-used order, each under a scope (the LoRA adapter and
the request's cache_salt: a scope never sees another's entries); per scope an index from each KEY-token window
(one int) to its occurrences, each one int (entry id << SHIFT | the position just past the window), in the order
they were added (ascending: an entry's occurrences are one bisected slice). A lookup takes the context's last KEY
tokens, extends each of the window's latest MAX_OCCURRENCES occurrences backwards (up to MAX_MATCH tokens),
keeps those with the longest match, and walks their continuations: at each depth the token most of the
still-agreeing occurrences continue with, while the product of those shares stays at or above min_prob (an
occurrence that ends there counts against).

Bounded memory: at most max_entries outputs and max_bytes (BYTES_PER_TOKEN per stored token, the index
included); adding past either evicts the least recently used (an entry is used when it is added or a draft
follows it). Outputs longer than MAX_LEN tokens are stored up to MAX_LEN.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass

KEY = 2  # tokens in an index window: the shortest match that drafts
MAX_MATCH = 16  # a match is extended backwards this far at most
MAX_OCCURRENCES = 64  # occurrences of a window looked at per lookup, the latest first
SHIFT = 16  # an occurrence: entry id << SHIFT | position
MAX_LEN = (1 << SHIFT) - 1
# what the byte cap counts per stored token: the token (4 B), its occurrence (a 32-byte int and its list slot)
# and, for a window not seen before, its key, list and dict slot; an upper bound over outputs of unrelated tokens
# (each window new), measured with tracemalloc (tests/unit/test_suffix.py); repeated text costs less
BYTES_PER_TOKEN = 200


@dataclass
class _Entry:
    scope: tuple
    tokens: array


class SuffixStore:
    def __init__(self, max_entries: int, max_bytes: int, min_prob: float = 0.1):
        self.max_entries, self.max_bytes, self.min_prob = max_entries, max_bytes, min_prob
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # id -> entry, least recently used first
        self.index: dict[tuple, dict[int, list[int]]] = {}  # scope -> window -> occurrences, ascending
        self.bytes = 0
        self._next = 0

    def add(self, scope: tuple, tokens: list[int]) -> None:
        """A finished request's output (with whatever lead-in the caller puts first), under its scope. Outputs of
        KEY tokens or fewer teach nothing."""
        tokens = tokens[:MAX_LEN]
        size = len(tokens) * BYTES_PER_TOKEN
        if len(tokens) <= KEY or self.max_entries <= 0 or size > self.max_bytes:
            return
        eid, self._next = self._next, self._next + 1
        self.entries[eid] = _Entry(scope, array("i", tokens))
        self.bytes += size
        windows = self.index.setdefault(scope, {})
        base = eid << SHIFT
        for end in range(KEY, len(tokens)):
            windows.setdefault(_window(tokens, end), []).append(base | end)
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        eid, entry = self.entries.popitem(last=False)
        self.bytes -= len(entry.tokens) * BYTES_PER_TOKEN
        windows = self.index[entry.scope]
        lo, hi = eid << SHIFT, (eid + 1) << SHIFT
        for end in range(KEY, len(entry.tokens)):
            key = _window(entry.tokens, end)
            where = windows.get(key)
            if where is None:
                continue  # a window that occurs twice in the entry: its occurrences went with the first
            del where[bisect_left(where, lo) : bisect_left(where, hi)]
            if not where:
                del windows[key]
        if not windows:
            del self.index[entry.scope]

    def lookup(self, scope: tuple, context: list[int], k: int) -> tuple[list[int], list[float]]:
        """-> (up to k tokens continuing `context` as the scope's stored outputs continue it, per token the share
        of the agreeing occurrences that continue with it). ([], []) where nothing matches."""
        windows = self.index.get(scope)
        if windows is None or k <= 0 or len(context) < KEY:
            return [], []
        where = windows.get(_window(context, len(context)))
        if not where:
            return [], []
        occurrences = self._longest(where[: -MAX_OCCURRENCES - 1 : -1], context)
        tokens: list[int] = []
        shares: list[float] = []
        chance = 1.0
        for depth in range(k):
            counts: dict[int, list[tuple[array, int]]] = {}
            for seq, end in occurrences:
                if end + depth < len(seq):
                    counts.setdefault(seq[end + depth], []).append((seq, end))
            if not counts:
                break
            token, agree = max(counts.items(), key=lambda kv: len(kv[1]))
            share = len(agree) / len(occurrences)
            if chance * share < self.min_prob:
                break
            chance *= share
            tokens.append(token)
            shares.append(share)
            occurrences = agree
        return tokens, shares

    def _longest(self, occurrences: list[int], context: list[int]) -> list[tuple[array, int]]:
        """The occurrences whose match with the context's end runs longest backwards (KEY at least), as
        (tokens, position past the window); each entry they come from counts as used."""
        best, out, used = 0, [], []
        for occ in occurrences:
            eid, end = occ >> SHIFT, occ & MAX_LEN
            seq = self.entries[eid].tokens
            n = KEY
            while n < MAX_MATCH and n < len(context) and end - n - 1 >= 0 and seq[end - n - 1] == context[-n - 1]:
                n += 1
            if n > best:
                best, out, used = n, [(seq, end)], [eid]
            elif n == best:
                out.append((seq, end))
                used.append(eid)
        for eid in used:
            self.entries.move_to_end(eid)
        return out


def _window(tokens, end: int) -> int:
    """The KEY tokens before `end`, as one int (token ids are below 2^32)."""
    return (tokens[end - 2] << 32) | tokens[end - 1]
