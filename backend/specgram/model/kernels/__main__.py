"""python -m specgram.model.kernels build [--debug] [--out DIR]

Compiles the native kernels at set-up time, into _build/ next to the sources by default (where `load()` finds
them before any per-user cache); if that directory cannot be written, into the place `load()` would use.
Exit status 0 when the library is built and loads on this machine, 1 otherwise (the reason on stderr).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import PREBUILT_DIR, KernelsUnavailable, build, compile_into, cpu_has_avx512, open_library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specgram.model.kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the kernel library")
    b.add_argument("--debug", action="store_true", help="the debug build (-O1 -g, asserts on)")
    b.add_argument("--out", type=Path, default=PREBUILT_DIR, help=f"output directory (default {PREBUILT_DIR})")
    args = parser.parse_args(argv)
    try:
        try:
            path = compile_into(args.out, debug=args.debug)
        except OSError as e:
            print(f"kernels: {args.out} not writable ({e}); building into the cache instead", file=sys.stderr)
            path = build(debug=args.debug)
        open_library(path)
    except KernelsUnavailable as e:
        print(f"kernels: build failed: {e}", file=sys.stderr)
        return 1
    print(path)
    if not cpu_has_avx512():
        print("kernels: built, but this CPU has no AVX-512: the CPU forward will use PyTorch", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
