"""genai-perf against model `llm` over gRPC streaming: one run per concurrency, its four figures summarized.

    python scripts/bench.py genai_perf --out docs/benchmarks/genai_perf/summary.md     # c = 1 2 4 8 16
    python scripts/bench.py genai_perf --concurrency 1 8 --url localhost:8001          # a running server
    python scripts/bench.py genai_perf --quick                                         # c = 1, 16 tokens

genai-perf 0.0.16 goes into its own venv, build/peers/genai-perf, on demand (never by set-up or CI). Its
PyPI dependency `perf-analyzer` is an empty placeholder, so it runs the project's perf_analyzer 2.51 (.venv/bin,
libraries from build/lib; scripts/setup.sh provides both). Synthetic prompts of --input-tokens tokens; exact
output lengths from max_tokens + ignore_eos (genai-perf's --output-tokens-mean-deterministic, which sends
min_tokens, works too: docs/operating.md). No warm-up requests: perf_analyzer 2.51 with
--warmup-request-count 1 at concurrency 2 never stopped sending. genai-perf's CSV exports and logs stay in the
raw folder (build/bench/genai_perf/c<N>.csv, c<N>.log).
"""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

from .. import REPO, report
from ..run import served

SHARED = {"concurrency": [1, 2, 4, 8, 16], "max_tokens": 48}
QUICK = {"concurrency": [1], "max_tokens": 16}
QUICK_HELP = "concurrency 1, 16 output tokens"
VENV = REPO / "build" / "peers" / "genai-perf"
VERSION = "0.0.16"


def add_options(ap) -> None:
    ap.add_argument("--url", default="", help="gRPC url of a running server (default: start one here)")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default 2 x c, at least 4)")
    ap.add_argument("--input-tokens", type=int, default=200, help="synthetic prompt length")


def read_csv(text: str) -> dict[str, dict[str, str]]:
    """genai-perf's CSV: a per-metric table (Metric, avg, min, max, p99, ...), a blank line, then single-value
    rows (Metric, Value). -> metric -> column -> value."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] = []
    for line in csv.reader(text.splitlines()):
        if not line or not any(line):
            header = []
        elif line[0] == "Metric":
            header = line
        else:
            rows[line[0]] = dict(zip(header[1:] if header else ["value"], line[1:], strict=False))
    return rows


def pick(rows: dict, name: str, col: str) -> float:
    for key, vals in rows.items():
        if key.split(" (")[0].lower() == name.lower():
            v = vals.get(col) or vals.get("value") or next(iter(vals.values()), "")
            return float(v.replace(",", "")) if v else float("nan")
    return float("nan")


def summary_row(c: int, rows: dict) -> list[str]:
    """A report row of one concurrency's CSV: TTFT avg / p99 ms, ITL avg / p99 ms, output tok/s, requests/s."""
    ttft = "Time To First Token"
    return [
        str(c),
        f"{pick(rows, ttft, 'avg'):.0f}",
        f"{pick(rows, ttft, 'p99'):.0f}",
        f"{pick(rows, 'Inter Token Latency', 'avg'):.1f}",
        f"{pick(rows, 'Inter Token Latency', 'p99'):.1f}",
        f"{pick(rows, 'Output Token Throughput', 'value'):.1f}",
        f"{pick(rows, 'Request Throughput', 'value'):.2f}",
    ]


def ensure_genai_perf() -> None:
    if (VENV / "bin" / "genai-perf").exists():
        return
    subprocess.run(["/usr/bin/python3.11", "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "-U", "pip"], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"genai-perf=={VERSION}"], check=True)


def run(args) -> int:
    ensure_genai_perf()
    raw = report.raw_dir(args)
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(VENV / "bin"), str(REPO / ".venv" / "bin"), os.environ["PATH"]]),
        LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(REPO / "build" / "lib"), os.environ.get("LD_LIBRARY_PATH")])),
    )
    rows = []
    with served(args.url, log_path=raw / "tritonserver.log") as (url, _):
        for c in args.concurrency:
            n = args.requests or max(2 * c, 4)
            report.log(f"genai-perf: concurrency {c}, {n} requests")
            art = raw / "artifacts" / f"c{c}"
            cmd = [
                "genai-perf",
                "profile",
                "-m",
                "llm",
                "--backend",
                "vllm",
                "--endpoint-type",
                "kserve",
                "--streaming",
                "-u",
                url,
                "--tokenizer",
                args.model,
                "--concurrency",
                str(c),
                "--request-count",
                str(n),
                "--warmup-request-count",
                "0",
                "--synthetic-input-tokens-mean",
                str(args.input_tokens),
                "--synthetic-input-tokens-stddev",
                "0",
                "--output-tokens-mean",
                str(args.max_tokens),
                "--extra-inputs",
                "ignore_eos:true",
                "--random-seed",
                "0",
                "--artifact-dir",
                str(art),
            ]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            (raw / f"c{c}.log").write_text(p.stdout + p.stderr)
            exports = sorted(Path(art).rglob("*genai_perf.csv"))
            if p.returncode != 0 or not exports:
                print("\n".join((p.stdout + p.stderr).splitlines()[-20:]))
                return 1
            text = exports[0].read_text()
            (raw / f"c{c}.csv").write_text(text)
            rows.append(summary_row(c, read_csv(text)))
    lines = report.header(
        f"genai-perf {VERSION}: model `llm`, gRPC streaming",
        args,
        f"synthetic prompts of {args.input_tokens} tokens, {args.max_tokens} output tokens "
        "(max_tokens + ignore_eos), no warm-up requests, 2 x c requests per level (at least 4), "
        "`--backend vllm --endpoint-type kserve --streaming`; unguided, no speculation; "
        + (f"server at {args.url}" if args.url else "own server (model_repository/, BENCH_ENGINE)"),
        ("tritonclient", "nvidia-pytriton"),
    )
    lines += report.table(
        ["concurrency", "TTFT avg ms", "TTFT p99 ms", "ITL avg ms", "ITL p99 ms", "output tok/s", "requests/s"], rows
    )
    report.write(args, lines, dict(rows=rows))
    return 0
