"""N-gram lookup (as in vLLM's / HF's prompt_lookup): costs no model forward.

Take the last n tokens of prompt + output (n from n_max down to n_min); find their latest earlier
occurrences; propose the tokens that followed one of them. Strong on extraction, code edits and JSON that
repeats keys. A guided request also looks in its guide's text (a JSON schema's property names and enum values
are the likeliest continuations of its answer), after its own tokens at each n.

Guided requests rank the candidates by the grammar: at the longest n that has a continuation whose first
token is legal, the candidate with the longest legal prefix wins (cut to that prefix). A schema quoted in the
prompt follows a key with `": {"type"`, the answer with `": "value"`: the latest occurrence is often illegal
where an earlier or shorter match is right. Unguided requests take the latest occurrence at the longest n.
Each proposal says where its tokens came from: PROMPT, OUTPUT (the request's own output so far) or GUIDE
(drafting/names.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..drafting.names import FORCED, GUIDE, OUTPUT, PROMPT
from ..drafting.proposal import Proposal
from ..request import Request
from .drafter import Drafter, PickFn

# candidates looked at per corpus and suffix length, later occurrences first: a bound on the lookup's work per
# step (docs/architecture.md, the step)
MAX_OCCURRENCES = 4


def match_ends(corpus: np.ndarray, ids: np.ndarray, searched: int, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (e, m): the positions e < searched of corpus where ids' last token occurs, latest first, and per e the
    length m (<= n_max) of the longest suffix of ids that ends at corpus[e]. One comparison over the corpus,
    then one per extra suffix token over the hits only (not a sliding window per n)."""
    ends = np.flatnonzero(corpus[:searched] == ids[-1])[::-1]
    m = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for j in range(1, n_max):
        back = ends - j
        alive &= back >= 0
        alive[alive] = corpus[back[alive]] == ids[-1 - j]
        if not alive.any():
            break
        m += alive
    return ends, m


def candidates(
    ids: np.ndarray, k: int, n_min: int, n_max: int, extra: np.ndarray | None = None, limit: int = MAX_OCCURRENCES
) -> Iterator[tuple[int, list[int], int, bool]]:
    """ids: [L] int64 -> (n, up to k tokens that followed an earlier occurrence of the last n ids, where they
    start in their corpus, whether that corpus is `extra` rather than ids), longest n first, then ids' own
    occurrences latest first (the latest `limit` per n), then extra's. Only non-empty continuations."""
    L = len(ids)
    top = min(n_max, L - 1)
    if top < n_min:
        return
    # an occurrence in ids ends before the suffix itself does (it may overlap it)
    corpora = [(ids, False, *match_ends(ids, ids, L - 1, top))]
    if extra is not None and len(extra):
        corpora.append((extra, True, *match_ends(extra, ids, len(extra), top)))
    for n in range(top, n_min - 1, -1):
        for corpus, in_extra, ends, m in corpora:
            for e in ends[m >= n][:limit].tolist():
                if e + 1 < len(corpus):
                    yield n, corpus[e + 1 : e + 1 + k].tolist(), e + 1, in_extra


def lookup(
    ids: np.ndarray,
    k: int,
    n_min: int,
    n_max: int,
    extra: np.ndarray | None = None,
    legal: Callable[[list[int]], int] | None = None,
) -> tuple[list[int], int, bool]:
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
    def __init__(self, n_min: int, n_max: int):  # EngineConfig.ngram_min / ngram_max
        self.n_min, self.n_max = n_min, n_max
        self.alternatives = 0  # > 0: up to this many other continuations kept (Proposal.others: trees)

    def propose(
        self, reqs: list[Request], ks: list[int], pick: PickFn, prefixes: list[list[int]], hints: list[list[int]]
    ) -> list[Proposal]:
        out = []
        for r, k, prefix in zip(reqs, ks, prefixes, strict=True):
            rest = k - len(prefix)
            found, source, others = [], "", []
            if rest > 0:
                extra = np.asarray(r.guide_ids, dtype=np.int64) if r.guide_ids else None
                # the guide's matcher already holds the prefix tentatively (forced tokens)
                legal = r.guide.legal_prefix if r.guide is not None else None
                ids = np.asarray(r.all_ids + prefix, dtype=np.int64)
                found, start, in_guide = lookup(ids, rest, self.n_min, self.n_max, extra, legal)
                source = GUIDE if in_guide else PROMPT if start < len(r.prompt_ids) else OUTPUT
                if self.alternatives and found:
                    more = alternatives(ids, rest, self.n_min, self.n_max, extra, found, self.alternatives)
                    others = [prefix + t for t in more]
            prop = Proposal(prefix + found, sources=[FORCED] * len(prefix) + [source] * len(found), others=others)
            out.append(prop)
        return out


def build(config) -> NgramDrafter:
    return NgramDrafter(config.ngram_min, config.ngram_max)


def alternatives(
    ids: np.ndarray, k: int, n_min: int, n_max: int, extra: np.ndarray | None, chosen: list[int], most: int
) -> list[list[int]]:
    """Up to `most` other continuations than `chosen` (branches of a tree of drafts, speculation/trees.py), in
    lookup's order (longest n, latest first), each leaving chosen's and the earlier ones' tokens somewhere.
    Unchecked by the grammar: the tree's planner checks each node it verifies."""
    seen = [chosen]
    for _, tokens, _, _ in candidates(ids, k, n_min, n_max, extra):
        if not any(s[: len(tokens)] == tokens for s in seen):
            seen.append(tokens)
            if len(seen) > most:
                break
    return seen[1:]
