"""Native CPU kernels, built from source with the system C compiler on first use and cached on disk.

gemm.c: the small-M matrix product (see its header for the layout and the batch invariance it guarantees);
attention.c: rotary, KV-cache write and attention reading the cache in place; norm.c: RMSNorm with the
residual add, and SiLU-and-multiply. Together they are the CPU forward's "native" path (native.py). They need
an x86-64 CPU with AVX-512 and gcc (or $CC) with OpenMP; where either is missing, `load()` returns None and
the runner keeps PyTorch's own matmuls. The shared library links the same
libgomp as torch (already loaded, so the dynamic linker reuses it): one OpenMP thread pool for both.

Cache: $SPECGRAM_KERNEL_CACHE, else ~/.cache/specgram/kernels; one file per source hash and compiler flags,
so a restart (or another process: the Triton stub, the tests) does not compile again.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "gemm.c", HERE / "attention.c", HERE / "norm.c"]
HEADERS = [HERE / "vexp.h"]
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mfma", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=off"]
_I64, _PTR, _F32, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
SIGNATURES = {   # argument types of every entry point (all return void)
    "specgram_gemm_f32": [_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64, _INT],
    "specgram_gemm_bf16": [_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64, _INT],
    "specgram_rope_cache_write": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _INT],
    "specgram_attention": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _PTR, _INT],
    "specgram_add_rmsnorm": [_PTR, _PTR, _PTR, _F32, _PTR, _I64, _I64, _INT],
    "specgram_silu_mul": [_PTR, _PTR, _I64, _I64, _INT],
}


def cpu_has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


def _cache_dir() -> Path:
    return Path(os.environ.get("SPECGRAM_KERNEL_CACHE", Path.home() / ".cache" / "specgram" / "kernels"))


def build(cc: str) -> Path:
    """Compile the sources (or reuse the cached build) -> path of the shared library."""
    digest = hashlib.sha256(" ".join([cc, *FLAGS]).encode())
    for f in SOURCES + HEADERS:
        digest.update(f.read_bytes())
    key = digest.hexdigest()[:16]
    out = _cache_dir() / f"libspecgram_gemm-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:   # build aside, then rename: atomic for racers
        tmp_out = Path(tmp) / out.name
        subprocess.run([cc, *FLAGS, "-o", str(tmp_out), *map(str, SOURCES)], check=True, capture_output=True,
                       text=True)
        os.replace(tmp_out, out)
    return out


@functools.cache
def load():
    """-> the loaded kernel library (ctypes.CDLL with typed entry points), or None where it cannot be built."""
    cc = os.environ.get("CC", "gcc")
    if not cpu_has_avx512():
        log.info("native CPU kernels off: this CPU has no AVX-512")
        return None
    if shutil.which(cc) is None:
        log.warning("native CPU kernels off: no C compiler %r found; the CPU forward uses PyTorch's matmuls", cc)
        return None
    import torch  # noqa: F401  - torch's libgomp must be loaded first, so the library binds to it

    try:
        lib = ctypes.CDLL(str(build(cc)))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        log.warning("native CPU kernels off: building the kernels failed: %s", detail[-2000:])
        return None
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None
    return lib
