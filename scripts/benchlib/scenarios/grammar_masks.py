"""The grammar scenario's instrument: wall time in grammar-mask code per engine.step(), by outermost call.

MaskTimer.install() wraps StepMasks.fill / forced_prefix / seal / apply / rows_for, Guide.try_tentative /
rollback / commit, xgrammar.apply_token_bitmask_inplace and Engine.step (in this process, for the rest of it);
each guided step's times are kept, and mask_summary() turns a run's steps into the report's figures. Imports
specgram and xgrammar: load it inside a scenario's run().
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import xgrammar

from specgram.engine.engine import Engine
from specgram.grammar import guide as grammar_mod
from specgram.grammar import masks as masks_mod

from ..workload import pct

MASK = ("fill", "forced_prefix", "seal", "apply", "tentative")  # the headline "mask work"


class MaskTimer:
    def __init__(self):
        self.depth = 0
        self.cur: dict[str, float] = defaultdict(float)  # outermost calls, this step
        self.incl: dict[str, float] = defaultdict(float)  # every call, this step
        self.calls: dict[str, int] = defaultdict(int)
        self.forced = 0
        self.guides: set[int] = set()
        self.steps: list[dict] = []
        self.enabled = True

    def wrap(self, owner, attr: str, cat: str) -> None:
        fn, timer = getattr(owner, attr), self

        def wrapped(*a, **kw):
            outer = timer.depth == 0
            timer.depth += 1
            t0 = time.perf_counter()
            try:
                out = fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                timer.depth -= 1
                timer.incl[cat] += dt  # inclusive, nested or not
                timer.calls[cat] += 1
                if outer:  # nested calls are counted in their outermost caller
                    timer.cur[cat] += dt
            if cat == "forced_prefix":
                timer.forced += len(out)
            if cat == "commit":
                timer.guides.add(id(a[0]))
            return out

        wrapped.__wrapped__ = fn
        setattr(owner, attr, wrapped)

    def install(self) -> None:
        SM, G = masks_mod.StepMasks, grammar_mod.Guide
        for attr in ("fill", "forced_prefix", "seal", "apply", "rows_for"):  # rows_for: inside apply (gather)
            self.wrap(SM, attr, attr)
        self.wrap(G, "try_tentative", "tentative")  # top level only from the drafting picks
        self.wrap(G, "rollback", "rollback")  # top level never (inside seal); kept for completeness
        self.wrap(G, "commit", "commit")
        self.wrap(xgrammar, "apply_token_bitmask_inplace", "kernel")  # inside apply: xgrammar's CPU kernel
        self.wrap(masks_mod, "apply_native", "kernel")  # ... or the native one (kernels/mask.c)
        orig_step, timer = Engine.step, self

        def step(engine):
            for d in (timer.cur, timer.incl, timer.calls, timer.guides):
                d.clear()
            timer.forced = 0
            t0 = time.perf_counter()
            out = orig_step(engine)
            wall = time.perf_counter() - t0
            if timer.enabled and timer.guides:
                timer.steps.append(
                    dict(
                        wall=wall,
                        n=len(timer.guides),
                        fills=timer.calls["fill"],
                        forced=timer.forced,
                        fill_incl=timer.incl["fill"],
                        rows_for=timer.incl["rows_for"],
                        kernel=timer.incl["kernel"],
                        apply_calls=timer.calls["apply"],
                        mask=sum(timer.cur[c] for c in MASK),
                        **dict(timer.cur),
                    )
                )
            return out

        Engine.step = step

    def take(self) -> list[dict]:
        s, self.steps = self.steps, []
        return s


def mask_summary(steps: list[dict]) -> dict:
    per_step = [1e6 * s["mask"] for s in steps]
    per_req = [1e6 * s["mask"] / s["n"] for s in steps]
    tot = max(sum(s["mask"] for s in steps), 1e-12)
    cats = {c: sum(s.get(c, 0.0) for s in steps) for c in MASK}
    return dict(
        steps=len(steps),
        step_p50=pct(per_step, 50),
        step_p90=pct(per_step, 90),
        step_p99=pct(per_step, 99),
        req_p50=pct(per_req, 50),
        req_p90=pct(per_req, 90),
        req_p99=pct(per_req, 99),
        commit_p50=pct([1e6 * s.get("commit", 0.0) for s in steps], 50),
        share=sum(s["mask"] for s in steps) / max(sum(s["wall"] for s in steps), 1e-12),
        fills_per_step=statistics.mean(s["fills"] for s in steps) if steps else 0.0,
        fill_us=1e6 * sum(s["fill_incl"] for s in steps) / max(sum(s["fills"] for s in steps), 1),
        fill_share=sum(s["fill_incl"] for s in steps) / tot,
        breakdown={c: v / tot for c, v in cats.items()},
        rows_for_share=sum(s["rows_for"] for s in steps) / tot,
        kernel_share=sum(s["kernel"] for s in steps) / tot,
        apply_us=1e6 * cats["apply"] / max(sum(s["apply_calls"] for s in steps), 1),
    )
