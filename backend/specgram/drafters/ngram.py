"""N-gram prompt lookup (as in vLLM's / HF's prompt_lookup): costs no model forward.

Take the last n tokens of prompt + output (n from n_max down to n_min); find their latest earlier
occurrence; propose the tokens that followed it. Strong on extraction, code edits and JSON that repeats keys.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..request import Request
from .base import Drafter, PickFn, Proposal


def lookup(ids: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """ids: [L] int64 -> up to k tokens that followed the latest earlier occurrence of the longest suffix."""
    L = len(ids)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = ids[L - n:]
        windows = sliding_window_view(ids[:L - 1], n)             # [L - n, n], windows ending before the suffix
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return ids[start:start + k].tolist()
    return []


class NgramDrafter(Drafter):
    def __init__(self, n_min: int = 2, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, reqs: list[Request], ks: list[int], pick: PickFn, prefixes: list[list[int]]) -> list[Proposal]:
        out = []
        for r, k, prefix in zip(reqs, ks, prefixes):
            rest = k - len(prefix)
            found = lookup(np.asarray(r.all_ids + prefix, dtype=np.int64), rest, self.n_min, self.n_max) if rest else []
            out.append(Proposal(prefix + found))
        return out
