#!/usr/bin/env python3
"""perf_analyzer concurrency sweep of model `llm` (gRPC streaming) on JSONSchemaBench JME prompts.

    source scripts/env.sh
    python scripts/perf_analyzer_sweep.py --quick                      # own server; 2 variants, c = 1 2
    python scripts/perf_analyzer_sweep.py --variants guided_k0 guided_k4 unguided_k0 unguided_k4 \
        --concurrency 1 2 4 8
    python scripts/perf_analyzer_sweep.py --url localhost:8001 ...     # against a running server
    python scripts/perf_analyzer_sweep.py --summarize-only             # re-read the exports in --out-dir

Per variant (guided/unguided x num_draft_tokens 0/4, see client/make_perf_inputs.py) and concurrency it runs

    perf_analyzer -m llm -i grpc --streaming -u URL --input-data <variant>.json --concurrency-range C
                  --request-count N --profile-export-file <out-dir>/<variant>_c<C>.json

then reads each profile export and computes the four genai-perf figures from it (genai-perf itself is not
needed):

  * TTFT: first response timestamp - request timestamp (per request; mean and p50/p90 over requests)
  * inter-token latency: (last response - first response) / (output tokens - tokens of the first
    response), per request, then averaged.  A streaming response may carry several tokens (speculative
    steps commit up to k + 1), so tokens are counted from each response's `output_ids` in the export
    (scalar = 1 token, list = len); the mean gap between responses is reported separately.
  * output tokens/s: all output tokens / benchmark duration (first request sent -> last response)
  * request throughput: completed requests / the same duration

and writes a markdown summary (default docs/benchmarks/perf_analyzer/summary.md) plus summary.json.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import BENCH_ENGINE, REPO, machine, pct
from make_perf_inputs import VARIANTS, write_inputs

DEFAULT_OUT = REPO / "docs" / "benchmarks" / "perf_analyzer"
QUICK_VARIANTS = ["unguided_k0", "guided_k4"]


# --------------------------------------------------------------------------- environment
def pa_env() -> dict:
    """perf_analyzer's environment: the venv's bin on PATH, build/lib (libb64, libcudart) on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    lib = str(REPO / "build" / "lib")
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if lib not in parts:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([lib, *parts])
    return env


def find_perf_analyzer(env: dict) -> str:
    pa = shutil.which("perf_analyzer", path=env["PATH"])
    if not pa:
        raise SystemExit("perf_analyzer not found; run scripts/setup.sh and `source scripts/env.sh`")
    return pa


