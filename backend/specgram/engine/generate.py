"""In-process driver: submit requests to an Engine and step it until they finish (no thread, no Triton).

Used by the tests and the in-process benchmarks. Times are time.perf_counter() seconds; a request's are
measured from its submission, so under a concurrency limit a queued request's clock starts when it enters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..request import Request, RequestOutput
from ..spec_stats import SpecStats
from .engine import Engine


@dataclass
class Generation:
    """One request's outputs, in order; the last one is final."""

    request: Request
    outputs: list[RequestOutput] = field(default_factory=list)
    submitted: float = 0.0
    first_token_s: float | None = None  # submission -> the first output carrying tokens
    latency_s: float | None = None  # submission -> the final output

    @property
    def token_ids(self) -> list[int]:
        return [t for o in self.outputs for t in o.token_ids]

    @property
    def text(self) -> str:
        return "".join(o.text for o in self.outputs)

    @property
    def final(self) -> RequestOutput:
        return self.outputs[-1]

    @property
    def spec(self) -> SpecStats:
        return self.final.spec


@dataclass
class Run:
    generations: list[Generation]  # in the order the requests were given
    step_s: list[float]  # wall time of each engine.step()
    wall_s: float

    @property
    def errors(self) -> list[str]:
        return [g.final.error for g in self.generations if g.final.error]


def generate(engine: Engine, requests: list[Request], concurrency: int | None = None) -> Run:
    """Step the engine until every request has its final output. concurrency: at most that many of these
    requests in the engine at once, a finished one replaced by the next before the next step (a closed loop);
    None = all submitted at once."""
    gens = [Generation(r) for r in requests]
    by_id = {r.request_id: g for r, g in zip(requests, gens, strict=True)}
    todo = list(gens)
    live = 0
    step_s: list[float] = []
    t_start = time.perf_counter()
    while todo or live:
        while todo and (concurrency is None or live < concurrency):
            g = todo.pop(0)
            g.submitted = time.perf_counter()
            engine.add(g.request)
            live += 1
        t0 = time.perf_counter()
        outs = engine.step()
        now = time.perf_counter()
        step_s.append(now - t0)
        for out in outs:
            g = by_id[out.request_id]
            g.outputs.append(out)
            if out.token_ids and g.first_token_s is None:
                g.first_token_s = now - g.submitted
            if out.finished:
                g.latency_s = now - g.submitted
                live -= 1
        if engine.only_waiting_for_grammars():
            time.sleep(0.001)  # compiles run in their own threads: do not spin on them
    return Run(gens, step_s, time.perf_counter() - t_start)
