"""A request's speculation statistics: drafts verified and accepted, by source, and the shapes of its trees of
drafts (the `spec_detail` output and the metrics read them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the target accepted
    steps: int = 0  # speculative verify steps (those with at least one draft token)
    accepted_hist: list[int] = field(default_factory=list)  # [a] = speculative steps that accepted a drafts
    k_hist: list[int] = field(default_factory=list)  # [k] = decode steps that verified k drafts
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [drafted, accepted]
    # trees of drafts: [n] = speculative steps with n branch nodes (0: a line), [d] = with the deepest draft at
    # depth d; steps whose accepted path left the line for a branch
    branch_hist: list[int] = field(default_factory=list)
    depth_hist: list[int] = field(default_factory=list)
    branch_taken: int = 0

    def record(
        self, sources: list[str], accepted: int, branches: int = 0, depth: int | None = None, taken: bool = False
    ) -> None:
        """One decode step verified drafts from `sources` (one per draft) and accepted the first `accepted`; its
        row held `branches` drafts off its line, its deepest draft at `depth` (None: a line of the drafts),
        and (taken) its accepted drafts left the line for a branch."""
        drafted = len(sources)
        _bump(self.k_hist, drafted)
        if drafted == 0:
            return
        for j, s in enumerate(sources):
            counts = self.by_source.setdefault(s, [0, 0])
            counts[0] += 1
            counts[1] += j < accepted
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        _bump(self.accepted_hist, accepted)
        _bump(self.branch_hist, branches)
        _bump(self.depth_hist, drafted if depth is None else depth)
        self.branch_taken += taken

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_length(self) -> float:
        """Tokens committed per speculative step (1 + accepted drafts), TensorRT-LLM's 'acceptance length'."""
        return (self.steps + self.accepted) / self.steps if self.steps else 0.0

    def detail(self) -> dict:
        """The per-source counts and the k distribution (the `spec_detail` output, as JSON)."""
        return {
            "sources": {s: {"drafted": d, "accepted": a} for s, (d, a) in sorted(self.by_source.items())},
            "k_hist": list(self.k_hist),
            "branch_hist": list(self.branch_hist),
            "depth_hist": list(self.depth_hist),
            "branch_taken": self.branch_taken,
        }


def _bump(hist: list[int], i: int) -> None:
    """hist[i] += 1, the histogram grown to hold i."""
    hist.extend([0] * (i + 1 - len(hist)))
    hist[i] += 1
