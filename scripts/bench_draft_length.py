"""Draft length: fixed k against auto (the engine chooses k per request per step), in process, one run.

    python scripts/bench_draft_length.py                          # 8 JME prompts, 128 tokens, c = 1 and 8
    python scripts/bench_draft_length.py --concurrency 1 2 4 8 16 --prompts 16
    python scripts/bench_draft_length.py --guided yes --compact-json  # schemas with a fixed JSON layout
    python scripts/bench_draft_length.py --ngram-min 2 1          # also compare n-gram suffix lengths (interleaved)
    python scripts/bench_draft_length.py --quick                  # 2 prompts, 32 tokens: a smoke run

Workload: JME extraction prompts (chat template, greedy), guided by each case's JSON schema and unguided;
n-gram lookup drafter. Closed loop: at most c requests in the engine; a finished one is replaced at once.
The configs of one (guide, c) cell run interleaved, --repeat times (median tok/s), so load changes hit them
alike. Per row:
  tok/s      output tokens / wall seconds
  vs k=0     tok/s / the k = 0 tok/s of the same cell
  vs best    tok/s / the best fixed k's tok/s of the same cell
  acc len    tokens committed per speculative step (1 + accepted drafts)
  mean k     drafts verified per decode step (every step, 0 included)
  sources    share of drafted tokens and acceptance per source (forced, prompt, output, guide)
  exact      greedy output ids equal the k = 0 ones for every prompt
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchlib import BENCH_ENGINE, REPO, machine, make_requests, select_cases, set_threads, versions

from specgram.config import EngineConfig
from specgram.engine.generate import generate
from specgram.request import AUTO_DRAFT

CONFIGS = {"k=0": 0, "k=2": 2, "k=4": 4, "k=8": 8, "auto": AUTO_DRAFT}


def run_cell(engine, cases, k, guided, concurrency, max_tokens) -> dict:
    reqs = make_requests(engine, [c["prompt_ids"] for c in cases], max_tokens, "ngram", k,
                         [c["guide"] for c in cases] if guided else None)
    run = generate(engine, reqs, concurrency)
    if run.errors:
        raise RuntimeError(run.errors[0])
    gens = run.generations
    sources: dict[str, list[int]] = {}
    k_hist: list[int] = []
    for g in gens:
        for s, (d, a) in g.spec.by_source.items():
            sources.setdefault(s, [0, 0])
            sources[s][0] += d
            sources[s][1] += a
        for kk, n in enumerate(g.spec.k_hist):
            k_hist.extend([0] * (kk + 1 - len(k_hist)))
            k_hist[kk] += n
    steps = sum(g.spec.steps for g in gens)
    return dict(tok_s=sum(len(g.token_ids) for g in gens) / run.wall_s, ids=[g.token_ids for g in gens],
                acc_len=(steps + sum(g.spec.accepted for g in gens)) / steps if steps else 0.0,
                mean_k=sum(kk * n for kk, n in enumerate(k_hist)) / max(sum(k_hist), 1), sources=sources)


def sources_text(sources: dict[str, list[int]]) -> str:
    total = sum(d for d, _ in sources.values())
    return ", ".join(f"{s} {d / total:.0%} (acc {a / d:.0%})" for s, (d, a) in sorted(sources.items()) if d) or "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {list(CONFIGS)}")
    ap.add_argument("--guided", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--ngram-min", type=int, nargs="+", default=[EngineConfig.ngram_min],
                    help="shortest n-gram suffix; several values: every config runs with each (rows 'auto n>=1')")
    ap.add_argument("--compact-json", action="store_true",
                    help="json_any_whitespace off: the schema fixes the layout (more grammar-forced tokens)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--out", default="", help="also write the markdown report here")
    ap.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, concurrency 1 and 2")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.concurrency = 2, 32, [1, 2]
    set_threads(args.threads)
    names = [c.strip() for c in args.configs.split(",")]
    if "k=0" not in names:
        names.insert(0, "k=0")
    # (row label, k, ngram_min): k = 0 does not draft, so it runs once
    configs = [(n if n == "k=0" or len(args.ngram_min) == 1 else f"{n} n>={m}", CONFIGS[n], m)
               for n in names for m in (args.ngram_min[:1] if n == "k=0" else args.ngram_min)]

    from specgram.engine.engine import Engine
    from specgram.engine.loading import load_tokenizer

    tok = load_tokenizer(args.model)
    cases = select_cases(tok, args.prompts, args.max_tokens)
    max_seq_len = max(len(c["prompt_ids"]) for c in cases) + args.max_tokens + 16
    engine = Engine.from_config(EngineConfig(checkpoint=args.model, device="cpu", dtype="float32",
                                             max_slots=max(args.concurrency), max_seq_len=max_seq_len,
                                             max_draft_len=8, drafter="ngram", ngram_min=min(args.ngram_min),
                                             json_any_whitespace=not args.compact_json, **BENCH_ENGINE))
    guided_modes = {"both": [False, True], "yes": [True], "no": [False]}[args.guided]
    lines = [f"Machine: {machine()}", f"Versions: {versions()}",
             f"Workload: {len(cases)} JME prompts, {args.max_tokens} tokens, greedy, n-gram lookup; repeat "
             f"{args.repeat}; json_any_whitespace {0 if args.compact_json else 1}", "",
             "| guided | c | config | tok/s | vs k=0 | vs best fixed | acc len | mean k | sources | exact |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for guided in guided_modes:
        run_cell(engine, cases[:2], AUTO_DRAFT, guided, 2, 16)          # warm-up (and the grammars' compiles)
        for c in args.concurrency:
            results: dict[str, list[dict]] = {name: [] for name, _, _ in configs}
            for _ in range(args.repeat):
                for name, k, n_min in configs:
                    engine.drafters["ngram"].n_min = n_min
                    results[name].append(run_cell(engine, cases, k, guided, c, args.max_tokens))
            tps = {name: statistics.median(r["tok_s"] for r in rs) for name, rs in results.items()}
            best_fixed = max(v for n, v in tps.items() if not n.startswith("auto"))
            for name, _, _ in configs:
                r = results[name][-1]
                exact = all(x["ids"] == results["k=0"][0]["ids"] for x in results[name])
                line = (f"| {'yes' if guided else 'no'} | {c} | {name} | {tps[name]:.1f} "
                        f"| {tps[name] / tps['k=0']:.2f} | {tps[name] / best_fixed:.2f} | {r['acc_len']:.2f} "
                        f"| {r['mean_k']:.2f} "
                        f"| {sources_text(r['sources'])} | {'yes' if exact else 'NO'} |")
                lines.append(line)
                print(line, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
