"""What a load costs in memory and time: the engine loaded as served, each setting in a fresh process.

    python scripts/bench.py memory --model models/Qwen2.5-Coder-1.5B-Instruct \
        --draft models/Qwen2.5-Coder-0.5B-Instruct                  # the pair, and the target alone
    python scripts/bench.py memory --base <rev>                     # also another commit's engine, same settings

Each row is one process that imports the engine, then loads it (max_slots 8, max_seq_len 2048, the served
defaults: the target's int8 copy drafts where the native forward runs and no draft checkpoint is given) and
reports its peak resident memory during the load (VmHWM), what stays resident after it (VmRSS, and how much of
that is file pages: RssFile), both less the process's own before the load, and the load's wall time, beside the
checkpoints' bytes on disk. The page cache is warm after the first row (the files were read once already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .. import REPO, report
from .commits import _worktree

ENGINE = True
SHARED = {}
QUICK = {}
QUICK_HELP = "the same rows (a load is one measurement)"

_SIDE = r"""
import json, sys, time
from pathlib import Path
def status():
    f = dict(l.split(":", 1) for l in Path("/proc/self/status").read_text().splitlines())
    return {k: int(f[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS", "RssFile")}
from specgram.config import EngineConfig
from specgram.engine.engine import Engine
a = json.loads(sys.argv[1])
before, t0 = status(), time.perf_counter()
engine = Engine.from_config(EngineConfig.from_dict(a["params"]))
wall, after = time.perf_counter() - t0, status()
print("RESULT " + json.dumps(dict(peak=after["VmHWM"] - before["VmRSS"], kept=after["VmRSS"] - before["VmRSS"],
                                  file=after["RssFile"] - before["RssFile"], load_s=wall)))
engine.close()
"""


def add_options(ap) -> None:
    ap.add_argument("--draft", default="", help="a draft checkpoint: rows with it, and with the target alone")
    ap.add_argument("--base", default="", help="also load with this commit's engine (git revision)")
    ap.add_argument("--weights", nargs="+", default=["auto"], help="the target's weights forms (auto, int8)")


def _bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors")) if path else 0


def _load(backend: str, params: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([backend, str(REPO / "scripts")])}
    done = subprocess.run([sys.executable, "-c", _SIDE, json.dumps({"params": params})], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the load with {backend} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def run(args) -> None:
    sides = {"this": str(REPO / "backend")}
    if args.base:
        sides[args.base] = os.path.join(_worktree(args.base), "backend")
    base = dict(checkpoint=str(args.model), max_slots="8", max_seq_len="2048", draft_quantization="auto")
    settings = [("target", {})] + ([("target + draft", {"draft_checkpoint": args.draft})] if args.draft else [])
    rows, raw, gib = [], [], 2**30
    for weights in args.weights:
        for name, extra in settings:
            for side, backend in sides.items():
                params = {**base, **extra, "weights": weights}
                r = _load(backend, params)
                disk = _bytes(args.model) + _bytes(extra.get("draft_checkpoint", ""))
                raw.append(dict(side=side, setting=name, weights=weights, disk=disk, **r))
                report.log(f"{side} {name} weights {weights}: " + json.dumps(r))
                rows.append([side, name, weights, f"{disk / gib:.2f}", f"{r['peak'] / gib:.2f}",
                             f"{r['kept'] / gib:.2f}", f"{r['file'] / gib:.2f}", f"{r['peak'] / max(r['kept'], 1):.2f}",
                             f"{r['peak'] / disk:.2f}" if disk else "–", f"{r['load_s']:.1f}"])  # fmt: skip
    lines = report.header(
        "Memory at load",
        args,
        f"{args.model}{' + ' + args.draft if args.draft else ''}, max_slots 8, max_seq_len 2048, served defaults",
    )
    lines += report.table(
        ["engine", "setting", "weights", "checkpoints GiB", "peak GiB", "resident GiB", "of it file pages GiB",
         "peak ÷ resident", "peak ÷ checkpoints", "load s"],
        rows,
    )  # fmt: skip
    report.write(args, lines, dict(loads=raw))
