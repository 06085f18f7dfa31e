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

import argparse
import statistics

from benchlib import BENCH_ENGINE, REPO, machine, make_requests, select_cases, set_threads, versions

from specgram.config import EngineConfig
from specgram.engine import Engine
from specgram.generate import generate
from specgram.loading import load_tokenizer


def run_once(engine, cases, max_tokens, concurrency=0) -> dict:
    reqs = make_requests(engine, [c["prompt_ids"] for c in cases], max_tokens)
    run = generate(engine, reqs, concurrency or len(reqs))
    ttft = [g.first_token_s for g in run.generations]
    return dict(ttft_p50=statistics.median(ttft), ttft_mean=statistics.mean(ttft),
                tok_s=sum(len(g.token_ids) for g in run.generations) / run.wall_s,
                reused=sum(r.cached_prompt_tokens for r in reqs), ids=[g.token_ids for g in run.generations])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--out", default="", help="also write the markdown report here")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.repeat = 2, 16, 1
    set_threads(args.threads)
    tok = load_tokenizer(args.model)
    cases = select_cases(tok, args.prompts, args.max_tokens)
    settings = {**BENCH_ENGINE}
    engines = {}
    for mode in ("off", "on"):
        settings["prefix_cache"] = mode
        engines[mode] = Engine.from_config(EngineConfig(checkpoint=args.model, device="cpu", dtype="float32",
                                                        max_slots=args.prompts, max_seq_len=640,
                                                        default_max_tokens=args.max_tokens, **settings))
    for engine in engines.values():                                   # warm-up
        run_once(engine, cases[:2], 4)
    scenarios = ("one at a time", "at once", "resent")
    results = {(mode, scen): [] for mode in engines for scen in scenarios}
    for _ in range(args.repeat):
        for mode, engine in engines.items():
            for scen in scenarios:
                if engine.prefix and scen != "resent":
                    engine.prefix.clear()
                c = 1 if scen == "one at a time" else 0
                results[(mode, scen)].append(run_once(engine, cases, args.max_tokens, c))
    reference = results[("off", "at once")][0]["ids"]
    prompt_tokens = sum(len(c["prompt_ids"]) for c in cases)
    lines = ["# Prompt-prefix reuse", "",
             f"Command: `python scripts/bench_prefix_cache.py{' --quick' if args.quick else ''}`  ",
             f"Machine: {machine()}  ", f"Versions: {versions()}  ",
             f"Workload: {len(cases)} JME extraction prompts ({prompt_tokens} prompt tokens in all), "
             f"max_tokens {args.max_tokens}, greedy, unguided, target only; median of {args.repeat} interleaved runs",
             "",
             "| scenario | prefix_cache | TTFT p50 ms | TTFT mean ms | output tok/s | prompt tokens reused | exact |",
             "|---|---|---|---|---|---|---|"]
    for scen in scenarios:
        for mode in engines:
            rs = results[(mode, scen)]
            def med(key, rs=rs):
                return statistics.median(r[key] for r in rs)
            exact = all(r["ids"] == reference for r in rs)
            lines.append(f"| {scen} | {mode} | {med('ttft_p50') * 1e3:.0f} | {med('ttft_mean') * 1e3:.0f} | "
                         f"{med('tok_s'):.1f} | {int(med('reused'))} | {'yes' if exact else 'NO'} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
