"""The two test drafters again, under other names and tags, declared likely (PRIOR): the same drafts, so that a
test sees what their declared prior alone changes (under num_draft_tokens auto their drafts are verified, where
the zero-prior ones' are not)."""

from __future__ import annotations

import dataclasses

from . import forward, free

FREE = "likely_token"  # the free drafter and the source tag of its drafts
FORWARD = "likely_model"  # the forward one and its tag
PRIOR = 0.9


def build_free(config) -> free.FixedTokenDrafter:
    return free.FixedTokenDrafter(FREE)


def build_forward(config) -> forward.TokenModelDrafter:
    return forward.TokenModelDrafter(FORWARD)


DRAFTERS = [
    dataclasses.replace(free.DRAFTERS[0], name=FREE, sources={FREE: PRIOR}, make=f"{__name__}:build_free"),
    dataclasses.replace(forward.DRAFTERS[0], name=FORWARD, sources={FORWARD: PRIOR}, make=f"{__name__}:build_forward"),
]
