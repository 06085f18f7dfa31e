"""A drafter's proposal: the draft tokens for one request and one step, where each came from, and the tree
material (branches) that may go with them. Shared by the drafters, the planners, the token choice and the verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .names import FORCED


def depths(parents: list[int]) -> list[int]:
    """Each token's depth (its position past the row's first token)."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if p >= i or (p < 0) != (i == 0):
            raise ValueError(f"tree row: token {i}'s parent {p} must be an earlier token (-1 for the first only)")
        out.append(0 if p < 0 else out[p] + 1)
    return out


@dataclass
class Branch:
    """A draft off the proposal's line (a tree of drafts): the verify row's token `parent` (0: the last committed
    token, i: draft i - 1 of the line, past the line: an earlier branch) is followed by `token` here."""

    parent: int
    token: int
    source: str
    chance: float  # the estimated probability that the target's path takes this token
    key: str = ""  # its estimate's key (speculation/trees.py: what a verify teaches)


@dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), V] draft distribution (sampled requests); None = one-hot
    sources: list[str] | None = None  # per token, where it came from (statistics, adaptive k); None = the
    # engine tags the forced prefix FORCED and the rest by the drafter
    # tree material (speculation/trees.py): per draft index, a second-best token and the drafter's probability of
    # it; other whole continuations (from the proposal's start); the branches chosen to verify
    alts: dict[int, tuple[int, float]] = field(default_factory=dict)
    others: list[list[int]] = field(default_factory=list)
    branches: list[Branch] = field(default_factory=list)

    def cut(self, n: int) -> Proposal:
        """The first n drafts (the proposal itself when it is not longer), with their tree material; a cut line
        keeps no branches (they are chosen after the cuts)."""
        if n >= len(self.tokens):
            return self
        probs, sources = self.probs, self.sources
        return Proposal(
            self.tokens[:n],
            None if probs is None else probs[:n],
            None if sources is None else sources[:n],
            {i: a for i, a in self.alts.items() if i < n},
            self.others,
        )

    @property
    def parents(self) -> list[int] | None:
        """Its verify row's parents (model/tree.py) where it has branches, else None (a plain row)."""
        if not self.branches:
            return None
        return [-1, *range(len(self.tokens)), *(b.parent for b in self.branches)]

    @property
    def depths(self) -> list[int]:
        """Each token of its verify row at its depth past the last committed token (a line: its index)."""
        parents = self.parents
        return depths(parents) if parents is not None else list(range(1 + len(self.tokens)))

    def tagged(self, n_forced: int, source: str) -> Proposal:
        """This proposal with its per-token sources: the drafter's own tags, else the forced prefix then `source`
        (the drafter's: registry.source_of)."""
        if self.sources is None:
            n = len(self.tokens)
            self.sources = [FORCED] * min(n_forced, n) + [source] * max(n - n_forced, 0)
        return self
