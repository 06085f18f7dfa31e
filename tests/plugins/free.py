"""A free drafter plug-in (no forward): drafts TOKEN after a request's forced prefix, as deep as it is asked."""

from __future__ import annotations

from specgram.drafting.names import FORCED
from specgram.drafting.proposal import Proposal
from specgram.drafting.registry import DrafterSpec
from specgram.speculation.drafter import Drafter

from . import TOKEN

NAME = "fixed_token"  # the drafter and the source tag of its drafts
PRIOR = 0.0


class FixedTokenDrafter(Drafter):
    def __init__(self, source: str = NAME) -> None:
        self.source = source  # the tag of its drafts

    def propose(self, reqs, ks, pick, prefixes, hints):
        out = []
        for k, prefix in zip(ks, prefixes, strict=True):
            n = max(k - len(prefix), 0)
            out.append(Proposal(list(prefix) + [TOKEN] * n, sources=[FORCED] * len(prefix) + [self.source] * n))
        return out


def build(config) -> FixedTokenDrafter:
    return FixedTokenDrafter()


DRAFTERS = [
    DrafterSpec(
        NAME,
        f"a test plug-in: token {TOKEN}, repeated",
        {NAME: PRIOR},
        consults=False,  # drafts alone: under auto k no lookup competes with it
        make=f"{__name__}:build",
    )
]
