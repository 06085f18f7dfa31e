"""Sampled requests under speculation: coupled verification (the default) against rejection sampling, in process.

    python scripts/bench.py sampling                  # 8 JME prompts, 128 tokens, c = 1 and 8, guided and not
    python scripts/bench.py sampling --quick          # 2 prompts, 32 tokens: a smoke run

Workload: JME extraction prompts (chat template), sampled (temperature 0.8, top-p 0.95, one seed per prompt),
guided by each case's JSON schema and unguided. Drafters: n-gram lookup (auto and k = 4) and the target's int8
copy (k = 2); each under both rules (speculative_sampling coupled / rejection, switched on the same engine).
The configs of one (guide, c) cell run interleaved, --repeat times (median tok/s). Per row:
  tok/s      output tokens / wall seconds
  vs k=0     tok/s / the same cell's no-speculation tok/s
  vs rej     coupled tok/s / rejection tok/s of the same drafter and k
  accept     accepted / drafted draft tokens
  acc len    tokens committed per speculative step (1 + accepted drafts)
  = k=0      prompts whose output ids equal the no-speculation run's (coupled: all, by construction)
"""

from __future__ import annotations

import statistics

from .. import report
from ..run import ids, run_engine, scenario_engine, tok_per_step, tok_s
from ..workload import select_cases

SHARED = {"prompts": 8, "max_tokens": 128, "concurrency": [1, 8], "repeat": 1}
QUICK = {"prompts": 2, "max_tokens": 32, "concurrency": [1, 2]}
QUICK_HELP = "2 prompts, 32 tokens, concurrency 1 and 2"
SAMPLED = dict(temperature=0.8, top_p=0.95)
# (row label, drafter, k, rule); k = -1: auto (specgram.request.AUTO_DRAFT)
DRAFTERS = (("n-gram auto", "ngram", -1), ("n-gram k=4", "ngram", 4), ("int8 copy k=2", "draft_model", 2))
CONFIGS = [("k=0", "ngram", 0, "coupled")] + [
    (f"{name} {rule}", drafter, k, rule) for name, drafter, k in DRAFTERS for rule in ("coupled", "rejection")
]


def add_options(ap) -> None:
    ap.add_argument("--guided", default="both", choices=["both", "yes", "no"])


def accept_rate(rec: dict) -> float:
    drafted = rec["drafted"] or 0
    return rec["accepted"] / drafted if drafted else 0.0


def run(args) -> None:
    from specgram.model.source import open_source

    tok = open_source(args.model).tokenizer()
    cases = select_cases(tok, args.prompts, args.max_tokens)
    engine = scenario_engine(args, cases, draft_quantization="int8")
    seeds = [1000 + i for i in range(len(cases))]

    def timed(guided, c, name, drafter, k, rule):
        engine.logits.coupled = rule == "coupled"
        return run_engine(
            engine, cases, args.max_tokens, c, drafter, k, guided, config=name, params=dict(seeds=seeds, **SAMPLED)
        )

    rows, records = [], []
    for guided in {"both": [False, True], "yes": [True], "no": [False]}[args.guided]:
        timed(guided, 2, "warm-up", "draft_model", 2, "coupled")  # and the grammars' compiles
        for c in args.concurrency:
            results: dict[str, list[dict]] = {cfg[0]: [] for cfg in CONFIGS}
            for _ in range(args.repeat):
                for name, drafter, k, rule in CONFIGS:
                    results[name].append(timed(guided, c, name, drafter, k, rule))
            records += [r for rs in results.values() for r in rs]
            tps = {name: statistics.median(map(tok_s, rs)) for name, rs in results.items()}
            base = ids(results["k=0"][0])
            for name, _, k, rule in CONFIGS:
                last = results[name][-1]
                partner = name.replace("coupled", "rejection")
                same = sum(a == b for a, b in zip(ids(last), base, strict=True))
                rows.append(
                    [
                        "yes" if guided else "no",
                        c,
                        name,
                        f"{tps[name]:.1f}",
                        f"{tps[name] / tps['k=0']:.2f}",
                        f"{tps[name] / tps[partner]:.2f}" if rule == "coupled" and k else "–",
                        f"{accept_rate(last):.0%}" if k else "–",
                        f"{tok_per_step(last):.2f}" if k else "–",
                        f"{same}/{len(base)}",
                    ]
                )
                report.log(" | ".join(map(str, rows[-1])))
    engine.logits.coupled = True
    lines = report.header(
        "Sampled requests: coupled verification against rejection sampling",
        args,
        f"{len(cases)} JME prompts, {args.max_tokens} tokens, temperature {SAMPLED['temperature']}, "
        f"top-p {SAMPLED['top_p']}, one seed per prompt; repeat {args.repeat}",
    )
    lines += report.table(["guided", "c", "config", "tok/s", "vs k=0", "vs rej", "accept", "acc len", "= k=0"], rows)
    report.write(args, lines, dict(records=records))
