"""perf_analyzer concurrency sweep of model `llm` (gRPC streaming) on JSONSchemaBench JME prompts.

    python scripts/bench.py perf_analyzer --quick          # own server; 2 variants, c = 1 2
    python scripts/bench.py perf_analyzer --variants unguided_k0 unguided_k4 guided_k0 guided_k4 \\
        --concurrency 1 2 4 8 16 --out docs/benchmarks/perf_analyzer/summary.md
    python scripts/bench.py perf_analyzer --url localhost:8001 ...     # against a running server
    python scripts/bench.py perf_analyzer --summarize-only             # re-read the exports in the raw folder

Per variant (guided/unguided x num_draft_tokens, client/make_perf_inputs.py) and concurrency C it runs

    perf_analyzer -m llm -i grpc --streaming -u URL --input-data <variant>.json --concurrency-range C
                  --request-count N --profile-export-file <raw>/<variant>_c<C>.json

(concurrency-major: the variants compared at one C run back to back, so a slow spell hits them alike), then
reads each profile export and computes genai-perf's four figures from it (genai-perf is not needed):
  TTFT            first response - request sent (per request; mean and p90)
  ITL             (last - first token-carrying response) / (output tokens - the first response's tokens), per
                  request, averaged; tokens are counted from each response's output_ids (a speculative step's
                  response carries several)
  output tok/s    all output tokens / benchmark duration (first request sent -> last response)
  request rate    completed requests / the same duration
Exports, inputs and logs stay in the raw folder (build/bench/perf_analyzer/); the summary is the report.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from .. import REPO, report
from ..run import served
from ..workload import pct

SHARED = {"concurrency": [1, 2, 4, 8, 16], "max_tokens": 48}
QUICK = {"concurrency": [1, 2], "variants": ["unguided_k0", "guided_k4"]}
QUICK_HELP = "variants unguided_k0 guided_k4, concurrency 1 2"
ENGINE = False
ALL_VARIANTS = [
    "unguided_k0",
    "unguided_k2",
    "unguided_k4",
    "unguided_k8",
    "unguided_auto",
    "guided_k0",
    "guided_k2",
    "guided_k4",
    "guided_k8",
    "guided_auto",
]  # client/make_perf_inputs.py VARIANTS


def add_options(ap) -> None:
    ap.add_argument("--url", default="", help="gRPC url of a running server (default: start one here)")
    ap.add_argument("--variants", nargs="+", default=ALL_VARIANTS, choices=ALL_VARIANTS)
    ap.add_argument("--requests", type=int, default=4, help="requests per run at least (see --requests-per-c)")
    ap.add_argument("--requests-per-c", type=int, default=2, help="a run sends max(--requests, this x C) requests")
    ap.add_argument("--prompt", choices=["schema", "extract"], default="schema")
    ap.add_argument("--warmup", type=int, default=2, help="requests sent (c=1, not recorded) before the sweep")
    ap.add_argument("--run-timeout", type=float, default=900, help="seconds per perf_analyzer run")
    ap.add_argument("--pa-args", default="", help="extra perf_analyzer arguments (shell-split)")
    ap.add_argument("--summarize-only", action="store_true", help="only re-read the exports in the raw folder")


def _n_tokens(out: dict | None) -> int | None:
    """Tokens in one response, from its output_ids (scalar when 1 token, list otherwise)."""
    if not out or "output_ids" not in out:
        return None
    ids = out["output_ids"]
    if isinstance(ids, list):
        return len(ids)
    return 0 if ids is None or ids == "" else 1


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def summarize_export(path: Path) -> list[dict]:
    """One row per experiment (concurrency level) of a perf_analyzer profile export."""
    rows = []
    for exp in json.loads(Path(path).read_text()).get("experiments", []):
        reqs = exp.get("requests", [])
        ttft, itl, e2e, tokens, responses, starts, ends = [], [], [], [], [], [], []
        drafted = accepted = 0
        known = True
        finish: dict[str, int] = {}
        for r in reqs:
            ts, outs = r.get("response_timestamps") or [], r.get("response_outputs") or []
            if not ts:
                continue
            starts.append(r["timestamp"])
            ends.append(ts[-1])
            ttft.append((ts[0] - r["timestamp"]) / 1e6)
            e2e.append((ts[-1] - r["timestamp"]) / 1e6)
            counts = [_n_tokens(o) for o in outs] if outs else []
            if len(counts) != len(ts) or any(c is None for c in counts):
                known, counts = False, [1] * len(ts)  # no outputs in the export: one token per response
            tokens.append(sum(counts))
            responses.append(len(ts))
            tok_ts = [t for t, c in zip(ts, counts, strict=True) if c > 0]  # only token-carrying responses count
            first = next((c for c in counts if c > 0), 0)
            if len(tok_ts) > 1 and tokens[-1] - first > 0:
                itl.append((tok_ts[-1] - tok_ts[0]) / 1e6 / (tokens[-1] - first))
            if outs:
                last = outs[-1] or {}
                finish[last.get("finish_reason") or "?"] = finish.get(last.get("finish_reason") or "?", 0) + 1
                drafted += int(last.get("spec_drafted_tokens") or 0)
                accepted += int(last.get("spec_accepted_tokens") or 0)
        dur = (max(ends) - min(starts)) / 1e9 if starts else float("nan")
        span = dur if dur == dur and dur > 0 else float("nan")
        rows.append(
            dict(
                export=Path(path).name,
                concurrency=exp.get("experiment", {}).get("value"),
                requests=len(reqs),
                completed=len(tokens),
                duration_s=dur,
                ttft_ms_mean=_mean(ttft),
                ttft_ms_p50=pct(ttft, 50),
                ttft_ms_p90=pct(ttft, 90),
                itl_ms_mean=_mean(itl),
                itl_ms_p50=pct(itl, 50),
                itl_ms_p90=pct(itl, 90),
                e2e_ms_mean=_mean(e2e),
                output_tokens=sum(tokens),
                output_tokens_per_req_mean=_mean(tokens),
                tokens_per_response=sum(tokens) / sum(responses) if responses else float("nan"),
                output_tok_s=sum(tokens) / span,
                request_throughput=len(tokens) / span,
                per_stream_tok_s=_mean([n / (e / 1e3) for n, e in zip(tokens, e2e, strict=True) if e > 0]),
                tokens_from_output_ids=known,
                spec_acceptance_rate=accepted / drafted if drafted else None,
                finish_reasons=finish,
            )
        )
    return rows


def summary(args, rows: list[dict], meta: dict) -> list[str]:
    f = report.cell
    lines = report.header(
        "perf_analyzer sweep: model `llm`, gRPC streaming, JSONSchemaBench JME prompts",
        args,
        meta["inputs"],
        ("tritonclient", "nvidia-pytriton"),
        meta.get("command"),
    )
    lines += [
        f"Server: {meta['server']}; perf_analyzer {meta.get('pa_version', '?')}.  ",
        f"perf_analyzer command (per variant x concurrency): `{meta.get('pa_cmd', '?')}`",
        "",
        "Figures computed from the profile exports (`<variant>_c<C>.json` in the raw folder) as genai-perf "
        "defines them: TTFT = first response - request sent; ITL = (last - first response) / (output tokens - "
        "first response's tokens), per request, averaged; output tok/s and req/s over the benchmark duration "
        "(first request sent -> last response received). Tokens are counted from each response's "
        "`output_ids`; tok/resp = output tokens per streamed response; per-stream tok/s = a request's tokens / "
        "its end-to-end latency, averaged; accept = spec_accepted / spec_drafted over the requests.",
        "",
    ]
    cols = [
        "variant",
        "c",
        "reqs",
        "TTFT mean ms",
        "TTFT p90 ms",
        "ITL mean ms",
        "ITL p90 ms",
        "output tok/s",
        "req/s",
        "per-stream tok/s",
        "tok/resp",
        "tokens/req",
        "accept",
        "finish",
    ]
    lines += report.table(
        cols,
        (
            [r["variant"], r["concurrency"], f"failed: {r['error']}", *["–"] * 11]
            if r.get("error")
            else [
                r["variant"],
                r["concurrency"],
                f"{r['completed']}/{r['requests']}",
                f(r["ttft_ms_mean"], "{:.0f}"),
                f(r["ttft_ms_p90"], "{:.0f}"),
                f(r["itl_ms_mean"]),
                f(r["itl_ms_p90"]),
                f(r["output_tok_s"]),
                f(r["request_throughput"], "{:.3f}"),
                f(r["per_stream_tok_s"]),
                f(r["tokens_per_response"], "{:.2f}"),
                f(r["output_tokens_per_req_mean"]),
                "–" if r["spec_acceptance_rate"] is None else f"{r['spec_acceptance_rate']:.0%}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["finish_reasons"].items())),
            ]
            for r in rows
        ),
    )
    if any(not r.get("error") and not r["tokens_from_output_ids"] for r in rows):
        lines += ["", "Note: some exports had no `output_ids`; their token counts assume one token per response."]
    return lines


def perf_analyzer(
    url: str, inputs: Path, c: int, n: int, export: Path, log: Path, timeout: float, extra: list[str]
) -> tuple[int, list[str]]:
    env = dict(
        os.environ,
        PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        LD_LIBRARY_PATH=os.pathsep.join(
            [str(REPO / "build" / "lib"), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":"))]
        ),
    )
    pa = shutil.which("perf_analyzer", path=env["PATH"])
    if not pa:
        raise SystemExit("perf_analyzer not found; run scripts/setup.sh and `source scripts/env.sh`")
    cmd = [
        pa,
        "-m",
        "llm",
        "-i",
        "grpc",
        "--streaming",
        "-u",
        url,
        "--input-data",
        str(inputs),
        "--concurrency-range",
        str(c),
        "--request-count",
        str(n),
        "--profile-export-file",
        str(export),
        *extra,
    ]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"{e.stdout or ''}\n[perf_analyzer] timed out after {timeout:.0f}s\n"
    log.write_text("$ " + shlex.join(cmd) + "\n" + str(out))
    return rc, ["perf_analyzer", *cmd[1:]]


def run(args) -> None:
    raw = report.raw_dir(args)
    if args.summarize_only:
        meta = json.loads((raw / "perf_analyzer.json").read_text())["meta"]
        rows = [
            {"variant": v, **r}
            for c in args.concurrency
            for v in args.variants
            if (raw / f"{v}_c{c}.json").exists()
            for r in summarize_export(raw / f"{v}_c{c}.json")
        ]
        report.write(args, summary(args, rows, meta), dict(meta=meta, rows=rows))
        return
    from make_perf_inputs import write_inputs

    inputs = write_inputs(raw / "inputs", args.variants, args.max_tokens, args.prompt)
    (raw / "logs").mkdir(exist_ok=True)
    rows: list[dict] = []
    meta = dict(
        command=report.command(args),
        variants=args.variants,
        concurrency=args.concurrency,
        server=f"running server at {args.url}"
        if args.url
        else "own tritonserver (model_repository/llm, json_unsupported_keywords ignore, prefix_cache off)",
        inputs=f"{len(json.loads(next(iter(inputs.values())).read_text())['data'])} JME schemas, prompt "
        f"`{args.prompt}`, max_tokens {args.max_tokens}, greedy, ignore_eos false, chat template",
    )
    with served(args.url, log_path=raw / "logs" / "tritonserver.log") as (url, _):
        if args.warmup:
            perf_analyzer(
                url,
                inputs[args.variants[0]],
                1,
                args.warmup,
                raw / "warmup.json",
                raw / "logs" / "warmup.log",
                args.run_timeout,
                [],
            )
            meta["pa_version"] = (
                json.loads((raw / "warmup.json").read_text()).get("version", "?")
                if (raw / "warmup.json").exists()
                else "?"
            )
        for c in args.concurrency:
            for v in args.variants:
                export, log = raw / f"{v}_c{c}.json", raw / "logs" / f"{v}_c{c}.log"
                export.unlink(missing_ok=True)
                t0 = time.monotonic()
                rc, cmd = perf_analyzer(
                    url,
                    inputs[v],
                    c,
                    max(args.requests, args.requests_per_c * c),
                    export,
                    log,
                    args.run_timeout,
                    shlex.split(args.pa_args),
                )
                cmd[cmd.index("-u") + 1] = "<grpc url>"
                meta.setdefault(
                    "pa_cmd", shlex.join(os.path.relpath(a, REPO) if a.startswith(str(REPO)) else a for a in cmd)
                )
                if rc != 0 or not export.exists():
                    rows.append(
                        dict(
                            variant=v,
                            concurrency=c,
                            error=f"rc {rc}: {' '.join(log.read_text().strip().splitlines()[-1:])[:200]}",
                        )
                    )
                else:
                    rows += [{"variant": v, **r} for r in summarize_export(export)]
                report.log(
                    f"{v} c={c}: {time.monotonic() - t0:.0f} s, "
                    + (rows[-1].get("error") or f"{report.cell(rows[-1]['output_tok_s'])} tok/s")
                )
                report.write(args, summary(args, rows, meta), dict(meta=meta, rows=rows), quiet=True)  # partial
    report.write(args, summary(args, rows, meta), dict(meta=meta, rows=rows))
