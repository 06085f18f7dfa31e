"""Logits processing: every position's logits get the request's logits processors (penalties.py), its grammar
mask and its min_tokens EOS ban (and stop_token_ids ban) before a token is chosen from them, whether a draft
model drafts it, a completed prompt takes its first token, or the target verifies a draft. The same rows for
draft and target keep both distributions on one support.
"""
from __future__ import annotations

import torch

from ..grammar.masks import StepMasks
from ..request import Request
from ..speculation import min_tokens, sampling
from ..speculation.drafter import Proposal
from ..speculation.noise import NoiseRows
from . import penalties


class LogitsProcessor:
    def __init__(self, masks: StepMasks, eos_ids: set[int], coupled: bool = True):
        self.masks = masks
        self.eos_ids = eos_ids
        self.coupled = coupled      # coupled verification (sampling.py); False: drafts carry q for rejection
        self.noise = NoiseRows(masks.vocab)     # sampling noise by (seed, position), shared by drafts and verify

    def mask_verify(self, reqs: list[Request], proposals: list[Proposal], logits: torch.Tensor) -> None:
        """Process the verify logits [B, T, V] in place: row (b, i) gets its request's processors over the history
        output_ids + drafts[:i], mask row (slot, i) as the drafts did, then EOS banned where output position
        len(output_ids) + i is below min_tokens (as the drafts were)."""
        width = logits.shape[1]
        flat = logits.view(-1, logits.shape[-1])                                      # [B * T, V]
        penalties.apply(flat, [(b * width + i, r, r.output_ids + proposals[b].tokens[:i])
                               for b, r in enumerate(reqs) if r.params.penalized
                               for i in range(1 + len(proposals[b].tokens))])
        entries = [(b * width + i, r.slot, i) for b, r in enumerate(reqs) if r.guide is not None
                   for i in range(1 + len(proposals[b].tokens))]
        self.masks.apply(flat, entries)
        min_tokens.apply(flat, [min_tokens.eos_banned(r, i) for r in reqs for i in range(width)],
                         self.eos_ids, [r.params.stop_token_ids for r in reqs for _ in range(width)])

    def pick(self, logits: torch.Tensor, reqs: list[Request], offsets: list[int],
             tentative: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits: [B, V], row b for reqs[b]'s token at output position len(output_ids) + offsets[b] ->
        sampling.pick under each guided request's grammar mask at its current position, row (slot,
        guide.tentative), and with EOS banned below min_tokens; with `tentative` (drafting) the picked tokens
        are then accepted tentatively (and, for rejection sampling, their distributions come back as q)."""
        penalties.apply(logits, [(j, r, r.output_ids) for j, r in enumerate(reqs) if r.params.penalized])
        guided = [(j, r) for j, r in enumerate(reqs) if r.guide is not None and not r.guide.terminated]
        for _, r in guided:
            self.masks.fill(r.slot, r.guide)
        self.masks.apply(logits, [(j, r.slot, r.guide.tentative) for j, r in guided])
        min_tokens.apply(logits, [min_tokens.eos_banned(r, o) for r, o in zip(reqs, offsets)], self.eos_ids,
                         [r.params.stop_token_ids for r in reqs])
        positions = [len(r.output_ids) + o for r, o in zip(reqs, offsets)]
        ids, probs = sampling.pick(logits, reqs, positions, self.noise, want_probs=tentative and not self.coupled)
        if tentative:
            for j, r in guided:
                accepted = r.guide.try_tentative(int(ids[j]))
                assert accepted, "a token drawn under its grammar mask was rejected by the matcher"
        return ids, probs

    def draft_pick(self, logits: torch.Tensor, reqs: list[Request],
                   offsets: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafters' PickFn: pick() with the picks accepted tentatively."""
        return self.pick(logits, reqs, offsets, tentative=True)
