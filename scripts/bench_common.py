"""Small helpers shared by the benchmark scripts."""
from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def common_args(ap: argparse.ArgumentParser, configs: dict, max_tokens: int, quick_help: str) -> None:
    """The options every in-process benchmark takes: model, rows, batch sizes, length, torch threads, --quick."""
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--configs", default=",".join(configs), help=f"comma-separated rows from {list(configs)}")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=max_tokens)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true", help=quick_help)


def set_threads(n: int) -> None:
    if n:
        import torch
        torch.set_num_threads(n)


def select_configs(ap: argparse.ArgumentParser, text: str, known: dict, required: tuple[str, ...]) -> list[str]:
    """'a,b' -> the named rows in `known`'s order, with the `required` reference rows always included."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {list(known)}")
    names += [r for r in required if r not in names]
    return sorted(names, key=list(known).index)
