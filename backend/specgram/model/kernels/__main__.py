"""python -m specgram.model.kernels build [--isa all|avx512|avx2] [--debug] [--out DIR]

Compiles the native kernels at set-up time, one library per ISA (both by default: a compiler can build either
whatever this CPU runs), into _build/ next to the sources by default (where `load()` finds them before any
per-user cache); if that directory cannot be written, into the place `load()` would use. Prints each library
built, one a line. Exit status 0 when the build that `load()` would choose on this machine (see
$SPECGRAM_KERNEL_ISA) is built and loads, 1 otherwise (the reasons on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import ISAS, PREBUILT_DIR, KernelsUnavailable, build, candidate_isas, compile_into, open_library


def build_one(isa: str, out: Path, debug: bool) -> Path:
    """-> the `isa` library, built into out (else where load() would build it) and opened once."""
    try:
        path = compile_into(out, isa, debug=debug)
    except OSError as e:
        print(f"kernels: {out} not writable ({e}); building into the cache instead", file=sys.stderr)
        path = build(isa, debug=debug)
    open_library(path, isa)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specgram.model.kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the kernel libraries")
    b.add_argument("--isa", choices=["all", *ISAS], default="all", help="which ISA's build (default: all)")
    b.add_argument("--debug", action="store_true", help="the debug build (-O1 -g, asserts on)")
    b.add_argument("--out", type=Path, default=PREBUILT_DIR, help=f"output directory (default {PREBUILT_DIR})")
    args = parser.parse_args(argv)
    built = []
    for isa in ISAS if args.isa == "all" else [args.isa]:
        try:
            print(build_one(isa, args.out, args.debug))
            built.append(isa)
        except KernelsUnavailable as e:
            print(f"kernels: the {isa} build failed: {e}", file=sys.stderr)
    try:
        usable = [isa for isa in candidate_isas() if isa in built]
    except KernelsUnavailable as e:
        print(f"kernels: {e}: the CPU forward will use PyTorch", file=sys.stderr)
        return 1
    if not usable:
        print("kernels: no build this CPU runs was built: the CPU forward will use PyTorch", file=sys.stderr)
        return 1
    print(f"kernels: this CPU runs the {usable[0]} build", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
