"""N-gram lookup (as in vLLM's / HF's prompt_lookup): costs no model forward.

Take the last n tokens of prompt + output (n from n_max down to n_min); find their latest earlier
occurrences; propose the tokens that followed one of them. Strong on extraction, code edits and JSON that
repeats keys. A guided request also looks in its guide's text (a JSON schema's property names and enum values
are the likeliest continuations of its answer), after its own tokens at each n.

Guided requests rank the candidates by the grammar: at the longest n that has a continuation whose first
token is legal, the candidate with the longest legal prefix wins (cut to that prefix). A schema quoted in the
prompt follows a key with `": {"type"`, the answer with `": "value"`: the latest occurrence is often illegal
where an earlier or shorter match is right. Unguided requests take the latest occurrence at the longest n.
Each proposal says where its tokens came from: "prompt", "output" (the request's own output so far) or
"guide".
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..request import Request
from .drafter import Drafter, PickFn, Proposal

# candidates looked at per corpus and suffix length: later occurrences first (measured on JME prompts: more than
# 4 changed no draft)
MAX_OCCURRENCES = 4


def latest_hits(corpus: np.ndarray, suffix: np.ndarray, limit: int) -> np.ndarray:
    """-> the starts of the latest `limit` occurrences of suffix in corpus (both int64 1-D), latest first."""
    n = len(suffix)
    if len(corpus) < n:
        return np.empty(0, dtype=np.int64)
    hits = np.flatnonzero((sliding_window_view(corpus, n) == suffix).all(axis=1))
    return hits[::-1][:limit]


def candidates(ids: np.ndarray, k: int, n_min: int, n_max: int, extra: np.ndarray | None = None,
               limit: int = MAX_OCCURRENCES) -> Iterator[tuple[int, list[int], int, bool]]:
    """ids: [L] int64 -> (n, up to k tokens that followed an earlier occurrence of the last n ids, where they
    start in their corpus, whether that corpus is `extra` rather than ids), longest n first, then ids' own
    occurrences latest first, then extra's. Only non-empty continuations."""
    L = len(ids)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = ids[L - n:]
        for corpus, in_extra, searched in ((ids, False, ids[:L - 1]), (extra, True, extra)):
            if corpus is None or not len(corpus):
                continue
            for at in latest_hits(searched, suffix, limit).tolist():  # in ids: ending before the suffix itself
                if at + n < len(corpus):
                    yield n, corpus[at + n:at + n + k].tolist(), at + n, in_extra


def lookup(ids: np.ndarray, k: int, n_min: int, n_max: int, extra: np.ndarray | None = None,
           legal: Callable[[list[int]], int] | None = None) -> tuple[list[int], int, bool]:
    """-> (draft, where it starts in its corpus, whether that corpus is extra). Without `legal`: the first
    candidate (longest n, latest, ids before extra). With legal(tokens) -> how many of them the grammar
    accepts: at the longest n with a legal candidate, the one with the longest legal prefix, cut to it (ties:
    the earlier candidate). ([], -1, False) when nothing matches."""
    best: tuple[list[int], int, bool] = ([], -1, False)
    best_n = 0
    for n, tokens, start, in_extra in candidates(ids, k, n_min, n_max, extra):
        if legal is None:
            return tokens, start, in_extra
        if n < best_n:
            break
        m = legal(tokens)
        if m > len(best[0]):
            best, best_n = (tokens[:m], start, in_extra), n
    return best


class NgramDrafter(Drafter):
    def __init__(self, n_min: int, n_max: int):       # EngineConfig.ngram_min / ngram_max
        self.n_min, self.n_max = n_min, n_max

    def propose(self, reqs: list[Request], ks: list[int], pick: PickFn, prefixes: list[list[int]]) -> list[Proposal]:
        out = []
        for r, k, prefix in zip(reqs, ks, prefixes):
            rest = k - len(prefix)
            found, source = [], ""
            if rest > 0:
                extra = np.asarray(r.guide_ids, dtype=np.int64) if r.guide_ids else None
                # the guide's matcher already holds the prefix tentatively (forced tokens)
                legal = r.guide.legal_prefix if r.guide is not None else None
                found, start, in_guide = lookup(np.asarray(r.all_ids + prefix, dtype=np.int64), rest,
                                                self.n_min, self.n_max, extra, legal)
                source = "guide" if in_guide else "prompt" if start < len(r.prompt_ids) else "output"
            out.append(Proposal(prefix + found, sources=["forced"] * len(prefix) + [source] * len(found)))
        return out
