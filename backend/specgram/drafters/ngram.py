"""N-gram lookup (as in vLLM's / HF's prompt_lookup): costs no model forward.

Take the last n tokens of prompt + output (n from n_max down to n_min); find their latest earlier
occurrence; propose the tokens that followed it. Strong on extraction, code edits and JSON that repeats keys.
A guided request also looks in its guide's text (a JSON schema's property names and enum values are the
likeliest continuations of its answer), after its own tokens at each n. Each proposal says where its tokens
came from: "prompt", "output" (the request's own output so far) or "guide".
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..request import Request
from .base import Drafter, PickFn, Proposal


def latest_hit(corpus: np.ndarray, suffix: np.ndarray) -> int:
    """-> the start of the latest occurrence of suffix in corpus (both int64 1-D), or -1."""
    n = len(suffix)
    if len(corpus) < n:
        return -1
    hits = np.flatnonzero((sliding_window_view(corpus, n) == suffix).all(axis=1))
    return int(hits[-1]) if hits.size else -1


def lookup(ids: np.ndarray, k: int, n_min: int, n_max: int,
           extra: np.ndarray | None = None) -> tuple[list[int], int, bool]:
    """ids: [L] int64 -> (up to k tokens that followed the latest earlier occurrence of the longest suffix that
    occurs, where they start in their corpus, whether that corpus is `extra` rather than ids). The longest
    suffix wins; at equal length ids before extra. ([], -1, False) when nothing matches."""
    L = len(ids)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = ids[L - n:]
        at = latest_hit(ids[:L - 1], suffix)                       # occurrences ending before the suffix itself
        if at >= 0:
            return ids[at + n:at + n + k].tolist(), at + n, False
        at = latest_hit(extra, suffix) if extra is not None and len(extra) else -1
        if at >= 0 and at + n < len(extra):
            return extra[at + n:at + n + k].tolist(), at + n, True
    return [], -1, False


class NgramDrafter(Drafter):
    def __init__(self, n_min: int = 2, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, reqs: list[Request], ks: list[int], pick: PickFn, prefixes: list[list[int]]) -> list[Proposal]:
        out = []
        for r, k, prefix in zip(reqs, ks, prefixes):
            rest = k - len(prefix)
            found, source = [], ""
            if rest > 0:
                extra = np.asarray(r.guide_ids, dtype=np.int64) if r.guide_ids else None
                found, start, in_guide = lookup(np.asarray(r.all_ids + prefix, dtype=np.int64), rest,
                                                self.n_min, self.n_max, extra)
                source = "guide" if in_guide else "prompt" if start < len(r.prompt_ids) else "output"
            out.append(Proposal(prefix + found, sources=["forced"] * len(prefix) + [source] * len(found)))
        return out
