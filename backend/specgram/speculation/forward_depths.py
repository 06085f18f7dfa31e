"""How deep a forward drafter (a draft model) drafts: which new requests' prompts it reads, which model each auto
request drafts with where two may (a draft_checkpoint and the target's copy beside it: the one that expects more
tokens per second, choose()), and per step the depth each auto request drafts to, against its lookup drafts (the
step-cost model decides: costs.py, adaptive.py).
"""

from __future__ import annotations

from ..drafting import registry
from ..drafting.acceptance import Population
from ..request import Request
from . import adaptive, costs
from .drafter import Drafter
from .read_value import ReadValue

FORCED = registry.FORCED


def costs_of(name: str, step_costs: costs.StepCosts) -> costs.StepCosts:
    """The step costs with the forward drafter `name`'s depth and read costs: the planner's own for the first
    forward drafter declared (the draft model), every other's own (one beside it, a plug-in's) over the same
    verify fit: each model's forwards cost what its own weights cost."""
    first = next(n for n, spec in registry.DRAFTERS.items() if spec.forward)
    return step_costs if name == first else step_costs.of(name)


def value(
    name: str, model: Drafter, req: Request, k: int, prefix: int, step_costs: costs.StepCosts, catching_up=True
) -> float:
    """Expected tokens per second of req's next step alone (one verify row and its drafts) drafting with the
    forward drafter `name` at the depth that pays best (at most k drafts, the first `prefix` forced and free):
    its acceptance estimates against its measured depth cost, plus the catch-up prefill of the committed tokens
    it has not read beyond the usual two (a model that other drafters stood in for; catching_up=False: not
    counted). Infinite for a model whose depth is untimed: drafting measures it (engine/warmup.py times each model
    of a pair at load, its first pass dropped, so that no slow first call is weighed)."""
    own = costs_of(name, step_costs)
    if not step_costs.known or own.draft_calls == 0:
        return float("inf")
    cost, depth_s = step_costs.curve(), own.depth_curve()(1)
    chances = req.acceptance.chances([FORCED] * prefix + [registry.source_of(name)] * (k - prefix))
    catch = max(model.behind(req) - 2, 0) * own.read_token_s if catching_up else 0.0
    best, tokens = 0.0, 1.0 + sum(chances[:prefix])
    for d in range(1, k - prefix + 1):
        tokens += chances[prefix + d - 1]
        best = max(best, tokens / (cost(1 + prefix + d) + d * depth_s + catch))
    return best


def choose(
    drafters: dict[str, Drafter], reqs: list[Request], ks: list[int], prefixes: list[list[int]], step_costs
) -> list[str]:
    """Per request the forward drafter it drafts with this step ("" none): its own where that is a forward
    drafter; under auto k the one of its options (registry.forward_options: its own, then those declared beside
    it) that has read its prompt and expects the most tokens per second (value(); the first on a tie). A request
    starts on the engine-wide rates, so on the model that wins there, and leaves it only when its own acceptance
    of it says another expects more."""
    out = []
    for r, k, pre in zip(reqs, ks, prefixes, strict=True):
        options = registry.forward_options(r.params.drafter, r.params.auto_draft, drafters)
        ready = [n for n in options if drafters[n].started(r)]
        if len(ready) < 2 or k <= len(pre):
            out.append(ready[0] if ready else options[0] if options else "")
            continue
        scores = [value(n, drafters[n], r, k, len(pre), step_costs) for n in ready]
        out.append(ready[scores.index(max(scores))])
    return out


def readers(
    name: str,
    drafters: dict[str, Drafter],
    users: list[Request],
    admitted: list[Request],
    running: list[Request],
    population: Population,
    step_costs: costs.StepCosts,
    k: int,
    worth: ReadValue | None = None,
) -> tuple[list[Request], list[Request]]:
    """Of the newly admitted requests `users` of the draft model `name` (admitted: every request admitted with
    them; running: every request holding a slot, these included): (those whose prompt it reads now, those it never
    drafts for under auto). Fixed-k requests are always read. An auto request's prompt is read only where the
    model is the one its request would draft with (wins(): it expects more tokens per second than every model
    declared beside it that needs no read), and, as for a draft model alone, where a draft depth could pay at
    this many streams (costs.depth_can_pay) and the drafts can save more than the read costs over the tokens the
    request may still produce, alone or joining the depths that the requests it already reads draft in
    (costs.read_pays): those two weigh the read against no model drafts at all, which wins() does not; last,
    where the model's reads have been worth less than they cost for requests of its kind (worth: what the model's
    drafts saved over the lookup drafts they displaced, read_value.py), it is not read (but for a probe)."""
    model, own = drafters[name], costs_of(name, step_costs)
    source = registry.source_of(name)
    p = population.rate(source, registry.prior(source))
    streams, new = len(running), {r.request_id for r in admitted}
    joined = sum(1 for r in running if r.request_id not in new and r.params.drafter == name and model.started(r))
    can = costs.depth_can_pay(streams, own, p)
    beside = [n for n in registry.forward_options(name, True, drafters)[1:] if not drafters[n].reads_prompts]

    def wins(r: Request) -> bool:
        """Drafting with `name` expects more than with any model beside it, at the request's estimates (a fresh
        request's: the engine-wide rates). A tie, both untimed included, reads nothing: the model beside it
        drafts and is timed, and then an untimed `name` expects more (infinite) and reads the next prompt."""
        mine = value(name, model, r, k, 0, step_costs, catching_up=False)
        return all(mine > value(n, drafters[n], r, k, 0, step_costs) for n in beside)

    def reads(r: Request) -> bool:
        if not r.params.auto_draft:
            return True
        left = r.params.max_tokens - len(r.output_ids)  # the tokens it may still produce
        if not (can and costs.read_pays(streams, own, p, left, len(r.prompt_ids), joined) and wins(r)):
            return False
        return worth is None or own.read_token_s == 0 or worth.pays(r, left, own.read_token_s * len(r.prompt_ids))

    read = [r for r in users if reads(r)]
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
    using: list[str],
) -> None:
    """Auto requests drafting with the forward drafter `name` this step (using[i], choose()): their k (in ks) is
    chosen before drafting (each depth costs a draft forward), from their acceptance estimates, against their
    lookup drafts (lookups[i]) where they have some (adaptive.plan_depths); a request whose prompt the model never
    read (admitted among many streams) gets no model drafts. Their drafts to make: the forced prefix or less (none
    from the model; its lookup drafts, if any, are verified instead) up to k."""
    auto = [r.params.auto_draft and u == name for r, u in zip(reqs, using, strict=True)]
    if not any(auto):
        return
    step_costs = costs_of(name, step_costs)
    source = registry.source_of(name)
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
            for r, k, pre, a, u in zip(reqs, ks, prefixes, auto, using, strict=True)
            if not a and r.params.speculates and u == name
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
