"""Adaptive draft length: each step, how many of each request's drafts to verify (num_draft_tokens = auto).

A verify step over request i's first c_i drafts commits 1 + sum_{j < c_i} P_ij tokens on average, where
P_ij = prod_{l <= j} p_il is the probability that drafts 0..j are all accepted and p_il the acceptance estimate
of draft l's source (grammar-forced token, prompt / output / guide lookup, draft model) for that request, for a
step's first draft or for one after an accepted draft (acceptance comes in runs). The
step costs cost(N) seconds, N = sum_i (1 + c_i) verify rows, plus d seconds per draft-model depth. The cuts
maximise the whole batch's expected tokens per second (goodput); c_i = 0 when drafting does not pay.

Both inputs are learned online: acceptance per request and source from verify outcomes (and from drafts that
were cut: whether the token the target chose equals the first unverified draft is a free observation, so a
request at k = 0 keeps its estimate current and resumes drafting when lookup starts to hit again), shrunk
toward the engine-wide acceptance of the same source (a short answer never collects enough evidence of its
own; the workload's rate is the best prior), and the step cost from the engine's own timings. Output is exact
whatever the cuts: they only choose which drafts the target verifies. The estimates themselves are
drafting/acceptance.py.
"""

from __future__ import annotations

from .costs import StepCosts

# allocate() keeps a step's drafts (beyond fixed-k requests' own) only when they raise its expected goodput by
# more than this share: below it the gain is within the cost fit's error (a verify row's cost varies with the
# rows' shapes, not only their number) and the per-draft work the fit does not time (lookup, masks, commit);
# docs/performance.md has the runs that set it.
MIN_GAIN = 0.03


def best_ratio(chances: list[float], rows: int, cost) -> float:
    """Tokens per second of a step of `rows` verify rows, cost(N) seconds at N rows, with one request's first n
    drafts added (n more rows), for the best n (0 included)."""
    tokens = float(rows)
    best = tokens / cost(rows)
    for n, p in enumerate(chances, 1):
        tokens += p
        best = max(best, tokens / cost(rows + n))
    return best


def depth_seconds(depth_cost, drafts: list[int]) -> float:
    """Seconds of the draft-model forwards that make drafts[i] drafts for request i: level l is one forward over
    the requests with at least l (depth_cost(R): StepCosts.depth_curve())."""
    return sum(depth_cost(sum(1 for n in drafts if n >= level)) for level in range(1, max(drafts, default=0) + 1))


def _cut_greedy(
    chances: list[list[float]], limits: list[int], fixed: list[bool], cost, extra: float
) -> tuple[list[int], float, float]:
    """-> (cuts, tokens, seconds): request i verifies its first cuts[i] drafts (all of a fixed one's, at most
    limits[i] of another's), maximising expected tokens / seconds of a step costing cost(rows) + extra.
    Drafts are taken by chance, likeliest first, while one raises the ratio: with a convex cost (StepCosts'
    fit) and chances nonincreasing within a request, the best set is every draft above a threshold, and this
    walks down to it (a request's drafts are so always a prefix)."""
    cuts = [len(c) if f else 0 for c, f in zip(chances, fixed, strict=True)]
    tokens = len(chances) + sum(sum(c) for c, f in zip(chances, fixed, strict=True) if f)
    rows = len(chances) + sum(cuts)
    seconds = cost(rows) + extra
    free = sorted(
        ((p, -i) for i, (c, f, n) in enumerate(zip(chances, fixed, limits, strict=True)) if not f for p in c[:n]),
        reverse=True,
    )
    for p, neg_i in free:
        more = cost(rows + 1) + extra
        if (tokens + p) * seconds <= tokens * more:  # (tokens + p) / more <= tokens / seconds
            break
        tokens, rows, seconds = tokens + p, rows + 1, more
        cuts[-neg_i] += 1
    return cuts, tokens, seconds


