"""VerifyRow: one decoding request's row in a step's target forward, and what the step learns about it.

The row's tokens are [the request's last committed token, *proposal.tokens]; its logits are the verify logits'
row for it. The planner fills the drafts (draft, seal, choose_cuts), the verify fills the outcome (accepted,
token), and settle reads both: one record per row, so nothing pairs parallel lists by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..drafting.proposal import Proposal
from ..request import Request


def _none() -> Proposal:
    return Proposal([], sources=[])


@dataclass(eq=False)
class VerifyRow:
    req: Request
    available: Proposal = field(default_factory=_none)  # the drafts made this step, before the cuts
    proposal: Proposal = field(default_factory=_none)  # the drafts this row verifies (after cuts and seal)
    shadow: Proposal | None = None  # lookup drafts that lost to the draft model's (judged at settle, free)
    accepted: int = 0  # drafts the target accepted (after the verify)
    token: int = -1  # the target's own token after them
    path: list[int] = field(default_factory=list)  # the accepted drafts' row indices (a tree's path; a line: 1..a)

    @property
    def drafts(self) -> list[int]:
        """The row's drafts in row order: the line, then its branches (a tree of drafts)."""
        return [*self.proposal.tokens, *(b.token for b in self.proposal.branches)]

    @property
    def tokens(self) -> list[int]:
        """The row's tokens in the target forward: the last committed token, then the drafts."""
        return [self.req.output_ids[-1], *self.drafts]

    @property
    def committed(self) -> list[int]:
        """What the verify commits: the accepted drafts, then the target's token."""
        drafts = self.drafts
        return [drafts[r - 1] for r in self.path] + [self.token]

    @property
    def line_accepted(self) -> int:
        """The drafts of the line the target accepted (its path may then leave the line for a branch)."""
        k = len(self.proposal.tokens)
        return next((j for j, r in enumerate(self.path) if r != j + 1 or r > k), len(self.path))

    def record(self, used: int) -> None:
        """The request's statistics for this row, `used` of its committed tokens having gone into the output:
        fewer than accepted + 1 where an accepted draft ended it, and the drafts after that count for nothing.
        A tree's drafts count with the accepted path's first."""
        p = self.proposal
        sources = [*p.sources, *(b.source for b in p.branches)]
        on_path = set(self.path)
        ordered = [sources[r - 1] for r in self.path] + [s for r, s in enumerate(sources, 1) if r not in on_path]
        if used <= self.accepted:
            ordered = ordered[:used]
        taken = self.line_accepted < self.accepted
        self.req.spec.record(ordered, min(self.accepted, used), len(p.branches), max(p.depths), taken)