# --------------------------------------------------------------------------- export parsing
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
    d = json.loads(path.read_text())
    rows = []
    for exp in d.get("experiments", []):
        reqs = exp.get("requests", [])
        ttft, itl, gaps, e2e, tokens_per_req, resp_per_req = [], [], [], [], [], []
        drafted = accepted = 0
        total_tokens = 0
        tokens_known = True
        finish: dict[str, int] = {}
        starts, ends = [], []
        n_ok = 0
        for r in reqs:
            ts = r.get("response_timestamps") or []
            outs = r.get("response_outputs") or []
            if not ts:
                continue
            n_ok += 1
            t0 = r["timestamp"]
            starts.append(t0)
            ends.append(ts[-1])
            ttft.append((ts[0] - t0) / 1e6)
            e2e.append((ts[-1] - t0) / 1e6)
            if len(ts) > 1:
                gaps += [(b - a) / 1e6 for a, b in zip(ts, ts[1:])]
            counts = [_n_tokens(o) for o in outs] if outs else []
            if len(counts) != len(ts) or any(c is None for c in counts):
                # no outputs in the export: assume one token per response
                tokens_known = False
                counts = [1] * len(ts)
            n = sum(counts)
            total_tokens += n
            tokens_per_req.append(n)
            resp_per_req.append(len(ts))
            # only responses that carry tokens count for the token timeline
            tok_ts = [t for t, c in zip(ts, counts) if c > 0]
            first_tokens = next((c for c in counts if c > 0), 0)
            if len(tok_ts) > 1 and n - first_tokens > 0:
                itl.append((tok_ts[-1] - tok_ts[0]) / 1e6 / (n - first_tokens))
            if outs:
                last = outs[-1] or {}
                fr = last.get("finish_reason") or "?"
                finish[fr] = finish.get(fr, 0) + 1
                drafted += int(last.get("spec_drafted_tokens") or 0)
                accepted += int(last.get("spec_accepted_tokens") or 0)
        dur_s = (max(ends) - min(starts)) / 1e9 if starts else float("nan")
        rows.append({
            "export": path.name,
            "mode": exp.get("experiment", {}).get("mode"),
            "concurrency": exp.get("experiment", {}).get("value"),
            "requests": len(reqs),
            "completed": n_ok,
            "duration_s": dur_s,
            "ttft_ms_mean": _mean(ttft), "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p90": pct(ttft, 90),
            "itl_ms_mean": _mean(itl), "itl_ms_p50": pct(itl, 50), "itl_ms_p90": pct(itl, 90),
            "inter_response_ms_mean": _mean(gaps),
            "e2e_ms_mean": _mean(e2e),
            "output_tokens": total_tokens,
            "output_tokens_per_req_mean": _mean(tokens_per_req),
            "tokens_per_response": total_tokens / sum(resp_per_req) if resp_per_req else float("nan"),
            "output_tok_s": total_tokens / dur_s if dur_s and dur_s == dur_s else float("nan"),
            "per_stream_tok_s": _mean([n / (e / 1e3) for n, e in zip(tokens_per_req, e2e) if e > 0]),
            "request_throughput": n_ok / dur_s if dur_s and dur_s == dur_s else float("nan"),
            "tokens_from_output_ids": tokens_known,
            "spec_acceptance_rate": accepted / drafted if drafted else None,
            "finish_reasons": finish,
        })
    return rows


# --------------------------------------------------------------------------- running
def run_pa(pa: str, env: dict, url: str, input_file: Path, concurrency: int, n_requests: int,
           export: Path, log: Path, timeout: float, extra: list[str]) -> tuple[int, list[str], float]:
    cmd = [pa, "-m", "llm", "-i", "grpc", "--streaming", "-u", url,
           "--input-data", str(input_file),
           "--concurrency-range", str(concurrency),
           "--request-count", str(n_requests),
           "--profile-export-file", str(export), *extra]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")) \
            + f"\n[sweep] timed out after {timeout:.0f}s\n"
    log.write_text("$ " + shlex.join(cmd) + "\n" + out)
    return rc, cmd, time.monotonic() - t0


def fmt(x, nd=1) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return f"{x:.{nd}f}"


