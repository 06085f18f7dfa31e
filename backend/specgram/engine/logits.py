"""Logits processing: every position's logits get the request's logits processors (penalties.py), its grammar
mask and its min_tokens EOS ban (and stop_token_ids ban) before a token is chosen from them, whether a draft
model drafts it, a completed prompt takes its first token, or the target verifies a draft. The same rows for
draft and target keep both distributions on one support.
"""

from __future__ import annotations

import torch

from ..drafting.proposal import Proposal
from ..faults import DeadEnd, Faults
from ..grammar.masks import StepMasks
from ..request import Request
from ..sample import min_tokens, sampling
from ..sample.noise import NoiseRows
from . import penalties

NO_TOKEN = -1  # pick()'s id for a row that has no token to give (dead, or its request failed)


def dead_rows(logits: torch.Tensor, rows: list[int]) -> list[int]:
    """logits: [N, V] -> those of `rows` where every logit is -inf (or NaN): nothing may be chosen there."""
    if not rows:
        return []
    alive = (logits[rows] > float("-inf")).any(-1).tolist()  # one host sync, only for the rows asked
    return [n for n, ok in zip(rows, alive, strict=True) if not ok]


class LogitsProcessor:
    def __init__(self, masks: StepMasks, eos_ids: set[int], faults: Faults | None = None, coupled: bool = True):
        self.masks = masks
        self.faults = faults if faults is not None else Faults()
        self.eos_ids = eos_ids
        self.coupled = coupled  # coupled verification (sampling.py); False: drafts carry q for rejection
        self.reduced_drafts = False  # a draft model computes part of the vocabulary (draft_vocab): see pick()
        self.noise = NoiseRows(masks.vocab)  # sampling noise by (seed, position), shared by drafts and verify

    def mask_verify(self, reqs: list[Request], proposals: list[Proposal], logits: torch.Tensor) -> list[Proposal]:
        """Process the verify logits [B, T, V] in place: row (b, i) gets its request's processors over the history
        output_ids + drafts[:i], mask row (slot, i) as the drafts did, then EOS banned where output position
        len(output_ids) + i is below min_tokens (as the drafts were). -> the proposals, each cut before its first
        row that leaves no token (only requests with token lists can have one): where that is row 0, nothing
        may follow the committed tokens, and the request fails with DeadEnd. A tree row (branches: never
        penalized) takes mask row (slot, i) at its row i, and the EOS ban by each token's depth."""
        width = logits.shape[1]
        depths = [p.depths for p in proposals]
        flat = logits.view(-1, logits.shape[-1])  # [B * T, V]
        self._penalize(
            flat,
            [
                (b * width + i, r, r.output_ids + proposals[b].tokens[:i])
                for b, r in enumerate(reqs)
                if r.params.penalized
                for i in range(1 + len(proposals[b].tokens))
            ],
        )
        entries = [
            (b * width + i, r.slot, i) for b, r in enumerate(reqs) if r.guide is not None for i in range(len(depths[b]))
        ]
        self.masks.apply(flat, entries)
        at = [(r, depths[b][i] if i < len(depths[b]) else i) for b, r in enumerate(reqs) for i in range(width)]
        min_tokens.apply(flat, at, self.eos_ids)
        dead = dead_rows(
            flat,
            [
                b * width + i
                for b, r in enumerate(reqs)
                if r.params.penalized
                for i in range(1 + len(proposals[b].tokens))
            ],
        )
        first = {}
        for n in reversed(dead):
            first[n // width] = n % width
        for b, j in first.items():
            if j == 0:
                self.faults.add(reqs[b], DeadEnd())
        return [p.cut(first[b] - 1) if first.get(b, 0) > 0 else p for b, p in enumerate(proposals)]

    def _penalize(self, logits: torch.Tensor, rows: list[tuple[int, Request, list[int]]]) -> None:
        """penalties.apply, each row under its request's guard."""
        for n, r, history in rows:
            self.faults.guard(r, penalties.apply, logits, [(n, r, history)])

    def pick(
        self, logits: torch.Tensor, reqs: list[Request], offsets: list[int], tentative: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits: [B, V], row b for reqs[b]'s token at output position len(output_ids) + offsets[b] ->
        sampling.pick under each guided request's grammar mask at its current position, row (slot,
        guide.tentative), and with EOS banned below min_tokens; with `tentative` (drafting) the picked tokens
        are then accepted tentatively (and, for rejection sampling, their distributions come back as q)."""
        self._penalize(logits, [(j, r, r.output_ids) for j, r in enumerate(reqs) if r.params.penalized])
        guided = [
            (j, r)
            for j, r in enumerate(reqs)
            if r.guide is not None
            and not r.guide.terminated
            and self.faults.guard(r, self.masks.fill, r.slot, r.guide) is not None
        ]
        self.masks.apply(logits, [(j, r.slot, r.guide.tentative) for j, r in guided])
        min_tokens.apply(logits, list(zip(reqs, offsets, strict=True)), self.eos_ids)
        dead = set(dead_rows(logits, [j for j, r in enumerate(reqs) if r.params.penalized]))
        if not tentative:  # a token must be chosen here: a request with none to choose ends
            for j in dead:
                self.faults.add(reqs[j], DeadEnd())
        positions = [len(r.output_ids) + o for r, o in zip(reqs, offsets, strict=True)]
        ids, probs = sampling.pick(logits, reqs, positions, self.noise, want_probs=tentative and not self.coupled)
        if tentative and self.reduced_drafts:  # a draft row may hold no token (a reduced draft vocabulary lacking
            # all the grammar allows): then, and only then, the pick is a -inf entry (one gather, not a scan of every
            # row); the draft ends there
            chosen = logits.gather(1, ids.to(logits.device)[:, None]).squeeze(1)
            dead |= {j for j, empty in enumerate(torch.isneginf(chosen).tolist()) if empty}
        for j, r in enumerate(reqs):
            if j in dead or self.faults.has(r):
                ids[j] = NO_TOKEN
        if tentative:
            for j, r in guided:
                if ids[j] != NO_TOKEN and not self.faults.guard(r, r.guide.try_tentative, int(ids[j])):
                    self.faults.add(
                        r, RuntimeError(f"the grammar rejected token {int(ids[j])}, drawn under its own mask")
                    )
                    ids[j] = NO_TOKEN
        return ids, probs

    def draft_pick(
        self, logits: torch.Tensor, reqs: list[Request], offsets: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafters' PickFn: pick() with the picks accepted tentatively; NO_TOKEN where a request's row leaves
        no token (its drafts end there) or the request failed."""
        return self.pick(logits, reqs, offsets, tentative=True)
