"""What a load costs in memory and time: the engine loaded as served, each setting in a fresh process.

    python scripts/bench.py memory --model models/Qwen2.5-Coder-1.5B-Instruct \
        --draft models/Qwen2.5-Coder-0.5B-Instruct                  # the pair, and the target alone
    python scripts/bench.py memory --base <rev>                     # also another commit's engine, same settings
    python scripts/bench.py memory --model build/random/qwen2.5-7b --weights int8 --decode 16
                                                        # a 7B-class random checkpoint (scripts/random_checkpoint.py)

Each row is one process that imports the engine, then loads it (max_slots 8, max_seq_len 2048, the served
defaults: the target's int8 copy drafts where the native forward runs and no draft checkpoint is given) and
reports its peak resident memory during the load (VmHWM), what stays resident after it (VmRSS, and how much of
that is file pages: RssFile), both less the process's own before the load, and the load's wall time, beside the
checkpoints' bytes on disk and what the load accounts for (the sum of the parts its memory check adds up: the matmul
weights as served, the embeddings, the KV caches). The page cache is warm after the first row (the files were read
once already).
--server: each setting also served by a tritonserver until the model is ready: its Python stub process's peak and
resident memory (the whole process, not less a baseline) and the time to ready.
--decode N: then N tokens at one stream without drafts; the median step against the memory bound (the served
matmul weights' bytes over a plain read's bandwidth, measured in the same process).
"""

from __future__ import annotations

import json
import os

from .. import REPO, report
from .commits import _worktree, run_side

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
try:  # the parts the load's memory check adds up: matmul weights as served, embeddings, KV caches
    from specgram.engine.loading import footprint_of
    accounted = sum(p.nbytes for p in footprint_of(engine.config, engine.settings)[0])
except (ImportError, AttributeError, TypeError):  # an older engine (--base) without it
    accounted = None
out = dict(peak=after["VmHWM"] - before["VmRSS"], kept=after["VmRSS"] - before["VmRSS"],
           file=after["RssFile"] - before["RssFile"], load_s=wall, accounted=accounted)
if a["decode"]:  # one stream, no drafts: the median decode step against the weights' bytes over a plain read
    import torch
    from specgram.engine.generate import generate
    from specgram.request import SamplingParams
    req = engine.make_request(SamplingParams(max_tokens=a["decode"], ignore_eos=True, num_draft_tokens=0),
                              prompt_ids=list(range(10, 42)))
    steps = sorted(generate(engine, [req]).step_s[2:])
    buf, best = torch.ones(64 * 2**20), float("inf")
    for _ in range(4):
        t = time.perf_counter(); buf.sum(); best = min(best, time.perf_counter() - t)
    weights = sum(b.numel() * b.element_size() for m in engine.target.native.linear_layers() for b in m.buffers()
                  if b is not None)
    out.update(step_s=steps[len(steps) // 2], bound_s=weights / (buf.numel() * 4 / best), weight_bytes=weights)
print("RESULT " + json.dumps(out))
engine.close()
"""


def add_options(ap) -> None:
    ap.add_argument("--draft", default="", help="a draft checkpoint: rows with it, and with the target alone")
    ap.add_argument("--base", default="", help="also load with this commit's engine (git revision)")
    ap.add_argument("--weights", nargs="+", default=["auto"], help="the target's weights forms (auto, int8)")
    ap.add_argument("--decode", type=int, default=0, help="also time this many decode steps at one stream")
    ap.add_argument("--server", action="store_true", help="also load each setting through tritonserver")


def _served(params: dict, raw) -> dict:
    """One tritonserver serving the model with these settings until it is ready: its Python stub's peak and
    resident memory then (the whole process: the interpreter, the engine and its load-time warm-up)."""
    import tempfile
    import time
    from pathlib import Path

    from triton_server import TritonServer, model_repository_with, stub_pids

    def status(pid: int) -> dict:
        f = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return {k: int(f[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS")}

    with tempfile.TemporaryDirectory(dir=Path(raw).resolve()) as tmp:
        repo = model_repository_with(params, Path(tmp) / "repo")
        t0 = time.perf_counter()
        try:
            with TritonServer(model_repository=repo, startup_timeout=1800, log_path=Path(tmp) / "server.log") as s:
                ready = time.perf_counter() - t0
                (stub,) = stub_pids(s.process.pid)
                st = status(stub)
        except RuntimeError as e:
            log = Path(tmp) / "server.log"
            tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
            return {"error": str(e).strip().splitlines()[0], "log": tail}
    return dict(peak=st["VmHWM"], kept=st["VmRSS"], ready_s=ready)


def _load(backend: str, params: dict, decode: int) -> dict:
    try:
        return run_side(backend, _SIDE, {"params": params, "decode": decode})
    except RuntimeError as e:  # a refused load is a row too: its error's last line
        return {"error": str(e).strip().splitlines()[-1]}


def _decode(r: dict) -> str:
    if "step_s" not in r:
        return "–"
    return f"{r['step_s'] * 1e3:.0f} ({r['step_s'] / r['bound_s']:.2f}×)"


def _server_row(r: dict, side: str, name: str, weights: str, disk: int) -> list[str]:
    gib = 2**30
    if "error" in r:
        return [side, f"{name}, tritonserver", weights, f"{disk / gib:.2f}", f"not loaded: {r['error'][:300]}"]
    return [side, f"{name}, tritonserver's stub (whole process)", weights, f"{disk / gib:.2f}",
            f"{r['peak'] / gib:.2f}", f"{r['kept'] / gib:.2f}", "–", f"{r['peak'] / r['kept']:.2f}", "–", "–",
            f"{r['ready_s']:.1f} (to ready)", "–"]  # fmt: skip


def run(args) -> None:
    from specgram.check_model.common import checkpoint_bytes

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
                r = _load(backend, params, args.decode)
                if args.server and side == "this":
                    r["server"] = _served(params, report.raw_dir(args))
                disk = checkpoint_bytes(str(args.model)) + checkpoint_bytes(extra.get("draft_checkpoint", ""))
                raw.append(dict(side=side, setting=name, weights=weights, disk=disk, **r))
                report.log(f"{side} {name} weights {weights}: " + json.dumps(r))
                if "error" in r:
                    rows.append([side, name, weights, f"{disk / gib:.2f}", f"not loaded: {r['error'][:300]}"])
                    continue
                acc = r.get("accounted")  # an older engine's side may not report it
                rows.append([side, name, weights, f"{disk / gib:.2f}", f"{r['peak'] / gib:.2f}",
                             f"{r['kept'] / gib:.2f}", f"{r['file'] / gib:.2f}", f"{r['peak'] / max(r['kept'], 1):.2f}",
                             f"{acc / gib:.2f} ({r['kept'] / acc:.2f}×)" if acc else "–",
                             f"{r['peak'] / disk:.2f}" if disk else "–", f"{r['load_s']:.1f}", _decode(r)])  # fmt: skip
                if "server" in r:
                    rows.append(_server_row(r["server"], side, name, weights, disk))
    lines = report.header(
        "Memory at load",
        args,
        f"{args.model}{' + ' + args.draft if args.draft else ''}, max_slots 8, max_seq_len 2048, served defaults",
    )
    lines += report.table(
        ["engine", "setting", "weights", "checkpoints GiB", "peak GiB", "resident GiB", "of it file pages GiB",
         "peak ÷ resident", "accounted GiB (resident ÷ it)", "peak ÷ checkpoints", "load s",
         "decode ms/step (× bound)"],
        rows,
    )  # fmt: skip
    report.write(args, lines, dict(loads=raw))
