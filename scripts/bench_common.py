"""Small helpers shared by the benchmark scripts."""
from __future__ import annotations

import argparse


def select_configs(ap: argparse.ArgumentParser, text: str, known: dict, required: tuple[str, ...]) -> list[str]:
    """'a,b' -> the named rows in `known`'s order, with the `required` reference rows always included."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {list(known)}")
    names += [r for r in required if r not in names]
    return sorted(names, key=list(known).index)
