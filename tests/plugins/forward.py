"""A forward drafter plug-in: a stand-in for a draft model with a cache of its own. It reads a request's prompt
when the planner admits it for drafting (admit, now=True), drafts only for requests whose prompt it read, one
"forward" per depth (each drafting TOKEN), and records the lookup drafts the planner hands it (hints)."""

from __future__ import annotations

from specgram.drafting.names import FORCED
from specgram.drafting.proposal import Proposal
from specgram.drafting.registry import DrafterSpec
from specgram.speculation.drafter import Drafter

from . import TOKEN

NAME = "token_model"  # the drafter and the source tag of its drafts
PRIOR = 0.0


class TokenModelDrafter(Drafter):
    reads_prompts = True

    def __init__(self, source: str = NAME) -> None:
        self.source = source  # the tag of its drafts
        self.read: set[int] = set()  # the requests whose prompt it read
        self.forwards = 0  # depth levels run, over every call
        self.hints: list[list[int]] = []  # the hints of every request it drafted for, in order

    def admit(self, reqs, now=True):
        if now:
            self.read.update(r.request_id for r in reqs)

    def started(self, req) -> bool:
        return req.request_id in self.read

    def propose(self, reqs, ks, pick, prefixes, hints):
        depth = max((k - len(p) for k, p in zip(ks, prefixes, strict=True)), default=0)
        self.forwards += max(depth, 0)
        self.hints += [list(h) for h in hints]
        out = []
        for r, k, prefix in zip(reqs, ks, prefixes, strict=True):
            n = max(k - len(prefix), 0) if self.started(r) else 0
            out.append(Proposal(list(prefix) + [TOKEN] * n, sources=[FORCED] * len(prefix) + [self.source] * n))
        return out

    def release(self, req) -> None:
        self.read.discard(req.request_id)


def build(config) -> TokenModelDrafter:
    return TokenModelDrafter()


DRAFTERS = [
    DrafterSpec(
        NAME,
        f"a test plug-in: a stand-in model drafting token {TOKEN} at every depth",
        {NAME: PRIOR},
        forward=True,
        consults=False,  # no lookup beside it under auto k: its own prior alone decides its depth
        make=f"{__name__}:build",
    )
]
