"""The drafter interface: what the planner calls on every drafter, built-in or a plug-in (drafting/plugins.py)."""

from __future__ import annotations

from importlib import import_module
from typing import Callable

import torch

from ..drafting import registry
from ..drafting.names import FORCED
from ..drafting.proposal import Proposal
from ..errors import ModelLoadError
from ..request import Request

# pick(logits [B, V], requests, offsets) -> (ids [B] on CPU, probs [B, V] or None): the engine's own token
# choice, so a draft model samples with each request's temperature / top-k / top-p, generator and min_tokens.
# offsets[b]: the drafted token's index in this step's proposal (its output position minus len(output_ids)).
# An id < 0 means no token may be drafted there for that request (its drafts end before it).
PickFn = Callable[[torch.Tensor, list[Request], list[int]], tuple[torch.Tensor, torch.Tensor | None]]


class Drafter:
    """A drafter as the planner (speculation/planner.py) calls it, one engine thread, in this order per request:
    admit once its prompt is in the target's cache, then per step propose (with every request of the step that
    drafts with it) and committed, and release at its end. Its declaration (drafting/registry.py: DrafterSpec)
    says how the planner treats it; every method but propose has a default that suits a drafter keeping no state
    per request. A failure inside a call is redone for each request alone and ends only the request it belongs to
    (faults.py)."""

    # a forward drafter that reads each prompt into a cache of its own (admit: a prefill); the planner then admits
    # an auto request's prompt only where its drafts can pay for the read (forward_depths.readers)
    reads_prompts = False

    def admit(self, reqs: list[Request], now: bool = True) -> None:
        """New requests got their slots and their prompt is in the target cache. now=False: the planner expects
        no draft for them soon (a drafter may defer work until one comes)."""

    def propose(
        self,
        reqs: list[Request],
        ks: list[int],
        pick: PickFn,
        prefixes: list[list[int]],
        hints: list[list[int]],
    ) -> list[Proposal]:
        """One Proposal per request, in order, for this step. All lists are parallel to reqs (B requests):
        - reqs[i]: the request (its committed tokens: prompt_ids + output_ids; its guide's matcher, when guided,
          holds prefixes[i] tentatively accepted: a drafter that masks its drafts extends it and the planner rolls
          it back);
        - ks[i]: the most tokens its proposal may hold, prefixes[i] included (fewer is fine);
        - pick: the engine's token choice over logits [B', V] for any B' of these requests (PickFn), for a drafter
          that samples from a model's logits;
        - prefixes[i]: the tokens already drafted for free (grammar-forced, source FORCED): the proposal starts with
          them and continues them;
        - hints[i]: drafts a free drafter found for reqs[i] this step, after prefixes[i] (a forward drafter may
          check them in its first forward: draft_model.py); empty for a free drafter's call, and where none found.
        Proposal.sources tags each token (FORCED for the prefix, then tags the drafter declares); None: the
        planner tags the prefix FORCED and the rest with the drafter's first declared tag (registry.source_of)."""
        raise NotImplementedError

    def behind(self, req: Request) -> int:
        """Committed tokens of req this drafter has not read yet (0: it reads them for free)."""
        return 0

    def started(self, req: Request) -> bool:
        """Whether this drafter has read req's prompt (a draft model that deferred it has not)."""
        return True

    def committed(self, req: Request, accepted: int) -> None:
        """The target accepted `accepted` of the tokens proposed to req in this step (its committed tokens then
        include them and the target's own next token)."""

    def release(self, req: Request) -> None:
        """req finished or was aborted (req.finish_reason says how). Called for the drafter's own requests, and for
        every request where its declaration `hears_all`."""


class GrammarOnlyDrafter(Drafter):
    """Drafts only what the grammar forces (the prefix): no model, no lookup."""

    def propose(self, reqs, ks, pick, prefixes, hints):
        return [Proposal(list(p), sources=[FORCED] * len(p)) for p in prefixes]


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
            drafter = _made(name, spec.make, config)
        if drafter is not None:
            out[name] = drafter
    return out


def _made(name: str, make: str, config) -> Drafter | None:
    """The drafter its declaration's `make` ("module:function") builds for config (None: off in this config);
    ModelLoadError naming the drafter where that fails (a plug-in's own code included)."""
    module, function = make.split(":")
    try:
        drafter = getattr(import_module(module), function)(config)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"drafter {name!r}: its make {make!r} failed: {type(e).__name__}: {e}") from e
    if drafter is not None and not isinstance(drafter, Drafter):
        raise ModelLoadError(f"drafter {name!r}: its make {make!r} built a {type(drafter).__name__}, not a Drafter")
    return drafter
