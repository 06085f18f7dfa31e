"""The drafter interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..model import tree
from ..request import Request

# pick(logits [B, V], requests, offsets) -> (ids [B] on CPU, probs [B, V] or None): the engine's own token
# choice, so a draft model samples with each request's temperature / top-k / top-p, generator and min_tokens.
# offsets[b]: the drafted token's index in this step's proposal (its output position minus len(output_ids)).
# An id < 0 means no token may be drafted there for that request (its drafts end before it).
PickFn = Callable[[torch.Tensor, list[Request], list[int]], tuple[torch.Tensor, torch.Tensor | None]]


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
    # engine tags the forced prefix "forced" and the rest by the drafter
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
        return tree.depths(parents) if parents is not None else list(range(1 + len(self.tokens)))

    def tagged(self, n_forced: int, drafter: str) -> Proposal:
        """This proposal with its per-token sources: the drafter's own tags, else the forced prefix then the
        drafter's name."""
        if self.sources is None:
            n = len(self.tokens)
            self.sources = ["forced"] * min(n_forced, n) + [drafter] * max(n - n_forced, 0)
        return self


class Drafter:
    def admit(self, reqs: list[Request], now: bool = True) -> None:
        """New requests got their slots and their prompt is in the target cache. now=False: the planner expects
        no draft for them soon (a drafter may defer work until one comes)."""

    def propose(self, reqs: list[Request], ks: list[int], pick: PickFn, prefixes: list[list[int]]) -> list[Proposal]:
        """Up to ks[i] tokens continuing reqs[i]'s committed tokens (fewer is fine). Each proposal starts with
        prefixes[i]: tokens already drafted for free (grammar-forced), which the drafter continues."""
        raise NotImplementedError

    def behind(self, req: Request) -> int:
        """Committed tokens of req this drafter has not read yet (0: it reads them for free)."""
        return 0

    def started(self, req: Request) -> bool:
        """Whether this drafter has read req's prompt (a draft model that deferred it has not)."""
        return True

    def committed(self, req: Request, accepted: int) -> None:
        """The target accepted `accepted` of the tokens proposed to req in this step."""

    def release(self, req: Request) -> None:
        """req finished or was aborted."""


class GrammarOnlyDrafter(Drafter):
    """Drafts only what the grammar forces (the prefix): no model, no lookup."""

    def propose(self, reqs, ks, pick, prefixes):
        return [Proposal(list(p), sources=["forced"] * len(p)) for p in prefixes]
