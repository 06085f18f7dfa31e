"""Reports: markdown tables, the header every report starts with, and where the files go.

A scenario's markdown report is printed and written to <raw>/report.md, and to --out when given (the file
docs/ keeps); its raw figures (run records, exports, logs) go to the raw folder <raw>: build/bench/<scenario>/
(build/bench/<scenario>/quick/ with --quick, or --raw DIR), which git ignores. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from pathlib import Path

from . import RAW
from .machine import PACKAGES, machine, versions


def cell(value, fmt: str = "{:.1f}") -> str:
    """A table cell: '–' for a missing value (None or nan), strings as they are, numbers through fmt."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return value if isinstance(value, str) else fmt.format(value)


def table(header: list[str], rows) -> list[str]:
    """A markdown table: a header row, the rule, one line per row (cells already formatted)."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


ENV_SHOWN = ("SPECGRAM_KERNEL_ISA",)  # environment settings that change what a run measures, shown in its command


def command(args) -> str:
    env = [f"{k}={shlex.quote(os.environ[k])} " for k in ENV_SHOWN if os.environ.get(k)]
    return "".join(env) + "python " + shlex.join(["scripts/bench.py", *args.argv])


def header(title: str, args, workload: str = "", packages=PACKAGES, command_text: str | None = None) -> list[str]:
    """A report's first lines: title, the command (and how long it ran), machine, load, versions, workload."""
    took = time.perf_counter() - args.started
    lines = [
        f"# {title}",
        "",
        f"Command: `{command_text or command(args)}` ({took:.0f} s)  ",
        f"Machine: {machine()}; load avg at start {args.load0}  ",
        f"Versions: {versions(packages)}  ",
    ]
    return lines + ([f"Workload: {workload}", ""] if workload else [""])


def raw_dir(args) -> Path:
    d = Path(args.raw) if args.raw else RAW / args.scenario / ("quick" if args.quick else "")
    d.mkdir(parents=True, exist_ok=True)
    return d


def public(obj):
    """obj without the keys that start with '_' (objects kept for the scenario itself), at every depth."""
    if isinstance(obj, dict):
        return {k: public(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [public(v) for v in obj]
    return obj


def write(args, lines: list[str], raw=None, quiet: bool = False) -> Path:
    """Print the report (unless quiet) and write it to <raw>/report.md and --out; raw (any JSON-able object) to
    <raw>/<scenario>.json. -> the raw folder."""
    text = "\n".join(lines).rstrip("\n") + "\n"
    if not quiet:
        print(text, flush=True)
    d = raw_dir(args)
    (d / "report.md").write_text(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    if raw is not None:
        (d / f"{args.scenario}.json").write_text(json.dumps(public(raw), indent=1, default=str))
    return d


def log(msg: str) -> None:
    """A progress line (the report itself comes at the end)."""
    print(f"# [{time.strftime('%H:%M:%S')}] {msg}", flush=True)
