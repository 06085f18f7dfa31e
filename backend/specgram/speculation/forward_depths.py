"""How deep a forward drafter (a draft model) drafts: which new requests' prompts it reads, and per step the
depth each auto request drafts to, against its lookup drafts (the step-cost model decides: costs.py, adaptive.py).
"""

from __future__ import annotations

import math

from ..drafting import registry
from ..drafting.acceptance import Population
from ..request import Request
from . import adaptive, costs
from .drafter import Drafter

FORCED = registry.FORCED
# a second model is weighed by its own timings only once it has this many (value()): a model's first call may
# pay one-time costs, and one that loses on a slow first timing would never be timed again
TIMED_CALLS = 2
# a model passed over this many of a request's steps in a row drafts its next step, where it needs no catch-up
# (a copy sharing the target's cache): a model that is not chosen gets no new evidence, and estimates that were
# low when it lost (the engine-wide rate of its first requests) would keep it out for good. Bounded cost: one
# step in EXPLORE_AFTER drafts with a model expected to pay a little less
EXPLORE_AFTER = 16


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
    counted). Infinite for a model whose depth was timed fewer than TIMED_CALLS times: drafting measures it."""
    own = costs_of(name, step_costs)
    if not step_costs.known or own.draft_calls < TIMED_CALLS:
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
    it) that has read its prompt and expects the most tokens per second (value(); the first on a tie), or one
    passed over too long (explored())."""
    out = []
    for r, k, pre in zip(reqs, ks, prefixes, strict=True):
        options = registry.forward_options(r.params.drafter, r.params.auto_draft, drafters)
        ready = [n for n in options if drafters[n].started(r)]
        if len(ready) < 2 or k <= len(pre):
            out.append(ready[0] if ready else options[0] if options else "")
            continue
        scores = [value(n, drafters[n], r, k, len(pre), step_costs) for n in ready]
        out.append(explored(r, ready, ready[scores.index(max(scores))], drafters))
    return out


def explored(req: Request, ready: list[str], best: str, drafters: dict[str, Drafter]) -> str:
    """The model req drafts with this step: `best`, unless another of `ready` was passed over EXPLORE_AFTER of
    its steps in a row and needs no catch-up (behind by at most the usual two tokens): that one, for fresh evidence
    (the first such in `ready`). Counts each model's steps passed over in req.acceptance.passed_over."""
    seen = req.acceptance.passed_over
    for n in ready:
        seen[n] = seen.get(n, 0) + 1
    due = [n for n in ready if n != best and seen[n] > EXPLORE_AFTER and drafters[n].behind(req) <= 2]
    chosen = due[0] if due else best
    seen[chosen] = 0
    return chosen


def readers(
    name: str,
    drafters: dict[str, Drafter],
    users: list[Request],
    admitted: list[Request],
    running: list[Request],
    population: Population,
    step_costs: costs.StepCosts,
    k: int,
) -> tuple[list[Request], list[Request]]:
    """Of the newly admitted requests `users` of the draft model `name` (admitted: every request admitted with
    them; running: every request holding a slot, these included): (those whose prompt it reads now, those it never
    drafts for under auto). An auto request's prompt is read only where a draft depth could pay at this many
    streams (costs.depth_can_pay) and the drafts can save more than the read costs over the tokens the request may
    still produce, alone or joining the depths that the requests it already reads draft in (costs.read_pays),
    and where drafting with it instead of the best forward drafter declared beside it that needs no read (it
    shares the target's cache) saves more than the read costs (saves_over(): value() at up to k drafts, at the
    engine-wide rates); fixed-k requests are always read."""
    model, own = drafters[name], costs_of(name, step_costs)
    source = registry.source_of(name)
    p = population.rate(source, registry.prior(source))
    streams, new = len(running), {r.request_id for r in admitted}
    joined = sum(1 for r in running if r.request_id not in new and r.params.drafter == name and model.started(r))
    can = costs.depth_can_pay(streams, own, p)
    beside = [n for n in registry.forward_options(name, True, drafters)[1:] if not drafters[n].reads_prompts]

    def pays_beside(r: Request, left: int) -> bool:
        if not beside:
            return True
        mine = value(name, model, r, k, 0, step_costs, catching_up=False)
        other = max(value(n, drafters[n], r, k, 0, step_costs) for n in beside)
        return saves_over(mine, other, left, len(r.prompt_ids) * own.read_token_s)

    def reads(r: Request) -> bool:
        if not r.params.auto_draft:
            return True
        left = r.params.max_tokens - len(r.output_ids)  # the tokens it may still produce
        return can and costs.read_pays(streams, own, p, left, len(r.prompt_ids), joined) and pays_beside(r, left)

    read = [r for r in users if reads(r)]
    skip = [r for r in users if r not in read]
    return read, skip


def saves_over(mine: float, other: float, tokens_left: int, read_s: float) -> bool:
    """Whether a model that must read a request's prompt first (read_s seconds) pays against one that needs no
    read, from their expected tokens per second (value(): mine, other): where it drafts better by enough that the
    tokens_left tokens take less time by more than the read, tokens_left (1 / other - 1 / mine) > read_s. A tie
    saves nothing: no read. Either untimed (infinite) or a read not yet timed (read_s 0): the one expected higher
    wins, a tie reads (drafting and reading measure them); nothing expected beside it: it reads."""
    if other > mine:
        return False
    if math.isinf(mine) or read_s == 0 or other <= 0:
        return True
    return tokens_left * (1 / other - 1 / mine) > read_s


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
