"""Draft length: fixed k against auto (the engine chooses k per request per step), in process, one run.

    python scripts/bench.py draft_length                          # 8 JME prompts, 128 tokens, c = 1 and 8
    python scripts/bench.py draft_length --concurrency 1 2 4 8 16 --prompts 16
    python scripts/bench.py draft_length --guided yes --compact-json  # schemas with a fixed JSON layout
    python scripts/bench.py draft_length --ngram-min 2 1          # also compare n-gram suffix lengths
    python scripts/bench.py draft_length --quick                  # 2 prompts, 32 tokens: a smoke run

Workload: JME extraction prompts (chat template, greedy), guided by each case's JSON schema and unguided;
n-gram lookup drafter. The configs of one (guide, c) cell run interleaved, --repeat times (median tok/s), so
load changes hit them alike. Per row:
  tok/s      output tokens / wall seconds
  vs k=0     tok/s / the k = 0 tok/s of the same cell
  vs best    tok/s / the best fixed k's tok/s of the same cell
  acc len    tokens committed per speculative step (1 + accepted drafts)
  mean k     drafts verified per decode step (every step, 0 included)
  sources    share of drafted tokens and acceptance per source (forced, prompt, output, guide)
  exact      greedy output ids equal the k = 0 ones for every prompt
"""

from __future__ import annotations

import statistics

from .. import report
from ..run import ids, run_engine, scenario_engine, tok_per_step, tok_s
from ..workload import choose, select_cases

SHARED = {"prompts": 8, "max_tokens": 128, "concurrency": [1, 8], "repeat": 1}
QUICK = {"prompts": 2, "max_tokens": 32, "concurrency": [1, 2]}
QUICK_HELP = "2 prompts, 32 tokens, concurrency 1 and 2"
CONFIGS = {"k=0": 0, "k=2": 2, "k=4": 4, "k=8": 8, "auto": -1}  # -1: specgram.request.AUTO_DRAFT


def add_options(ap) -> None:
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {list(CONFIGS)}")
    ap.add_argument("--guided", default="both", choices=["both", "yes", "no"])
    ap.add_argument(
        "--ngram-min",
        type=int,
        nargs="+",
        default=[1],
        help="shortest n-gram suffix; several values: every config runs with each (rows 'auto n>=1')",
    )
    ap.add_argument(
        "--compact-json",
        action="store_true",
        help="json_any_whitespace off: the schema fixes the layout (more grammar-forced tokens)",
    )


def draft_stats(rec: dict) -> tuple[float, dict[str, list[int]]]:
    """-> (drafts verified per decode step, {source: [drafted, accepted]}) over a record's requests."""
    sources: dict[str, list[int]] = {}
    k_hist: list[int] = []
    for g in rec["_run"].generations:
        for s, (d, a) in g.spec.by_source.items():
            sources.setdefault(s, [0, 0])
            sources[s][0] += d
            sources[s][1] += a
        for kk, n in enumerate(g.spec.k_hist):
            k_hist.extend([0] * (kk + 1 - len(k_hist)))
            k_hist[kk] += n
    return sum(kk * n for kk, n in enumerate(k_hist)) / max(sum(k_hist), 1), sources


def sources_text(sources: dict[str, list[int]]) -> str:
    total = sum(d for d, _ in sources.values())
    return ", ".join(f"{s} {d / total:.0%} (acc {a / d:.0%})" for s, (d, a) in sorted(sources.items()) if d) or "–"


def run(args) -> None:
    from specgram.model.source import open_source

    names = choose(args.configs, CONFIGS, ("k=0",))
    # (row label, k, ngram_min): k = 0 does not draft, so it runs once
    configs = [
        (n if n == "k=0" or len(args.ngram_min) == 1 else f"{n} n>={m}", CONFIGS[n], m)
        for n in names
        for m in (args.ngram_min[:1] if n == "k=0" else args.ngram_min)
    ]
    tok = open_source(args.model).tokenizer()
    cases = select_cases(tok, args.prompts, args.max_tokens)
    engine = scenario_engine(
        args, cases, drafter="ngram", ngram_min=min(args.ngram_min), json_any_whitespace=not args.compact_json
    )
    rows, records = [], []
    for guided in {"both": [False, True], "yes": [True], "no": [False]}[args.guided]:
        run_engine(engine, cases[:2], 16, 2, "ngram", -1, guided)  # warm-up (and the grammars' compiles)
        for c in args.concurrency:
            results: dict[str, list[dict]] = {name: [] for name, _, _ in configs}
            for _ in range(args.repeat):
                for name, k, n_min in configs:
                    engine.drafters["ngram"].n_min = n_min
                    results[name].append(run_engine(engine, cases, args.max_tokens, c, "ngram", k, guided, config=name))
            records += [r for rs in results.values() for r in rs]
            tps = {name: statistics.median(map(tok_s, rs)) for name, rs in results.items()}
            best_fixed = max(v for n, v in tps.items() if not n.startswith("auto"))
            for name, _, _ in configs:
                last = results[name][-1]
                mean_k, sources = draft_stats(last)
                exact = all(ids(x) == ids(results["k=0"][0]) for x in results[name])
                rows.append(
                    [
                        "yes" if guided else "no",
                        c,
                        name,
                        f"{tps[name]:.1f}",
                        f"{tps[name] / tps['k=0']:.2f}",
                        f"{tps[name] / best_fixed:.2f}",
                        f"{tok_per_step(last):.2f}" if mean_k else "0.00",
                        f"{mean_k:.2f}",
                        sources_text(sources),
                        "yes" if exact else "NO",
                    ]
                )
                report.log(" | ".join(map(str, rows[-1])))
    lines = report.header(
        "Draft length: fixed k against auto",
        args,
        f"{len(cases)} JME prompts, {args.max_tokens} tokens, greedy, n-gram lookup; repeat "
        f"{args.repeat}; json_any_whitespace {0 if args.compact_json else 1}",
    )
    lines += report.table(
        ["guided", "c", "config", "tok/s", "vs k=0", "vs best fixed", "acc len", "mean k", "sources", "exact"], rows
    )
    report.write(args, lines, dict(records=records))
