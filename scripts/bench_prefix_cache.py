"""Prompt-prefix reuse: time to first token and throughput with `prefix_cache` off and on, in process, one run.

    python scripts/bench_prefix_cache.py                # 8 JME prompts arriving at once, 128 tokens
    python scripts/bench_prefix_cache.py --quick        # 2 prompts, 16 tokens: a smoke run

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

from benchlib import BENCH_ENGINE, arrival_args, arrival_cases, arrival_cells, arrival_header, arrival_run, emit_report

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.engine.loading import load_tokenizer


def main() -> None:
    args = arrival_args(__doc__)
    tok = load_tokenizer(args.model)
    cases = arrival_cases(tok, args)
    settings = {**BENCH_ENGINE}
    engines = {}
    for mode in ("off", "on"):
        settings["prefix_cache"] = mode
        engines[mode] = Engine.from_config(EngineConfig(checkpoint=args.model, device="cpu", dtype="float32",
                                                        max_slots=args.prompts, max_seq_len=640,
                                                        default_max_tokens=args.max_tokens, **settings))
    for engine in engines.values():                                   # warm-up
        arrival_run(engine, cases[:2], 4)
    scenarios = ("one at a time", "at once", "resent")
    results = {(mode, scen): [] for mode in engines for scen in scenarios}
    for _ in range(args.repeat):
        for mode, engine in engines.items():
            for scen in scenarios:
                if engine.prefix and scen != "resent":
                    engine.prefix.clear()
                c = 1 if scen == "one at a time" else 0
                results[(mode, scen)].append(arrival_run(engine, cases, args.max_tokens, c))
    reference = results[("off", "at once")][0]["ids"]
    prompt_tokens = sum(len(c["prompt_ids"]) for c in cases)
    lines = arrival_header("Prompt-prefix reuse", "bench_prefix_cache.py", args,
                           f"{len(cases)} JME extraction prompts ({prompt_tokens} prompt tokens in all), "
                           f"max_tokens {args.max_tokens}, greedy, unguided, target only; median of {args.repeat} "
                           "interleaved runs")
    lines += [
        "| scenario | prefix_cache | TTFT p50 ms | TTFT mean ms | output tok/s | prompt tokens reused | exact |",
        "|---|---|---|---|---|---|---|"]
    for scen in scenarios:
        for mode in engines:
            rs = results[(mode, scen)]
            p50, mean, tok_s, exact = arrival_cells(rs, reference)
            reused = int(statistics.median(r["reused"] for r in rs))
            lines.append(f"| {scen} | {mode} | {p50} | {mean} | {tok_s} | {reused} | {exact} |")
    emit_report(lines, args.out)


if __name__ == "__main__":
    main()
