"""What one engine step computes (StepPlan) and what its target forward returns (StepResult).

Every running request contributes one row of tokens to the step's target forward: its next prompt chunk, or its
last committed token followed by the drafts it verifies. Rows are laid out prompt chunks first, then verify
rows; a row writes its tokens' KV into its slot from its start position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..request import Request
from ..speculation.rows import VerifyRow


@dataclass
class StepPlan:
    chunks: list[tuple[Request, int]]  # prompt chunks: (request, its next n prompt tokens)
    verify: list[VerifyRow] = field(default_factory=list)  # the decoding requests' rows, drafts and outcomes
    # whether the grammar has checked the drafts and filled their mask rows: before the forward where it blocks
    # (CPU); after it where forwards run asynchronously (CUDA), so the matchers work while the device computes
    sealed: bool = True

    @property
    def prompts(self) -> list[Request]:
        return [r for r, _ in self.chunks]

    @property
    def decoding(self) -> list[Request]:
        return [v.req for v in self.verify]

    @property
    def requests(self) -> list[Request]:
        return self.prompts + self.decoding

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.verify

    def drop_finished(self) -> None:
        """Before the forward: requests that ended since the plan was made (their own work failed) get no row."""
        self.verify = [v for v in self.verify if not v.req.finished]
        self.chunks = [(r, n) for r, n in self.chunks if not r.finished]

    def rows(self) -> tuple[list[list[int]], list[int], list[int]]:
        """-> (token rows, slots, start positions): each chunk's next prompt tokens at the end of its cache, then
        each verify row [last committed token, d_0 .. d_{k-1}] at the end of its request's cache."""
        rows = [r.prompt_ids[r.cache_len : r.cache_len + n] for r, n in self.chunks]
        rows += [v.tokens for v in self.verify]
        reqs = self.requests
        return rows, [r.slot for r in reqs], [r.cache_len for r in reqs]

    def adapters(self) -> list[int]:
        """Per row (as rows()) its request's LoRA adapter (-1: the base model)."""
        return [r.adapter for r in self.requests]

    def trees(self) -> list[list[int] | None] | None:
        """Per row (as rows()) its tokens' parents where it is a tree of drafts (model/tree.py); None: all plain."""
        verify = [v.proposal.parents for v in self.verify]
        return [None] * len(self.chunks) + verify if any(p is not None for p in verify) else None


@dataclass
class StepResult:
    first: torch.Tensor | None  # [P, V] logits at each prompt chunk's last token (None: no chunks)
    verify: torch.Tensor | None  # [B, 1 + max k, V] logits at every verify row token, unmasked (None: no rows)
    started: float  # time.perf_counter() when the forward began (the step-cost model)
