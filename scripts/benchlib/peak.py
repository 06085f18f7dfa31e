"""The measured fp32 FMA peak (fma_peak.c, compiled here with the system compiler for the native kernels' ISA):
what a compute-bound matrix product could reach on this machine, to rate wide verify forwards against."""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("fma_peak.c")
FLAGS = {"avx512": ["-mavx512f", "-mfma"], "avx2": ["-mavx2", "-mfma"]}


def fma_peak_gflops(isa: str, nthreads: int, repeat: int = 5, iters: int = 10_000_000) -> float:
    """Best of `repeat` runs of fma_peak.c on nthreads threads, in GFLOP/s (2 flops per fma lane)."""
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "fma_peak.so"
        subprocess.run(
            ["gcc", "-O3", "-fopenmp", "-fPIC", "-shared", *FLAGS[isa], "-o", str(lib_path), str(SOURCE)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        lib = ctypes.CDLL(str(lib_path))
        lib.fma_flops.restype, lib.fma_flops.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int]
        best = 0.0
        for _ in range(repeat):
            t = time.perf_counter()
            flops = lib.fma_flops(iters, nthreads)
            best = max(best, flops / (time.perf_counter() - t))
    return best / 1e9
