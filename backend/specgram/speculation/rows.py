"""VerifyRow: one decoding request's row in a step's target forward, and what the step learns about it.

The row's tokens are [the request's last committed token, *proposal.tokens]; its logits are the verify logits'
row for it. The planner fills the drafts (draft, seal, choose_cuts), the verify fills the outcome (accepted,
token), and settle reads both: one record per row, so nothing pairs parallel lists by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..request import Request
from .drafter import Proposal


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

    @property
    def tokens(self) -> list[int]:
        """The row's tokens in the target forward: the last committed token, then the drafts."""
        return [self.req.output_ids[-1], *self.proposal.tokens]

    @property
    def committed(self) -> list[int]:
        """What the verify commits: the accepted drafts, then the target's token."""
        return self.proposal.tokens[: self.accepted] + [self.token]

    def record(self, used: int) -> None:
        """The request's statistics for this row, `used` of its committed tokens having gone into the output:
        fewer than accepted + 1 where an accepted draft ended it, and the drafts after that count for nothing."""
        sources = self.proposal.sources[:used] if used <= self.accepted else self.proposal.sources
        self.req.spec.record(sources, min(self.accepted, used))
