"""Throughput through tritonserver over gRPC streaming: aggregate and per-stream tok/s per concurrency, one run.

    python scripts/bench.py serving                       # starts its own server (model_repository/, BENCH_ENGINE)
    python scripts/bench.py serving --url localhost:8001 --concurrency 1 8 --prompts 8 --max-tokens 64
    python scripts/bench.py serving --extra '{"num_draft_tokens": 4}'
    python scripts/bench.py serving --quick               # c = 1 and 2, 2 requests, 16 tokens

Every request produces exactly --max-tokens tokens (ignore_eos), greedy, chat-templated prompts; each
concurrency level sends max(--prompts, c) requests in a closed loop. Per concurrency: aggregate output tok/s,
per-stream tok/s (a request's tokens / its latency, averaged), mean TTFT, and the ratio to the first row.
"""
from __future__ import annotations

import json
import statistics

from .. import report
from ..run import run_triton, served, tok_s
from ..workload import CHAT_PROMPTS

SHARED = {"concurrency": [1, 8], "prompts": 8, "max_tokens": 64}
QUICK = {"concurrency": [1, 2], "prompts": 2, "max_tokens": 16}
QUICK_HELP = "concurrency 1 and 2, 2 requests, 16 tokens"
ENGINE = False


def add_options(ap) -> None:
    ap.add_argument("--url", default="", help="gRPC url of a running server (default: start one here)")
    ap.add_argument("--extra", default="{}", help="JSON of extra inputs, e.g. '{\"num_draft_tokens\": 4}'")


def run(args) -> None:
    extra = {"ignore_eos": True, **json.loads(args.extra)}
    recs = []
    with served(args.url, log_path=report.raw_dir(args) / "tritonserver.log") as (url, _):
        run_triton(url, [dict(prompt=CHAT_PROMPTS[0])], 8, 1, extra=extra)          # warm-up
        for c in args.concurrency:
            n = max(args.prompts, c)
            cases = [dict(prompt=CHAT_PROMPTS[i % len(CHAT_PROMPTS)]) for i in range(n)]
            recs.append(run_triton(url, cases, args.max_tokens, c, extra=extra, system="ours via Triton"))
            report.log(f"c {c}: {tok_s(recs[-1]):.1f} tok/s")
    rows = [[r["concurrency"], f"{tok_s(r):.1f}",
             f"{statistics.mean(len(q['ids']) / q['latency_s'] for q in r['requests']):.1f}",
             f"{1e3 * statistics.mean(q['ttft_s'] for q in r['requests']):.0f}", f"{tok_s(r) / tok_s(recs[0]):.2f}×"]
            for r in recs]
    lines = report.header("Serving throughput over gRPC streaming", args,
                          f"max(--prompts, c) chat prompts per level, {args.max_tokens} tokens each (ignore_eos), "
                          f"greedy, extra inputs {extra}; {'server at ' + args.url if args.url else 'own server'}",
                          ("tritonclient", "nvidia-pytriton"))
    lines += report.table(["concurrency", "output tok/s (aggregate)", "per-stream tok/s", "mean TTFT ms",
                           f"ratio to c={recs[0]['concurrency']}"], rows)
    report.write(args, lines, dict(records=recs))
