"""Speculative decoding in process: tok/s without speculation and with each drafter, one run.

    python scripts/bench.py speculative                       # full run, ~7 min on a 2-core CPU
    python scripts/bench.py speculative --quick               # 2 prompts, 48 tokens: a smoke run
    python scripts/bench.py speculative --configs none,ngram-k4,int8-k2 --concurrency 8 --repeat 2

The same chat-templated greedy prompts for every row (extraction / JSON / code edits whose prompt holds text
to copy, so n-gram lookup has something to find), at each --concurrency (c = 1: one after another; c = 8 with
8 prompts: all at once). The rows of one c run interleaved, --repeat times. Per row:
  tok/s    output tokens / wall-clock seconds (median over --repeat runs)
  alpha    accepted / drafted draft tokens
  tok/step tokens committed per verify step: 1 + accepted drafts
  c        one draft forward / one target forward: a 1-token decode at this batch size and a mid-run context
           length, median of interleaved repeats (ngram: 0)
  v        one target forward over k+1 tokens / one over 1 token (the ideal assumes v = 1)
  speedup  tok/s / the no-speculation tok/s at the same concurrency in this run
  ideal    (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))
  exact    greedy output ids equal the no-speculation ones for every prompt
Drafters: ngram (prompt lookup), bf16 (the target checkpoint in bfloat16), int8 (an int8 dynamic-quantized
copy of the target, specgram.model.quantize), int8n (the target's int8 copy on the native kernels, what
draft_quantization int8 loads where they run: int16 activations on VNNI, else fp32 ones; it reads and writes
the target's own KV cache). k "auto": the engine
chooses k per request per step; the "-planner" rows run with the engine's fallback to plain decoding off
(spec_fallback 0: the planner's choices alone).
--prompt-set chat: open-ended chat prompts instead (free text: nothing in the prompt to copy).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .. import report
from ..run import acceptance, cpu_config, ids, run_engine, tok_per_step, tok_s
from ..workload import CHAT_PROMPTS, COPY_PROMPTS, choose, text_cases

SHARED = {"prompts": len(COPY_PROMPTS), "max_tokens": 96, "concurrency": [1, 8], "repeat": 1}
QUICK = {"prompts": 2, "max_tokens": 48, "concurrency": [1, 2]}
QUICK_HELP = "2 prompts, 48 tokens, concurrency 1 and 2"

# name -> (drafter key in the engine, draft model kind or None, k)
CONFIGS = {
    "none": (None, None, 0),
    "ngram-k2": ("ngram", None, 2),
    "ngram-k4": ("ngram", None, 4),
    "bf16-k2": ("draft_model", "bf16", 2),
    "bf16-k4": ("draft_model", "bf16", 4),
    "int8-k2": ("draft_model", "int8", 2),
    "int8-k4": ("draft_model", "int8", 4),
    "ngram-auto": ("ngram", None, -1),
    "int8n-k2": ("draft_model", "int8n", 2),
    "int8n-k4": ("draft_model", "int8n", 4),
    "int8n-auto": ("draft_model", "int8n", -1),
    "int8n-auto-planner": ("draft_model", "int8n", -1),  # the engine's fallback off: the planner's choices alone
    "ngram-auto-planner": ("ngram", None, -1),
}
PLANNER_ONLY = {"int8n-auto-planner", "ngram-auto-planner"}  # rows run with spec_fallback 0
PROMPT_SETS = {"copy": COPY_PROMPTS, "chat": CHAT_PROMPTS}


def add_options(ap) -> None:
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated rows from {list(CONFIGS)}")
    ap.add_argument(
        "--prompt-set",
        choices=sorted(PROMPT_SETS),
        default="copy",
        help="copy: prompts holding text to copy; chat: open-ended chat prompts (free text)",
    )


def load_draft(kind: str, target, path: str, slots: int, max_seq_len: int):
    import torch

    from specgram.model.choice import choose_for, int8_form
    from specgram.model.runner import ModelRunner
    from specgram.model.source import open_source
    from specgram.model.whole import load_model

    if kind == "bf16":
        return ModelRunner(load_model(open_source(path), torch.device("cpu"), torch.bfloat16), slots, max_seq_len)
    if kind == "int8n":  # as the engine's int8 copy (engine/settings.py)
        return ModelRunner(
            target.model,
            slots,
            max_seq_len,
            choose_for(target.model, weights=int8_form(target.native.lib)),
            cache=target.cache,
        )
    from specgram.model.quantize import quantize_dynamic_int8

    return ModelRunner(quantize_dynamic_int8(target.model), slots, max_seq_len)


def forward_ms(calls: list, batch: int, context: int, repeats: int = 11) -> list[float]:
    """calls: (runner, width) -> median ms of one forward over `width` new tokens per row after `context` cached
    tokens at this batch size, each; the repeats interleave the calls so that load changes hit them alike."""
    import torch

    slots = torch.arange(batch)
    tokens = torch.randint(min(100, calls[0][0].vocab_size // 2), min(1000, calls[0][0].vocab_size), (batch, context))
    with torch.inference_mode():
        for r in {id(r): r for r, _ in calls}.values():
            r.forward(
                tokens, slots, torch.zeros(batch, dtype=torch.long), torch.full((batch,), context), last_only=True
            )
        times: list[list[float]] = [[] for _ in calls]
        for rep in range(repeats + 1):
            for i, (r, width) in enumerate(calls):
                t0 = time.perf_counter()
                r.forward(
                    tokens[:, :width],
                    slots,
                    torch.full((batch,), context),
                    torch.full((batch,), width),
                    last_only=width == 1,
                )
                if rep:  # the first round is a warm-up
                    times[i].append(1000 * (time.perf_counter() - t0))
    return [statistics.median(t) for t in times]


def ideal_speedup(alpha: float, k: int, c: float) -> float:
    if k == 0:
        return 1.0
    gain = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return gain / (k * c + 1)


def run(args) -> None:
    import torch

    from specgram.engine.engine import Engine
    from specgram.engine.settings import resolve
    from specgram.model.runner import ModelRunner
    from specgram.model.source import open_source
    from specgram.model.whole import load_model
    from specgram.speculation.draft_model import DraftModelDrafter

    names = choose(args.configs, CONFIGS, ("none",))  # "none": the reference for speedup and exactness
    slots = max(args.concurrency)
    source = open_source(args.model)
    tok = source.tokenizer()
    cases = text_cases(tok, PROMPT_SETS[args.prompt_set][: args.prompts])
    lens = [len(c["prompt_ids"]) for c in cases]
    max_seq_len = max(lens) + args.max_tokens + 16
    config = cpu_config(args.model, slots, max_seq_len, args.max_tokens)
    settings = resolve(config)  # requests name their drafter: settings.drafter is not read
    target = ModelRunner(load_model(source, torch.device("cpu"), torch.float32), slots, max_seq_len)
    drafts = {
        kind: load_draft(kind, target, args.model, slots, max_seq_len)
        for kind in dict.fromkeys(CONFIGS[n][1] for n in names)
        if kind
    }
    engines = {
        kind: Engine(config, settings, target, tok, {"draft_model": DraftModelDrafter(r, target.vocab_size)})
        for kind, r in drafts.items()
    }
    engines[None] = Engine(config, settings, target, tok)
    for kind, e in engines.items():  # warm-up: every engine, every concurrency
        for c in args.concurrency:
            run_engine(e, cases[:c], 8, c, "draft_model" if kind else "ngram", 2)

    context = int(statistics.mean(lens)) + args.max_tokens // 2  # cost ratios at a mid-run context length
    ks = sorted({CONFIGS[n][2] for n in names if CONFIGS[n][2] > 0})
    cost, verify, notes = {}, {}, []
    for c in args.concurrency:
        ms = forward_ms([(target, 1), *((drafts[k], 1) for k in drafts), *((target, k + 1) for k in ks)], c, context)
        cost.update({(kind, c): m / ms[0] for kind, m in zip(drafts, ms[1:], strict=False)})
        verify.update({(k, c): m / ms[0] for k, m in zip(ks, ms[1 + len(drafts) :], strict=True)})
        notes.append(
            f"- c {c}, context {context}: forward ms: target 1 token {ms[0]:.1f}"
            + "".join(f", {kind} 1 token {m:.1f}" for kind, m in zip(drafts, ms[1:], strict=False))
            + "".join(f", target {k + 1} tokens {m:.1f}" for k, m in zip(ks, ms[1 + len(drafts) :], strict=True))
        )
        report.log(notes[-1][2:])

    rows, records = [], []
    for c in args.concurrency:
        runs: dict[str, list[dict]] = {n: [] for n in names}
        held = {n: [0, 0] for n in names}  # the fallback's held and decided decode steps over the runs
        for _ in range(args.repeat):  # interleaved: load changes hit every row alike
            for n in names:
                drafter, kind, k = CONFIGS[n]
                fb = engines[kind].fallback
                fb.enabled, before = n not in PLANNER_ONLY, (fb.held_steps, fb.steps)
                runs[n].append(run_engine(engines[kind], cases, args.max_tokens, c, drafter, k, config=n))
                held[n] = [held[n][0] + fb.held_steps - before[0], held[n][1] + fb.steps - before[1]]
                report.log(f"c {c} {n}: {tok_s(runs[n][-1]):.1f} tok/s")
        records += [r for rs in runs.values() for r in rs]
        notes += [
            f"- c {c} {n}: auto drafted nothing (the fallback) in {h} of {s} decode steps"
            for n, (h, s) in held.items()
            if s
        ]
        ref_tps = statistics.median(map(tok_s, runs["none"]))
        for n in names:
            _, kind, k = CONFIGS[n]
            last, t = runs[n][-1], statistics.median(map(tok_s, runs[n]))
            alpha, cc = acceptance(last) or 0.0, cost.get((kind, c), 0.0)
            exact = all(ids(r) == ids(runs["none"][0]) for r in runs[n])
            rows.append(
                [
                    c,
                    n.replace("-auto", "") if k < 0 else n.rsplit("-k", 1)[0],
                    "auto" if k < 0 else k,
                    f"{t:.1f}",
                    f"{alpha:.2f}" if k else "–",
                    f"{tok_per_step(last):.2f}",
                    f"{cc:.2f}" if k else "–",
                    f"{verify.get((k, c), 1.0):.2f}" if k > 0 else "–",
                    f"{t / ref_tps:.2f}×",
                    f"{ideal_speedup(alpha, k, cc):.2f}×" if k >= 0 else "–",
                    "yes" if exact else "NO",
                ]
            )
    lines = report.header(
        "Speculative decoding in process",
        args,
        f"{Path(args.model).name} fp32 target; {len(cases)} {args.prompt_set} prompts (mean "
        f"{statistics.mean(lens):.0f} tokens), max_tokens {args.max_tokens}, greedy, repeat "
        f"{args.repeat}",
    )
    lines += [
        *report.table(
            ["c", "drafter", "k", "output tok/s", "α", "tok/step", "c (cost)", "v", "speedup", "ideal", "exact"], rows
        ),
        "",
        *notes,
    ]
    report.write(args, lines, dict(records=records))
