"""Prefill scheduling on CPU: time to first token when several prompts arrive at once, in process, one run.

    python scripts/bench_prefill_schedule.py            # 8 JME prompts at once, 128 tokens, median of 3
    python scripts/bench_prefill_schedule.py --quick    # 2 prompts, 16 tokens: a smoke run

Two scheduling choices of the engine, each on and off (interleaved runs, medians):
  prompt-end steps   a step's prefill ends at a prompt's end once it holds 64 tokens (the CPU default), instead
                     of packing every step to max_prefill_tokens
  shared forward     the step's prompt chunks and verify rows go through one forward (the native forward's
                     default), instead of a prefill forward and a decode forward
Workloads: unguided target only, unguided n-gram auto, guided (JSON schema) n-gram auto. Greedy output ids must
not depend on the schedule (the `exact` column compares each row with the first setting's).
"""
from __future__ import annotations

from benchlib import BENCH_ENGINE, arrival_args, arrival_cases, arrival_cells, arrival_header, arrival_run, emit_report

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.engine.loading import load_tokenizer
from specgram.request import AUTO_DRAFT

SETTINGS = {                                      # name -> (prompt-end steps, shared forward)
    "packed steps, two forwards": (False, False),
    "prompt-end steps": (True, False),
    "shared forward": (False, True),
    "both (default)": (True, True),
}
WORKLOADS = {"unguided, target only": (False, 0), "unguided, n-gram auto": (False, AUTO_DRAFT),
             "guided, n-gram auto": (True, AUTO_DRAFT)}


def main() -> None:
    args = arrival_args(__doc__)
    tok = load_tokenizer(args.model)
    cases = arrival_cases(tok, args)
    engine = Engine.from_config(EngineConfig(checkpoint=args.model, device="cpu", dtype="float32",
                                             max_slots=args.prompts, max_seq_len=640, max_draft_len=8,
                                             default_max_tokens=args.max_tokens, **BENCH_ENGINE))
    pack_default, fuse_default = engine.scheduler.pack_tokens, engine.fuse_prefill
    arrival_run(engine, cases[:2], 4)                                 # warm-up
    results = {(w, s): [] for w in WORKLOADS for s in SETTINGS}
    for _ in range(args.repeat):
        for w, (guided, k) in WORKLOADS.items():
            for s, (prompt_end, shared) in SETTINGS.items():
                engine.scheduler.pack_tokens = pack_default if prompt_end else engine.scheduler.max_prefill_tokens
                engine.fuse_prefill = fuse_default and shared
                results[(w, s)].append(arrival_run(engine, cases, args.max_tokens, k=k, guided=guided))
    prompt_tokens = sum(len(c["prompt_ids"]) for c in cases)
    lines = arrival_header("Prefill scheduling", "bench_prefill_schedule.py", args,
                           f"{len(cases)} JME extraction prompts sent at once ({prompt_tokens} prompt tokens in all), "
                           f"max_tokens {args.max_tokens}, greedy, max_prefill_tokens "
                           f"{engine.scheduler.max_prefill_tokens}; median of {args.repeat} interleaved runs")
    lines += [
        "| workload | schedule | TTFT p50 ms | TTFT mean ms | output tok/s | exact |",
        "|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        reference = results[(w, next(iter(SETTINGS)))][0]["ids"]
        for s in SETTINGS:
            lines.append("| " + " | ".join([w, s, *arrival_cells(results[(w, s)], reference)]) + " |")
    emit_report(lines, args.out)


if __name__ == "__main__":
    main()
