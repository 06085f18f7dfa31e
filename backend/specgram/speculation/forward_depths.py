"""How deep a forward drafter (a draft model) drafts: which new requests' prompts it reads, and per step the
depth each auto request drafts to, against its lookup drafts (the step-cost model decides: costs.py, adaptive.py).
"""

from __future__ import annotations

from ..drafting import registry
from ..drafting.acceptance import PRIORS, Population
from ..request import Request
from . import adaptive, costs
from .drafter import Drafter

FORCED = registry.FORCED


def source_of(name: str) -> str:
    """The source tag of a forward drafter's drafts (its first declared)."""
    return next(iter(registry.DRAFTERS[name].sources))


def readers(
    name: str,
    model: Drafter,
    users: list[Request],
    admitted: list[Request],
    running: list[Request],
    population: Population,
    step_costs: costs.StepCosts,
) -> tuple[list[Request], list[Request]]:
    """Of the newly admitted requests `users` of the draft model `name` (admitted: every request admitted with
    them; running: every request holding a slot, these included): (those whose prompt it reads now, those it never
    drafts for under auto). An auto request's prompt is read only where a draft depth could pay at this many
    streams (costs.depth_can_pay) and the drafts can save more than the read costs over the tokens the request may
    still produce, alone or joining the depths that the requests it already reads draft in (costs.read_pays);
    fixed-k requests are always read."""
    source = source_of(name)
    p = population.rate(source, PRIORS[source])
    streams, new = len(running), {r.request_id for r in admitted}
    joined = sum(1 for r in running if r.request_id not in new and r.params.drafter == name and model.started(r))
    can = costs.depth_can_pay(streams, step_costs, p)
    read = [
        r
        for r in users
        if not r.params.auto_draft
        or (
            can
            and costs.read_pays(
                streams, step_costs, p, r.params.max_tokens - len(r.output_ids), len(r.prompt_ids), joined
            )
        )
    ]
    skip = [r for r in users if r not in read]
    return read, skip


def plan(
    name: str,
    model: Drafter,
    reqs: list[Request],
    prefixes: list[list[int]],
    lookups: list,
    ks: list[int],
    step_costs: costs.StepCosts,
) -> None:
    """Auto requests drafting with the forward drafter `name`: their k (in ks) is chosen before drafting (each
    depth costs a draft forward), from their acceptance estimates, against their lookup drafts (lookups[i])
    where they have some (adaptive.plan_depths); a request whose prompt the model never read (admitted among
    many streams) gets no model drafts. Their drafts to make: the forced prefix or less (none from the model;
    its lookup drafts, if any, are verified instead) up to k."""
    auto = [r.params.auto_draft and r.params.drafter == name for r in reqs]
    if not any(auto):
        return
    source = source_of(name)
    # a prompt the model never read: no drafts
    seen = [a and model.started(r) for r, a in zip(reqs, auto, strict=True)]
    chances = [
        r.acceptance.chances([FORCED] * len(pre) + [source] * (k - len(pre))) if s else []
        for r, k, pre, s in zip(reqs, ks, prefixes, seen, strict=True)
    ]
    looked = [
        r.acceptance.chances(found.sources) if found is not None else None
        for r, found in zip(reqs, lookups, strict=True)
    ]
    paid = max(
        (
            k - len(pre)
            for r, k, pre, a in zip(reqs, ks, prefixes, auto, strict=True)
            if not a and r.params.speculates and r.params.drafter == name
        ),
        default=0,
    )
    planned = adaptive.plan_depths(chances, looked, [len(pre) for pre in prefixes], step_costs, paid)
    # a probe (one model draft for a request that has drafted nothing for a while: its estimate's evidence)
    # rides along where the model drafts this step anyway, else only where it could pay alone
    drafting = paid > 0 or any(p > len(pre) for p, pre, s in zip(planned, prefixes, seen, strict=True) if s)
    probe = drafting or costs.probe_can_pay(len(reqs), step_costs)
    for i, (r, k, pre, a, s, p) in enumerate(zip(reqs, list(ks), prefixes, auto, seen, planned, strict=True)):
        if a:  # fixed-k requests keep k; an unread prompt drafts only its forced prefix
            ks[i] = max(p, min(len(pre) + 1, k) if probe and r.acceptance.probe_due else 0) if s else len(pre)
