"""The drafter interface."""

from __future__ import annotations

from importlib import import_module
from typing import Callable

import torch

from ..drafting import registry
from ..drafting.proposal import Proposal
from ..request import Request

# pick(logits [B, V], requests, offsets) -> (ids [B] on CPU, probs [B, V] or None): the engine's own token
# choice, so a draft model samples with each request's temperature / top-k / top-p, generator and min_tokens.
# offsets[b]: the drafted token's index in this step's proposal (its output position minus len(output_ids)).
# An id < 0 means no token may be drafted there for that request (its drafts end before it).
PickFn = Callable[[torch.Tensor, list[Request], list[int]], tuple[torch.Tensor, torch.Tensor | None]]


class Drafter:
    reads_prompts = False  # a forward drafter that reads each prompt into a cache of its own (admit: a prefill)

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


def build_grammar_only(config) -> GrammarOnlyDrafter:
    return GrammarOnlyDrafter()


def build_drafters(config, loaded: dict[str, Drafter]) -> dict[str, Drafter]:
    """The engine's drafters by name, in the registry's order: each declared one that its config turns on, built
    by its `make` (registry.DrafterSpec), or, for those the model loader makes (a draft model), taken from
    `loaded`."""
    out: dict[str, Drafter] = {}
    for name, spec in registry.DRAFTERS.items():
        if spec.make is None:
            drafter = loaded.get(name)
        else:
            module, function = spec.make.split(":")
            drafter = getattr(import_module(module), function)(config)
        if drafter is not None:
            out[name] = drafter
    return out