def write_summary(out_dir: Path, rows: list[dict], meta: dict, summary_md: Path) -> None:
    lines = ["# perf_analyzer sweep: model `llm`, gRPC streaming, JSONSchemaBench JME prompts", ""]
    lines += [f"- date: {meta['date']}",
              f"- machine: {meta['machine']}",
              f"- server: {meta['server']}",
              f"- perf_analyzer: {meta.get('pa_version', '?')}",
              f"- inputs: {meta['inputs']}",
              f"- sweep command: `{meta['sweep_cmd']}`",
              f"- perf_analyzer command (per variant x concurrency): `{meta['pa_cmd_example']}`",
              "", f"Figures computed from the profile exports (`<variant>_c<C>.json` in {meta.get('export_dir', 'this folder')}), as genai-perf "
              "defines them: TTFT = first response - request sent; ITL = (last - first response) / (output "
              "tokens - first response's tokens), per request, averaged; output tok/s and req/s over the "
              "benchmark duration (first request sent -> last response received). Tokens are counted from "
              "each response's `output_ids` (a speculative step's response carries several tokens); "
              "tok/resp is output tokens per streamed response. per-stream tok/s = a request's tokens / its "
              "end-to-end latency, averaged. Accept = spec_accepted / spec_drafted over the requests.", ""]
    hdr = ("| variant | c | reqs | TTFT mean ms | TTFT p90 ms | ITL mean ms | ITL p90 ms | output tok/s | "
           "req/s | per-stream tok/s | tok/resp | tokens/req | accept | finish |")
    lines += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['variant']} | {r['concurrency']} | - | failed: {r['error']} |" + " |" * 10)
            continue
        fr = ", ".join(f"{k} {v}" for k, v in sorted(r["finish_reasons"].items()))
        acc = "-" if r["spec_acceptance_rate"] is None else f"{100 * r['spec_acceptance_rate']:.0f}%"
        lines.append(
            f"| {r['variant']} | {r['concurrency']} | {r['completed']}/{r['requests']} | {fmt(r['ttft_ms_mean'], 0)} | "
            f"{fmt(r['ttft_ms_p90'], 0)} | {fmt(r['itl_ms_mean'])} | {fmt(r['itl_ms_p90'])} | "
            f"{fmt(r['output_tok_s'])} | {fmt(r['request_throughput'], 3)} | {fmt(r['per_stream_tok_s'])} | "
            f"{fmt(r['tokens_per_response'], 2)} | {fmt(r['output_tokens_per_req_mean'], 1)} | {acc} | {fr} |")
    if any(not r.get("error") and not r["tokens_from_output_ids"] for r in rows):
        lines += ["", "Note: some exports had no `output_ids`; their token counts assume one token per response."]
    if meta.get("notes"):
        lines += ["", *meta["notes"]]
    summary_md.write_text("\n".join(lines) + "\n")
    (out_dir / "summary.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="gRPC url of a running server (default: start one on free ports)")
    ap.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS),
                    help=f"default: all ({' '.join(VARIANTS)}); --quick: {' '.join(QUICK_VARIANTS)}")
    ap.add_argument("--concurrency", type=int, nargs="+", default=None, help="default 1 2 4 8 16; --quick: 1 2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=4,
                    help="requests per run at least; a run sends max(--requests, --requests-per-c x C)")
    ap.add_argument("--requests-per-c", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompt", choices=["schema", "extract"], default="schema")
    ap.add_argument("--warmup", type=int, default=2, help="requests sent (c=1, not recorded) before the sweep")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: docs/benchmarks/perf_analyzer (--quick: its quick/)")
    ap.add_argument("--export-dir", type=Path, default=None,
                    help="where the profile exports go (default: <out-dir>; they hold every prompt, ~10 KB/request)")
    ap.add_argument("--summary", type=Path, default=None, help="default: <out-dir>/summary.md")
    ap.add_argument("--run-timeout", type=float, default=900, help="seconds per perf_analyzer run")
    ap.add_argument("--pa-args", default="", help="extra perf_analyzer arguments (shell-split)")
    ap.add_argument("--summarize-only", action="store_true", help="only re-read the exports in --out-dir")
    args = ap.parse_args()

    variants = args.variants or (QUICK_VARIANTS if args.quick else list(VARIANTS))
    concs = args.concurrency or ([1, 2] if args.quick else [1, 2, 4, 8, 16])
    out_dir: Path = args.out_dir or (DEFAULT_OUT / "quick" if args.quick else DEFAULT_OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_md = args.summary or out_dir / "summary.md"
    export_dir: Path = args.export_dir or out_dir
    export_dir.mkdir(parents=True, exist_ok=True)
    sweep_cmd = "python " + shlex.join([os.path.relpath(__file__, REPO), *sys.argv[1:]])

    if args.summarize_only:
        old = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
        rows = []
        for v in variants:
            for c in concs:
                p = export_dir / f"{v}_c{c}.json"
                if p.exists():
                    rows += [{"variant": v, **r} for r in summarize_export(p)]
        write_summary(out_dir, rows, old.get("meta") or {"date": "?", "machine": machine(), "server": "?",
                                                          "inputs": "?", "sweep_cmd": sweep_cmd,
                                                          "pa_cmd_example": "?"}, summary_md)
        print(summary_md.read_text())
        return

    env = pa_env()
    pa = find_perf_analyzer(env)
    pa_version = "?"
    inputs_dir = out_dir / "inputs"
    inputs = write_inputs(inputs_dir, variants, args.max_tokens, args.prompt)
    logs_dir = out_dir / "logs"
    logs_dir.mkdir(exist_ok=True)

    server = None
    url = args.url
    if url is None:
        import tempfile

        from triton_server import TritonServer, model_repository_with
        print("[sweep] starting tritonserver ...", file=sys.stderr, flush=True)
        # benchlib's BENCH_ENGINE: the JME schemas that use keywords xgrammar does not enforce are compiled
        # best effort, not refused (every variant sends the same workload), and every prompt is prefilled
        repo = model_repository_with(BENCH_ENGINE, Path(tempfile.mkdtemp(prefix="pa-repo-")))
        server = TritonServer(model_repository=repo, log_path=out_dir / "logs" / "tritonserver.log").start()
        url = server.grpc_url
        print(f"[sweep] tritonserver ready at grpc {url}", file=sys.stderr, flush=True)
    server_desc = ("own tritonserver 2.51 (client/triton_server.py, model_repository/llm, "
                   "json_unsupported_keywords ignore, prefix_cache off)" if server
                   else f"running server at {url}")
    rows: list[dict] = []
    meta = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
            "server": server_desc, "variants": variants, "concurrency": concs,
            "inputs": (f"{len(json.loads(next(iter(inputs.values())).read_text())['data'])} JME schemas, prompt "
                       f"`{args.prompt}`, max_tokens {args.max_tokens}, greedy, ignore_eos false, chat template; "
                       f"files in {os.path.relpath(inputs_dir, REPO)}/"),
            "sweep_cmd": sweep_cmd, "pa_cmd_example": "", "export_dir": str(export_dir), "notes": []}
    try:
        if args.warmup:
            rc, _, _ = run_pa(pa, env, url, inputs[variants[0]], 1, args.warmup, Path("/tmp/pa_warmup.json"),
                              logs_dir / "warmup.log", args.run_timeout, [])
            try:
                pa_version = json.loads(Path("/tmp/pa_warmup.json").read_text()).get("version", "?")
            except (OSError, ValueError):
                pass
        # concurrency-major: the variants compared at one concurrency run back to back, so a slow spell on a
        # shared machine hits them alike
        for c in concs:
            for v in variants:
                n = max(args.requests, args.requests_per_c * c)
                export = export_dir / f"{v}_c{c}.json"
                if export.exists():
                    export.unlink()
                print(f"[sweep] {v} c={c} requests={n} ...", file=sys.stderr, flush=True)
                rc, cmd, wall = run_pa(pa, env, url, inputs[v], c, n, export, logs_dir / f"{v}_c{c}.log",
                                       args.run_timeout, shlex.split(args.pa_args))
                if not meta["pa_cmd_example"]:
                    ex = ["perf_analyzer", *cmd[1:]]
                    ex[ex.index("-u") + 1] = "<grpc url>"
                    meta["pa_cmd_example"] = shlex.join([os.path.relpath(a, REPO) if a.startswith(str(REPO)) else a
                                                         for a in ex])
                if rc != 0 or not export.exists():
                    tail = (logs_dir / f"{v}_c{c}.log").read_text().strip().splitlines()[-1:]
                    rows.append({"variant": v, "concurrency": c, "error": f"rc {rc}: {' '.join(tail)[:200]}"})
                    print(f"[sweep]   failed rc={rc}; see {logs_dir / f'{v}_c{c}.log'}", file=sys.stderr)
                else:
                    for r in summarize_export(export):
                        rows.append({"variant": v, **r})
                        print(f"[sweep]   {wall:.0f}s: TTFT {fmt(r['ttft_ms_mean'], 0)} ms, ITL "
                              f"{fmt(r['itl_ms_mean'])} ms, {fmt(r['output_tok_s'])} tok/s, "
                              f"{fmt(r['request_throughput'], 3)} req/s", file=sys.stderr, flush=True)
                meta["pa_version"] = pa_version
                write_summary(out_dir, rows, meta, summary_md)  # after every run: partial results survive
    finally:
        if server is not None:
            server.stop()
    write_summary(out_dir, rows, meta, summary_md)
    print(summary_md.read_text())


if __name__ == "__main__":
    main()
