"""The machine and the versions a report names (standard library only)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ("torch", "transformers", "xgrammar")


def machine() -> str:
    """CPU model and cores, RAM, GPU (if any), OS, torch threads when torch is loaded."""
    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    out = f"{cpu}, {os.cpu_count()} cores"
    try:
        out += f", {int(Path('/proc/meminfo').read_text().split()[1]) / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    if shutil.which("nvidia-smi"):
        try:
            gpu = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            out += f", GPU {gpu}" if gpu else ""
        except (OSError, subprocess.SubprocessError):
            pass
    if "torch" in sys.modules:
        out += f", torch {sys.modules['torch'].get_num_threads()} threads"
    return f"{out}, {platform.system()} {platform.release()}"


def versions(packages=PACKAGES) -> str:
    out = []
    for p in packages:
        try:
            out.append(f"{p} {md.version(p)}")
        except md.PackageNotFoundError:
            out.append(f"{p} ?")
    return ", ".join(out) + f", Python {platform.python_version()}"


def load() -> str:
    """The 1 / 5 / 15 minute load averages (a noisy machine shows here)."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