def allocate(
    chances: list[list[float]],
    draft_model: list[bool],
    costs: StepCosts,
    fixed: list[bool] | None = None,
    sunk: float = 0.0,
) -> list[int]:
    """chances[i]: request i's P_ij for its available drafts (nonincreasing in j); draft_model[i]: its drafts
    are still to be made by the draft model (each depth level costs one draft forward, shared by every request
    drafting at that depth); fixed[i]: all of request i's drafts are verified whatever this decides (a fixed
    k), so they are part of the step's base (and a fixed draft-model request's depth is paid anyway); sunk:
    seconds of the step spent whatever this decides (draft forwards already run), part of every option's cost.
    -> cuts c_i maximising expected committed tokens / predicted step seconds: for each model depth D, the
    best cuts with the model's drafts limited to D (_cut_greedy), then the best D. No drafts beyond the fixed
    ones when the kept ones raise the ratio by MIN_GAIN or less."""
    if not costs.known:
        return [len(c) for c in chances]  # nothing measured yet: verify everything proposed once
    cost, dc = costs.curve(), costs.depth_curve()
    n = len(chances)
    fixed = fixed or [False] * n
    paid = [len(c) if m and f else 0 for c, m, f in zip(chances, draft_model, fixed, strict=True)]
    base_cuts, tokens, seconds = _cut_greedy(chances, [0] * n, fixed, cost, sunk + depth_seconds(dc, paid))
    base = tokens / seconds
    best, best_cuts = base, base_cuts
    deepest = max((len(c) for c, m, f in zip(chances, draft_model, fixed, strict=True) if m and not f), default=0)
    for depth in range(0, max(deepest, *paid, 0) + 1):
        limits = [depth if m else len(c) for c, m in zip(chances, draft_model, strict=True)]
        drafts = [p or (min(len(c), depth) if m else 0) for c, m, p in zip(chances, draft_model, paid, strict=True)]
        cuts, tokens, seconds = _cut_greedy(chances, limits, fixed, cost, sunk + depth_seconds(dc, drafts))
        if tokens / seconds > best:
            best, best_cuts = tokens / seconds, cuts
    return best_cuts if best > (1 + MIN_GAIN) * base else base_cuts


def plan_depths(
    model: list[list[float]], lookup: list[list[float] | None], forced: list[int], costs: StepCosts, paid: int = 0
) -> list[int]:
    """Before drafting, for the requests of a step: how deep the draft model drafts for each.
    model[i]: the chances of request i's forced prefix (forced[i] tokens, free) then of its draft-model drafts
    ([] where the model may not draft for it); lookup[i]: the chances of its n-gram lookup proposal (which
    continues the same forced prefix), or None. paid: model depth that fixed-k requests draft anyway.
    -> per request its drafts to make with the model, forced prefix included (forced[i] or less: none; the
    engine then verifies its lookup proposal where it has one).
    For each depth D: each request takes the better of its lookup drafts and its first D model drafts at the
    verify row's cost alone (best_ratio), the step's cuts follow (_cut_greedy), and the D whose step expects the
    most tokens per second wins; a depth forward is shared by every request drafting at it, so at many streams
    the model pays where one request's drafts alone could not carry it. No margin over D = 0 (unlike allocate's
    MIN_GAIN): a depth's forward is timed, and a 3% margin kept the int8 copy idle in steps where it gained
    (docs/performance.md, the served default). Before any timing: lookup where it found something, else every
    model draft."""
    n = len(model)
    if not costs.known:
        return [forced[i] if lookup[i] else len(model[i]) for i in range(n)]
    cost, dc = costs.curve(), costs.depth_curve()
    deepest = max((len(m) - f for m, f in zip(model, forced, strict=True) if m), default=0)
    best, best_depths = 0.0, list(forced)
    looked = [best_ratio(look, n, cost) if look else 0.0 for look in lookup]  # the same at every depth
    for depth in range(0, deepest + 1):
        options, by_model = [], []
        for m, look, f, lr in zip(model, lookup, forced, looked, strict=True):
            own = m[: f + depth]
            use = len(own) > f and (not look or best_ratio(own, n, cost) > lr)
            options.append(own if use else look or own)
            by_model.append(use)
        # the depth forwards are priced by the requests drafting at each level (the fixed-k ones as one more);
        # first by the drafts on offer, then, once cut, by those the model will make
        offered = [len(o) - f if use else 0 for o, f, use in zip(options, forced, by_model, strict=True)] + [paid]
        ahead = depth_seconds(dc, offered)
        cuts, tokens, seconds = _cut_greedy(options, [len(o) for o in options], [False] * n, cost, ahead)
        depths = [max(c, f) if use else f for c, f, use in zip(cuts, forced, by_model, strict=True)]
        made = [dp - f for dp, f in zip(depths, forced, strict=True)] + [paid]
        ratio = tokens / (seconds - ahead + depth_seconds(dc, made))
        if ratio > best:
            best, best_depths = ratio, depths
    return best_depths
