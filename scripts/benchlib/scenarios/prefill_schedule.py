"""Prefill scheduling on CPU: time to first token when several prompts arrive at once, in process, one run.

    python scripts/bench.py prefill_schedule            # 8 JME prompts at once, 128 tokens, median of 3
    python scripts/bench.py prefill_schedule --quick    # 2 prompts, 16 tokens: a smoke run

Two scheduling choices of the engine, each on and off (interleaved runs, medians):
  prompt-end steps   a step's prefill ends at a prompt's end once it holds 64 tokens (the CPU default), instead
                     of packing every step to max_prefill_tokens
  shared forward     the step's prompt chunks and verify rows go through one forward (the native forward's
                     default), instead of a prefill forward and a decode forward
Workloads: unguided target only, unguided n-gram auto, guided (JSON schema) n-gram auto. Greedy output ids must
not depend on the schedule (the `exact` column compares each row with the first setting's).
"""

from __future__ import annotations

from .. import report
from ..run import cpu_engine, ids, run_engine, ttft_cells
from ..workload import select_cases

SHARED = {"prompts": 8, "max_tokens": 128, "repeat": 3}
QUICK = {"prompts": 2, "max_tokens": 16, "repeat": 1}
QUICK_HELP = "2 prompts, 16 tokens, one run"
SETTINGS = {  # name -> (prompt-end steps, shared forward)
    "packed steps, two forwards": (False, False),
    "prompt-end steps": (True, False),
    "shared forward": (False, True),
    "both (default)": (True, True),
}
WORKLOADS = {
    "unguided, target only": (False, 0),
    "unguided, n-gram auto": (False, -1),
    "guided, n-gram auto": (True, -1),
}


def run(args) -> None:
    from specgram.model.source import open_source

    tok = open_source(args.model).tokenizer()
    cases = select_cases(tok, args.prompts, 128 if args.quick else args.max_tokens)  # none fits 16 tokens
    engine = cpu_engine(args.model, args.prompts, 640, args.max_tokens)
    pack_default, fuse_default = engine.scheduler.pack_tokens, engine.target.fuse_steps
    run_engine(engine, cases[:2], 4)  # warm-up
    results = {(w, s): [] for w in WORKLOADS for s in SETTINGS}
    for _ in range(args.repeat):
        for w, (guided, k) in WORKLOADS.items():
            for s, (prompt_end, shared) in SETTINGS.items():
                engine.scheduler.pack_tokens = pack_default if prompt_end else engine.scheduler.max_prefill_tokens
                engine.target.fuse_steps = fuse_default and shared
                results[(w, s)].append(
                    run_engine(engine, cases, args.max_tokens, 0, "ngram", k, guided, config=f"{w}; {s}")
                )
    lines = report.header(
        "Prefill scheduling",
        args,
        f"{len(cases)} JME extraction prompts sent at once "
        f"({sum(len(c['prompt_ids']) for c in cases)} prompt tokens in all), max_tokens "
        f"{args.max_tokens}, greedy, max_prefill_tokens {engine.scheduler.max_prefill_tokens}; "
        f"median of {args.repeat} interleaved runs",
    )
    first = next(iter(SETTINGS))
    lines += report.table(
        ["workload", "schedule", "TTFT p50 ms", "TTFT mean ms", "output tok/s", "exact"],
        ([w, s, *ttft_cells(results[(w, s)], ids(results[(w, first)][0]))] for w in WORKLOADS for s in SETTINGS),
    )
    report.write(args, lines, dict(records=[r for rs in results.values() for r in rs]))
