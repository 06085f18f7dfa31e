"""Prompt-prefix reuse: time to first token and throughput with `prefix_cache` off and on, in process, one run.

    python scripts/bench.py prefix_cache                # 8 JME prompts arriving at once, 128 tokens
    python scripts/bench.py prefix_cache --quick        # 2 prompts, 16 tokens: a smoke run

Workload: JME extraction prompts (chat template, greedy, unguided, target only). They share their first
tokens (the chat template's system prompt and the instruction) and then differ. Three scenarios per
setting, each starting from a cache that holds nothing reusable:
  one at a time   the prompts one after another (c = 1): each reuses the shared opening that the one
                  before it prefilled
  at once         all prompts sent together (c = number of prompts): admitted in the same step, none finds
                  anything prefilled yet
  resent          the same prompts again right after "at once" (retried or repeated requests): each reuses
                  all but its last prompt token
Off and on run interleaved, --repeat times (medians). Greedy output ids must be the same with and without
reuse (the `exact` column).
"""

from __future__ import annotations

import statistics

from .. import report
from ..run import cpu_engine, ids, run_engine, ttft_cells
from ..workload import select_cases

SHARED = {"prompts": 8, "max_tokens": 128, "repeat": 3}
QUICK = {"prompts": 2, "max_tokens": 16, "repeat": 1}
QUICK_HELP = "2 prompts, 16 tokens, one run"
SCENARIOS = {"one at a time": 1, "at once": 0, "resent": 0}  # -> concurrency (0 = all at once)


def run(args) -> None:
    from specgram.model.source import open_source

    tok = open_source(args.model).tokenizer()
    cases = select_cases(tok, args.prompts, 128 if args.quick else args.max_tokens)  # none fits 16 tokens
    engines = {
        mode: cpu_engine(args.model, args.prompts, 640, args.max_tokens, prefix_cache=mode) for mode in ("off", "on")
    }
    for engine in engines.values():  # warm-up
        run_engine(engine, cases[:2], 4)
    results = {(mode, scen): [] for mode in engines for scen in SCENARIOS}
    for _ in range(args.repeat):
        for mode, engine in engines.items():
            for scen, c in SCENARIOS.items():
                if engine.prefix and scen != "resent":
                    engine.prefix.clear()
                # one cache scope for every run: "resent" reuses what "at once" prefilled (the clears above start
                # the others cold)
                run = run_engine(engine, cases, args.max_tokens, c, cache_salt="prefix-bench", config=f"{mode}; {scen}")
                results[(mode, scen)].append(run)
    reference = ids(results[("off", "at once")][0])
    rows = []
    for scen in SCENARIOS:
        for mode in engines:
            rs = results[(mode, scen)]
            p50, mean, tps, exact = ttft_cells(rs, reference)
            reused = int(statistics.median(sum(q["reused"] for q in r["requests"]) for r in rs))
            rows.append([scen, mode, p50, mean, tps, reused, exact])
    lines = report.header(
        "Prompt-prefix reuse",
        args,
        f"{len(cases)} JME extraction prompts ({sum(len(c['prompt_ids']) for c in cases)} prompt "
        f"tokens in all), max_tokens {args.max_tokens}, greedy, unguided, target only; median of "
        f"{args.repeat} interleaved runs",
    )
    lines += report.table(
        ["scenario", "prefix_cache", "TTFT p50 ms", "TTFT mean ms", "output tok/s", "prompt tokens reused", "exact"],
        rows,
    )
    report.write(args, lines, dict(records=[r for rs in results.values() for r in rs]))
