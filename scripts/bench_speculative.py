"""Speculative decoding in process (no Triton): tok/s without speculation and with each drafter, one run.

    python scripts/bench_speculative.py                       # full run, ~10 min on a 2-core CPU
    python scripts/bench_speculative.py --quick               # 2 prompts, 48 tokens: a smoke run
    python scripts/bench_speculative.py --configs none,ngram-k4,int8-k2 --batches 8 --repeat 2

Same chat-templated greedy prompts for every row (extraction / JSON / code edits whose prompt holds text
to copy, so n-gram lookup has something to find). Batch 1 = the prompts one after another; batch 8 = all
submitted together. Per row:
  tok/s    output tokens / wall-clock seconds (median over --repeat runs)
  alpha    accepted / drafted draft tokens (from the final outputs' spec stats)
  c        one draft forward / one target forward: a 1-token decode at this batch size and a mid-run context
           length, median of interleaved repeats (ngram: 0)
  tok/step tokens committed per verify step: 1 + accepted drafts (steps without a proposal count too)
  v        one target forward over k+1 tokens / one over 1 token (the ideal assumes v = 1)
  speedup  tok/s / the no-speculation tok/s at the same batch size in this run
  ideal    (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))
  exact    greedy output ids equal the no-speculation ones for every prompt
Drafters: ngram (prompt lookup), bf16 (the target checkpoint in bfloat16), int8 (an int8 dynamic-quantized
copy of the target, specgram.quantize). Runs share one target runner; engines run one at a time.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import torch
from benchlib import chat_ids, common_args, machine, make_requests, run_batches, select_configs, set_threads, versions

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.engine.loading import load_tokenizer
from specgram.model.runner import ModelRunner
from specgram.speculation.draft_model import DraftModelDrafter

PROMPTS = [
    "Extract the people in this text as a JSON list of objects with keys name, age and city. Text: Alice Smith is 34 "
    "and lives in Paris. Bob Jones is 27 and lives in Berlin. Carol White is 45 and lives in Madrid.",
    "Rename the variable x to total in this Python code and return the whole code:\n```python\ndef order_value(items):\n"
    "    x = 0\n    for item in items:\n        x += item.price * item.quantity\n    return x\n```",
    "Convert this CSV to a JSON array of objects:\nname,color,price\napple,red,1.2\nbanana,yellow,0.5\ncherry,red,3.0\n"
    "grape,purple,2.1",
    "Return a JSON object describing this book, with keys title, author, year, genre and pages. Title: The Hobbit. "
    "Author: J. R. R. Tolkien. Year: 1937. Genre: Fantasy. Pages: 310.",
    "Turn this into a Markdown table with columns Country and Capital: France - Paris, Germany - Berlin, "
    "Italy - Rome, Spain - Madrid, Portugal - Lisbon, Greece - Athens.",
    "Fix the spelling mistakes in this text and return the corrected text: The quik brown fox jumpd over the lazy "
    "dog. It was a suny day and the fox was very hapy to be outside in the feild.",
    "Add type hints and a docstring to this Python function and return it:\n```python\ndef mean(values):\n"
    "    if not values:\n        return 0.0\n    return sum(values) / len(values)\n```",
    "List the steps of this recipe as a numbered list, one step per line: First boil a pot of salted water. Then add "
    "the pasta. Cook it for ten minutes. Drain the pasta. Add the tomato sauce, stir, and serve with cheese.",
]

# name -> (drafter key in the engine, draft model kind or None, k)
CONFIGS = {
    "none": (None, None, 0),
    "ngram-k2": ("ngram", None, 2),
    "ngram-k4": ("ngram", None, 4),
    "bf16-k2": ("draft_model", "bf16", 2),
    "bf16-k4": ("draft_model", "bf16", 4),
    "int8-k2": ("draft_model", "int8", 2),
    "int8-k4": ("draft_model", "int8", 4),
}


def load_draft(kind: str, target: ModelRunner, path: str, max_slots: int, max_seq_len: int) -> ModelRunner:
    if kind == "bf16":
        return ModelRunner.from_pretrained(path, max_slots, max_seq_len, torch.device("cpu"), torch.bfloat16)
    if kind == "int8":
        from specgram.model.quantize import quantize_dynamic_int8
        return ModelRunner(quantize_dynamic_int8(target.model), max_slots, max_seq_len)
    raise ValueError(kind)


def run_once(engine: Engine, prompt_ids, drafter, k, max_tokens, batch) -> tuple[float, list[list[int]], int, int, int]:
    """-> (seconds, output ids per prompt, drafted, accepted, verify steps). batch 1: one prompt at a time; else
    groups of `batch`."""
    reqs = make_requests(engine, prompt_ids, max_tokens, drafter, k)
    runs = run_batches(engine, reqs, batch)
    gens = [g for r in runs for g in r.generations]
    return (sum(r.wall_s for r in runs), [g.token_ids for g in gens], sum(g.spec.drafted for g in gens),
            sum(g.spec.accepted for g in gens), sum(g.spec.steps for g in gens))


@torch.inference_mode()
def forward_ms(calls: list[tuple[ModelRunner, int]], batch: int, context: int, repeats: int = 11) -> list[float]:
    """calls: (runner, width) -> median ms of one forward over `width` new tokens per row after `context` cached
    tokens at this batch size, each; the repeats interleave the calls so that load changes hit them alike."""
    slots = torch.arange(batch)
    tokens = torch.randint(100, 1000, (batch, context))
    for r in {id(r): r for r, _ in calls}.values():
        r.forward(tokens, slots, torch.zeros(batch, dtype=torch.long), torch.full((batch,), context), last_only=True)
    times: list[list[float]] = [[] for _ in calls]
    for rep in range(repeats + 1):
        for i, (r, width) in enumerate(calls):
            t0 = time.perf_counter()
            r.forward(tokens[:, :width], slots, torch.full((batch,), context), torch.full((batch,), width),
                      last_only=width == 1)
            if rep:                                   # the first round is a warm-up
                times[i].append(1000 * (time.perf_counter() - t0))
    return [statistics.median(t) for t in times]


def ideal_speedup(alpha: float, k: int, c: float) -> float:
    if k == 0:
        return 1.0
    gain = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return gain / (k * c + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, CONFIGS, 96, "2 prompts, 48 tokens, batches 1 and 2")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per row (median tok/s)")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.batches = 2, 48, [1, 2]
    set_threads(args.threads)
    names = select_configs(ap, args.configs, CONFIGS, ("none",))   # "none": the reference for speedup, exactness
    max_slots = max(args.batches)

    tok = load_tokenizer(args.model)
    prompt_ids = [chat_ids(tok, p) for p in PROMPTS[:args.prompts]]
    max_seq_len = max(map(len, prompt_ids)) + args.max_tokens + 16
    config = EngineConfig(checkpoint=args.model, device="cpu", dtype="float32", max_slots=max_slots,
                          max_seq_len=max_seq_len, max_draft_len=8, default_max_tokens=args.max_tokens)
    target = ModelRunner.from_pretrained(args.model, max_slots, max_seq_len, torch.device("cpu"), torch.float32)
    drafts: dict[str, ModelRunner] = {}
    for n in names:
        kind = CONFIGS[n][1]
        if kind and kind not in drafts:
            drafts[kind] = load_draft(kind, target, args.model, max_slots, max_seq_len)
    engines = {kind: Engine(config, target, tok, {"draft_model": DraftModelDrafter(r, target.vocab_size)})
               for kind, r in drafts.items()}
    engines[None] = Engine(config, target, tok)

    print(f"# {Path(args.model).name} fp32 target on {machine()}; {versions()}; "
          f"load avg {os.getloadavg()[0]:.1f}; {len(prompt_ids)} prompts (mean {statistics.mean(map(len, prompt_ids)):.0f}"
          f" tokens), max_tokens {args.max_tokens}, greedy, repeat {args.repeat}", flush=True)
    for kind, e in engines.items():                   # warm-up: every engine, every batch size
        for b in args.batches:
            run_once(e, prompt_ids[:b], "draft_model" if kind else "ngram", 2, 8, b)

    # cost ratios at a mid-run context length
    context = int(statistics.mean(map(len, prompt_ids))) + args.max_tokens // 2
    kinds = list(drafts)
    cost: dict[tuple[str, int], float] = {}
    verify: dict[tuple[int, int], float] = {}
    ks = sorted({CONFIGS[n][2] for n in names if CONFIGS[n][2]})
    for b in args.batches:
        ms = forward_ms([(target, 1), *((drafts[k], 1) for k in kinds), *((target, k + 1) for k in ks)], b, context)
        print(f"# batch {b}, context {context}: forward ms: target 1 token {ms[0]:.1f}"
              + "".join(f", {k} 1 token {m:.1f}" for k, m in zip(kinds, ms[1:]))
              + "".join(f", target {k + 1} tokens {m:.1f}" for k, m in zip(ks, ms[1 + len(kinds):])), flush=True)
        for k, m in zip(kinds, ms[1:]):
            cost[(k, b)] = m / ms[0]
        for k, m in zip(ks, ms[1 + len(kinds):]):
            verify[(k, b)] = m / ms[0]

    rows = []
    for b in args.batches:
        ref_ids, ref_tps = None, None
        for n in names:
            drafter, kind, k = CONFIGS[n]
            tps, outs, drafted, accepted, steps = [], None, 0, 0, 0
            for _ in range(args.repeat):
                gc.collect()
                dt, outs, drafted, accepted, steps = run_once(engines[kind], prompt_ids, drafter, k, args.max_tokens, b)
                tps.append(sum(map(len, outs)) / dt)
            t = statistics.median(tps)
            if n == "none":
                ref_ids, ref_tps = outs, t
            alpha = accepted / drafted if drafted else 0.0
            c = cost.get((kind, b), 0.0)
            row = dict(batch=b, config=n, k=k, tps=t, runs=tps, alpha=alpha, c=c, v=verify.get((k, b), 1.0),
                       speedup=t / ref_tps, per_step=(steps + accepted) / steps if steps else 1.0, ideal=ideal_speedup(alpha, k, c), exact=outs == ref_ids,
                       tokens=sum(map(len, outs)))
            rows.append(row)
            print(f"# batch {b} {n}: {t:.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in tps)}), "
                  f"alpha {alpha:.2f}, {row['tokens']} tokens", flush=True)

    print()
    print("| batch | drafter | k | output tok/s | α | tok/step | c | v | speedup | ideal | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["k"]:
            print(f"| {r['batch']} | {r['config'].rsplit('-k', 1)[0]} | {r['k']} | {r['tps']:.1f} | {r['alpha']:.2f} | "
                  f"{r['per_step']:.2f} | {r['c']:.2f} | {r['v']:.2f} | {r['speedup']:.2f}× | {r['ideal']:.2f}× | {'yes' if r['exact'] else 'NO'} |")
        else:
            print(f"| {r['batch']} | none | 0 | {r['tps']:.1f} | – | 1.00 | – | – | 1.00× | 1.00× | yes |")


if __name__ == "__main__":
    main()
