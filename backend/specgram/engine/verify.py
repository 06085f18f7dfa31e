"""The verify phase: a step's verify rows masked by their grammars, accepted against the target's logits and
settled with their drafters, ready to commit.

A row's work is its own: the token choice is redone per row where the batched call fails (Faults.each_or_alone),
and a row whose request failed in this phase is dropped, its batch-mates keep their own rows' logprobs.
"""

from __future__ import annotations

import time

from ..faults import Faults
from ..request import Request
from ..sample import sampling
from ..speculation.planner import DraftPlanner
from ..speculation.rows import VerifyRow
from .logits import LogitsProcessor
from .logprobs import LogprobTaker
from .step import StepPlan, StepResult


class Verifier:
    def __init__(self, planner: DraftPlanner, logits: LogitsProcessor, logprobs: LogprobTaker, faults: Faults, trees):
        """trees: the TreePlanner (a tree row's accepted path into place, its estimates taught)."""
        self.planner, self.logits, self.logprobs, self.faults, self.trees = planner, logits, logprobs, faults, trees

    def verify(self, plan: StepPlan, result: StepResult) -> tuple[list[VerifyRow], list]:
        """Mask, accept and settle the verify rows (logits [B, 1 + max k, V], row b for plan.verify[b]) ->
        (the rows that go on, with their outcome; each one's logprob entries, None where not asked)."""
        rows, reqs = plan.verify, plan.decoding
        if not plan.sealed:
            for v in rows:
                v.proposal = self.planner.seal(v.req, v.proposal)
        raw = self.logprobs.capture(result.verify, reqs, "raw")
        cut_at = self.logits.mask_verify(reqs, [v.proposal for v in rows], result.verify)
        for v, p in zip(rows, cut_at, strict=True):
            v.proposal = p
        captured = raw if raw is not None else self.logprobs.capture(result.verify, reqs, "processed")
        if not plan.chunks:  # the step-cost model (auto draft length) learns from decode-only forwards
            n_rows = sum(len(v.tokens) for v in rows)
            self.planner.costs.record(n_rows, time.perf_counter() - result.started)
        at = {id(v.req): b for b, v in enumerate(rows)}
        picks = self.faults.each_or_alone(reqs, lambda sub: self._accept(plan, result, [at[id(r)] for r in sub]), None)
        for v, pick in zip(rows, picks, strict=True):  # a tree row's accepted path into place
            if pick is not None and v.proposal.branches:
                self.faults.guard(v.req, self.trees.settle, v, v.req.cache_len, pick[2])
        live = [b for b, v in enumerate(rows) if picks[b] is not None and not self.faults.has(v.req)]
        for b in live:
            v = rows[b]
            v.accepted, v.token, v.path = picks[b]
            v.req.cache_len += 1 + v.accepted  # the fed last token and the accepted drafts now have valid KV
        kept = [rows[b] for b in live]
        self.planner.settle(kept)
        kept_reqs: list[Request] = [v.req for v in kept]
        ours = {j: captured[b] for j, b in enumerate(live) if b in captured}  # renumbered: row j of `kept`
        return kept, self.logprobs.entries(ours, kept_reqs, [v.committed for v in kept], self.faults)

    def _accept(self, plan: StepPlan, result: StepResult, rows: list[int]) -> list[tuple[int, int, list[int]]]:
        """sampling.accept over the given verify rows (indices into plan.verify) -> per row (accepted drafts,
        the target's next token, the accepted drafts' row indices). Reads the logits only: safe to rerun for a
        row alone."""
        verify = [plan.verify[b] for b in rows]
        logits = result.verify if len(rows) == len(plan.verify) else result.verify[rows]
        props = [v.proposal for v in verify]
        out = sampling.accept([v.req for v in verify], props, logits, self.logits.noise, self.logits.coupled)
        return list(zip(*out, strict=True))
