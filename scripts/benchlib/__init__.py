"""The library behind scripts/bench.py (the one benchmark entry point):

    workload   JME cases, prompts, requests, configuration choice, percentiles, JSON validity
    run        the one concurrency model (a closed loop, c requests in flight), in process and over gRPC
    machine    the machine and package versions a report names
    report     markdown tables, the report header, the raw JSON folder (build/bench/<scenario>/)
    scenarios  one module per scenario (python scripts/bench.py --help lists them)

Importing it puts backend/ (specgram) and client/ (collect, triton_server, jme, make_perf_inputs) on
sys.path. This package, workload, machine and report import only the standard library at import time
(scripts/compare/vllm_worker.py loads workload in vLLM's own venv; bench.py imports every scenario module to
build its options, so those import torch and the engine inside their functions).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "build" / "bench"  # raw outputs: per-run JSON, exports, logs (git-ignored)
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct"
for _p in (REPO / "client", REPO / "backend"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
