"""Acceptance estimates: per request and draft source, how likely the target accepts a draft (adaptive.py's
input), and the engine-wide rates that serve as each request's prior.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import registry

# Acceptance estimates: discounted success / trial counts (a trial is a draft position the target judged,
# a success one it accepted), shrunk toward a prior. DECAY (per step) makes an estimate follow a request's
# recent behaviour (a JSON answer alternates predictable keys and unpredictable values). The prior is the
# engine-wide rate of the same estimate (Population), itself starting from the source's declared prior
# (registry.prior, read when the estimate is made: a drafter registered after import has its own); PRIOR_WEIGHT:
# how many trials it counts as. Chosen with a replay of recorded JME outputs through this rule (auto ÷ best fixed k at
# 1..8 requests in flight): weight 4 with the engine-wide prior raised the worst cell from 0.92 to 0.98;
# weights 3..6 were within 2% of each other.
DECAY = 0.8
PRIOR_WEIGHT = 4.0
POPULATION_FORGET = 0.999  # per observation: the engine-wide rate follows the workload over ~1000 steps
# a draft-model request that drafted nothing this many steps in a row verifies one draft: a model's drafts are
# its estimate's only evidence (lookup and forced drafts are observed for free even when cut), so an estimate that
# fell until auto k cut every draft would otherwise never rise again. The choice between two models needs no such
# refresh: a request leaves a model only on its own evidence against it, the other judged at its engine-wide rate
# (measured at load, then by the requests that draft with it)
PROBE_AFTER = 16
# a request whose last steps verified no drafts looks up n-grams only every LOOKUP_EVERY-th step (its free
# observation then still comes, a few steps apart): at many streams of free text the lookups cost a share of
# the step while their drafts are nearly all cut
LOOKUP_EVERY = 4
FOLLOW_PRIOR = 0.7  # a draft right after an accepted one


class Population:
    """Engine-wide acceptance per estimate key (source, first draft or after an accepted one), pooled over
    every request: each request's prior."""

    def __init__(self) -> None:
        self.counts: dict[str, list[float]] = {}  # key -> [successes, trials], discounted

    def observe(self, key: str, successes: int, trials: int) -> None:
        c = self.counts.setdefault(key, [0.0, 0.0])
        c[0] = POPULATION_FORGET * c[0] + successes
        c[1] = POPULATION_FORGET * c[1] + trials

    def rate(self, key: str, fixed_prior: float) -> float:
        s, t = self.counts.get(key, (0.0, 0.0))
        return (s + fixed_prior) / (t + 1)


@dataclass
class Acceptance:
    """One source's acceptance estimate for one request."""

    prior: float
    successes: float = 0.0
    trials: float = 0.0
    key: str = ""
    population: Population | None = None

    def observe(self, successes: int, trials: int) -> None:
        self.successes = DECAY * self.successes + successes
        self.trials = DECAY * self.trials + trials
        if self.population is not None:
            self.population.observe(self.key, successes, trials)

    @property
    def rate(self) -> float:
        prior = self.prior if self.population is None else self.population.rate(self.key, self.prior)
        return (self.successes + PRIOR_WEIGHT * prior) / (self.trials + PRIOR_WEIGHT)


@dataclass
class RequestAcceptance:
    """A request's estimates, by draft source, and how many steps in a row it drafted nothing; population: the
    engine's pooled estimates (the priors), None = the declared priors (registry.prior)."""

    population: Population | None = None
    sources: dict[str, Acceptance] = field(default_factory=dict)
    idle_steps: int = 0

    @property
    def probe_due(self) -> bool:
        """Drafted nothing for PROBE_AFTER steps: a draft-model request then verifies one draft."""
        return self.idle_steps >= PROBE_AFTER

    @property
    def lookup_rests(self) -> bool:
        """Idle (no drafts verified lately) and not a LOOKUP_EVERY-th idle step: no lookup this step."""
        return self.idle_steps > 0 and self.idle_steps % LOOKUP_EVERY != 0

    def get(self, source: str, follows: bool = False) -> Acceptance:
        """The estimate for a draft from `source`: the first of a step's drafts, or (follows) one after an
        accepted draft — kept apart because acceptance runs: a lookup that copies a span is right on and on."""
        key = f"{source}+" if follows else source
        if key not in self.sources:
            self.sources[key] = Acceptance(
                registry.prior(source) if not follows else FOLLOW_PRIOR, key=key, population=self.population
            )
        return self.sources[key]

    def chances(self, sources: list[str]) -> list[float]:
        """Per draft position, the probability that it and every draft before it are accepted (P_ij)."""
        out, p = [], 1.0
        for j, s in enumerate(sources):
            p *= self.get(s, j > 0).rate
            out.append(p)
        return out

    def observe(self, sources: list[str], verified: int, accepted: int, next_matches: bool | None) -> None:
        """The target judged the first `verified` drafts (tagged `sources`) and accepted `accepted` of them.
        next_matches: when every verified draft was accepted and a further, unverified draft existed, whether
        the target's own next token equals it (a free observation); None otherwise."""
        judged = verified if accepted == verified else accepted + 1
        if next_matches is not None:
            judged = verified + 1
        counts: dict[tuple[str, bool], list[int]] = {}
        for j in range(judged):
            c = counts.setdefault((sources[j], j > 0), [0, 0])
            c[0] += j < accepted or (j == verified and bool(next_matches))
            c[1] += 1
        for (source, follows), (ok, n) in counts.items():  # one decayed observation per estimate per step
            self.get(source, follows).observe(ok, n)
