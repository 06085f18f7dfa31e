"""This checkout's engine against another commit's, interleaved: did a change cost throughput or change output?

    python scripts/bench.py commits --base <rev>             # 3 rounds, c 1 and 8, 64 tokens, guided and not
    python scripts/bench.py commits                          # the uncommitted change against HEAD
    python scripts/bench.py commits --base <rev> --quick     # 1 round, 2 prompts, 16 tokens: a smoke run

The base commit is checked out (git worktree) under build/ab/<rev>; each round runs each side in a fresh process
(base, then this checkout, the order alternating by round) with the other side's package out of the way: the
same in-process engine settings (bench's own, with the served default's draft length auto, drafter auto and
the int8 copy), the same JME extraction prompts, greedy, unguided and guided by each prompt's schema, at each
concurrency. Reported per workload: median output tok/s of each side, their ratio, and whether every side's
greedy ids are identical.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from .. import REPO, report

SHARED = {"prompts": 8, "max_tokens": 64, "concurrency": [1, 8], "repeat": 3}
QUICK = {"prompts": 2, "max_tokens": 16, "concurrency": [1, 2], "repeat": 1}
QUICK_HELP = "2 prompts, 16 tokens, concurrency 1 and 2, one round"

# what each side's process runs: argv[1] = JSON settings; prints one JSON line of results
_SIDE = r"""
import json, sys
from benchlib.run import cpu_engine, run_engine, tok_s
from benchlib.workload import compile_guide, select_cases
a = json.loads(sys.argv[1])
try:
    from specgram.model.source import open_source
    tok = open_source(a["model"]).tokenizer()
except ImportError:  # a base commit older than model/source.py: its loading module reads the tokenizer
    from specgram.engine.loading import load_tokenizer
    tok = load_tokenizer(a["model"])
cases = select_cases(tok, a["prompts"], max(128, a["max_tokens"]))   # cases whose answer fits 128
engine = cpu_engine(a["model"], max(a["concurrency"]), 1024, a["max_tokens"], draft_quantization="auto",
                    drafter="auto")
for c in cases:
    compile_guide(engine, c["guide"])
run_engine(engine, cases[:2], 8, 2, k=-1, drafter="draft_model")                      # warm-up
out = {}
for guided in (False, True):
    for c in a["concurrency"]:
        r = run_engine(engine, cases, a["max_tokens"], c, k=-1, drafter="draft_model", guided=guided)
        name = f"{'guided' if guided else 'unguided'} c={c}"
        out[name] = {"tok_s": tok_s(r), "ids": [q["ids"] for q in r["requests"]]}
print("RESULT " + json.dumps(out))
"""


def add_options(ap) -> None:
    ap.add_argument(
        "--base",
        default="HEAD",
        help="the commit (any git revision) to compare this checkout with "
        "(default: HEAD, i.e. what is not committed yet)",
    )


def _worktree(rev: str) -> str:
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    path = REPO / "build" / "ab" / sha
    if not path.exists():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha], check=True, capture_output=True
        )
    return str(path)


def run_side(backend: str, script: str, payload: dict) -> dict:
    """Run `script` in a fresh process with the engine package of `backend` -> the JSON of its "RESULT " line;
    RuntimeError with the end of its stderr where it prints none."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([backend, str(REPO / "scripts")])}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(payload)], env=env, capture_output=True, text=True, check=False
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the run with {backend} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def run(args) -> None:
    base = _worktree(args.base)
    sides = {"base": os.path.join(base, "backend"), "this": str(REPO / "backend")}
    settings = dict(
        model=str(args.model), prompts=args.prompts, max_tokens=args.max_tokens, concurrency=args.concurrency
    )
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for i in range(args.repeat):
        for side in list(sides) if i % 2 == 0 else list(reversed(sides)):
            runs[side].append(run_side(sides[side], _SIDE, settings))
            report.log(
                f"round {i + 1} {side}: " + ", ".join(f"{w} {r['tok_s']:.1f}" for w, r in runs[side][-1].items())
            )
    rows = []
    for workload in runs["base"][0]:
        med = {s: statistics.median(r[workload]["tok_s"] for r in runs[s]) for s in sides}
        same = all(r[workload]["ids"] == runs["base"][0][workload]["ids"] for s in sides for r in runs[s])
        rows.append(
            [
                workload,
                f"{med['base']:.1f}",
                f"{med['this']:.1f}",
                f"{med['this'] / med['base']:.3f}",
                "yes" if same else "NO",
            ]
        )
    lines = report.header(
        f"This checkout against {args.base}",
        args,
        f"{args.prompts} JME extraction prompts, max_tokens {args.max_tokens}, greedy, served "
        f"default drafting (auto k, lookup and the int8 copy), unguided and guided; median of "
        f"{args.repeat} rounds, the sides alternating",
    )
    lines += report.table(["workload", "base tok/s", "this tok/s", "this ÷ base", "greedy ids identical"], rows)
    report.write(args, lines, dict(runs=runs))
