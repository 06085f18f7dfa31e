"""Suffix drafting (drafter "suffix"): drafts what other requests' recent outputs continued the last tokens with.

The store (suffix_store.py) holds the outputs of finished requests, each under its request's scope: its LoRA
adapter and its cache_salt (Request.scope). A request reads only its own scope: requests with different salts
never draft from each other's outputs. Every request that finished by stop or length with an output longer than
the store's key enters it, whatever drafter it used (release()); an errored, cancelled, timed-out or empty one
teaches nothing (its tokens are not an answer to draft from). Drafts are deterministic (one-hot) and verified
like any other: output is unchanged.

Cost per proposal: one dict lookup of the last KEY tokens, a bounded walk over at most MAX_OCCURRENCES
occurrences (suffix_store.py), and for a guided request one legal_prefix check of the drafts.
"""

from __future__ import annotations

from ..drafting.names import FORCED, SUFFIX_STORE
from ..drafting.proposal import Proposal
from ..request import Request
from ..wire import FinishReason
from .drafter import Drafter, PickFn
from .suffix_store import KEY, MAX_MATCH, SuffixStore

LEAD = 4  # prompt tokens stored before each output
ANSWERS = (FinishReason.STOP, FinishReason.LENGTH)  # the endings whose outputs are stored


class SuffixDrafter(Drafter):
    def __init__(self, store: SuffixStore):
        self.store = store

    def propose(
        self, reqs: list[Request], ks: list[int], pick: PickFn, prefixes: list[list[int]], hints: list[list[int]]
    ) -> list[Proposal]:
        out = []
        for r, k, prefix in zip(reqs, ks, prefixes, strict=True):
            found: list[int] = []
            if k > len(prefix):
                context = _tail(r, MAX_MATCH) + list(prefix)
                found, _ = self.store.lookup(r.scope, context, k - len(prefix))
                if found and r.guide is not None:  # the matcher holds the prefix tentatively (forced tokens)
                    found = found[: r.guide.legal_prefix(found)]
            out.append(Proposal(list(prefix) + found, sources=[FORCED] * len(prefix) + [SUFFIX_STORE] * len(found)))
        return out

    def release(self, req: Request) -> None:
        """req finished or was aborted: an answer (ANSWERS, more than KEY tokens) joins the store under its scope,
        after the prompt's last LEAD tokens (a chat template's assistant header: what the next answer's first
        drafts follow)."""
        if req.finish_reason in ANSWERS and len(req.output_ids) > KEY:
            self.store.add(req.scope, req.prompt_ids[-LEAD:] + req.output_ids)


def _tail(req: Request, n: int) -> list[int]:
    """The last n of req's prompt and output tokens (without copying a long prompt)."""
    out = req.output_ids[-n:]
    need = n - len(out)
    return (req.prompt_ids[-need:] if need else []) + out


def build(config) -> SuffixDrafter | None:
    """The engine's suffix drafter (None: suffix_store_mb 0)."""
    if config.suffix_store_mb <= 0:
        return None
    store = SuffixStore(config.suffix_store_entries, config.suffix_store_mb << 20, config.suffix_min_prob)
    return SuffixDrafter(store)
