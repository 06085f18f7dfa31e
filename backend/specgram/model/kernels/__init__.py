"""Native CPU kernels: C sources compiled with the system C compiler into one shared library per instruction
set, loaded by ctypes.

gemm.c: the small-M matrix product, fp32, bf16 or int8 weights (see its header for the layout and the batch
invariance it guarantees); gemm_i8a8.c: int8 weights times activations quantized per row in the call (int8,
or int16 as two int8 digits), exact int32 accumulation on VNNI;
rope.c: rotary and the KV-cache write; attention.c: attention reading the cache in place; norm.c: RMSNorm with
the residual add, and SiLU-and-multiply; mask.c: a grammar's token bitmask applied to logits rows; lora.c: LoRA
adapters' updates of a product's rows; scratch.c: their per-thread scratch memory; forward.c: a whole decoder
stack in one call and one OpenMP region, running the other kernels' team bodies (team.h) between barriers that
prefetch the next weights while they wait (barrier.h), the model described by the structs of specgram.h.
specgram.h declares every entry point Python calls and every struct and constant it passes, once: abi.py reads
it for the ctypes signatures and mirrors, and the sources include it. Together they are the CPU forward's
"native" path (native.py). They are written once over vec.h, a vector-width abstraction with
two implementations, and compiled once per ISA:

  avx512  vec_avx512.h, 16 lanes   needs avx512f and avx512bw   -mavx512f -mavx512bw -mfma
  avx2    vec_avx2.h, 8 lanes      needs avx2 and fma           -mavx2 -mfma

`load()` takes the AVX-512 build where the CPU has it, else the AVX2 build (SPECGRAM_KERNEL_ISA=avx2|avx512
forces one; auto, the default, picks); where neither runs, or gcc (or $CC) with OpenMP is missing, it logs a
warning and returns None, and the runner keeps PyTorch's own matmuls. Each build is batch-invariant on its own
(the reduction orders are fixed by the shapes and the ISA); the two builds' results differ in the last bits.
The shared library links the same libgomp as torch (already loaded, so the dynamic linker reuses it): one
OpenMP thread pool for both.

Build: `python -m specgram.model.kernels build` (run by scripts/setup.sh) compiles both ISAs into _build/ next
to the sources; otherwise the first `load()` compiles the one it needs. The file name carries the ISA and a key
over the compiler's identity (its resolved path and `--version` line), the flags and the sources, so a changed
compiler, flag or source never reuses a stale library. A library is looked for in $SPECGRAM_KERNEL_CACHE (if
set), then _build/, then ~/.cache/specgram/kernels; one compiled on demand goes to the first of
$SPECGRAM_KERNEL_CACHE and ~/.cache/specgram/kernels that can be written (a container may mount either
read-only), else to a private temporary directory of this process.

VNNI: the same two builds hold gemm_i8a8.c's product, compiled for VNNI in those functions only (the library
still loads on CPUs without it), and `has_vnni(lib)` says whether it may be called: where /proc/cpuinfo has the
VNNI flag of the build's ISA (avx512_vnni for avx512, avx_vnni for avx2) and SPECGRAM_KERNEL_VNNI is not 0 (0
turns it off, so that the weight-only int8 path runs instead; tests cover both).

SPECGRAM_KERNEL_DEBUG=1: a debug build (-O1 -g, asserts on slot, position and index ranges inside the
kernels), under its own key.
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

from . import abi

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [
    HERE / n
    for n in (
        "gemm.c",
        "gemm_i8a8.c",
        "gemm_i4.c",
        "gemm_i8b.c",
        "rope.c",
        "attention.c",
        "norm.c",
        "lora.c",
        "mask.c",
        "forward.c",
        "scratch.c",
        "isa.c",
    )
]
HEADERS = sorted(HERE.glob("*.h"))  # every header: each one is part of the build cache key
PREBUILT_DIR = HERE / "_build"  # `python -m specgram.model.kernels build`; git-ignored
CACHE_ENV, DEBUG_ENV, ISA_ENV = "SPECGRAM_KERNEL_CACHE", "SPECGRAM_KERNEL_DEBUG", "SPECGRAM_KERNEL_ISA"
VNNI_ENV = "SPECGRAM_KERNEL_VNNI"
ISAS = ("avx512", "avx2")  # best first: what auto tries, in order
ISA_FLAGS = {"avx512": ["-mavx512f", "-mavx512bw", "-mfma"], "avx2": ["-mavx2", "-mfma"]}
CPU_FLAGS = {"avx512": ("avx512f", "avx512bw"), "avx2": ("avx2", "fma")}  # /proc/cpuinfo flags each needs
VNNI_FLAGS = {"avx512": "avx512_vnni", "avx2": "avx_vnni"}  # ... and the flag its specgram_gemm_i8a8 needs
# -ffp-contract=off: no fused multiply-adds but the explicit ones (rotary and norms round like transformers')
_COMMON = ["-fopenmp", "-fPIC", "-shared", "-ffp-contract=off"]
FLAGS = ["-O3", "-DNDEBUG", *_COMMON]
DEBUG_FLAGS = ["-O1", "-g", "-DSPECGRAM_DEBUG", *_COMMON]


class KernelsUnavailable(RuntimeError):
    """The library cannot be built or loaded here; the message says why."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_supports(isa: str) -> bool:
    return all(f in cpu_flags() for f in CPU_FLAGS[isa])


def has_vnni(lib) -> bool:
    """Whether `lib`'s int8 x int8 product (specgram_gemm_i8a8) may be called here: the compiler built it (gcc
    before 11 cannot target AVX-VNNI: not in its AVX2 build), this CPU has the VNNI flag of the library's ISA, and
    $SPECGRAM_KERNEL_VNNI is not 0. Calling it where the CPU lacks VNNI is an illegal instruction."""
    if os.environ.get(VNNI_ENV, "").strip() == "0":
        return False
    return VNNI_FLAGS[lib.isa] in cpu_flags() and bool(lib.specgram_i8a8_built())


def requested_isa() -> str:
    """$SPECGRAM_KERNEL_ISA: "auto" (the default), or one of ISAS; KernelsUnavailable for anything else."""
    value = os.environ.get(ISA_ENV, "").strip().lower() or "auto"
    if value != "auto" and value not in ISAS:
        raise KernelsUnavailable(f"{ISA_ENV} must be auto, {' or '.join(ISAS)}, got {value!r}")
    return value


def candidate_isas(requested: str | None = None) -> list[str]:
    """The builds load() tries, in order: every ISA this CPU runs (auto), or the one requested; KernelsUnavailable
    where there is none."""
    requested = requested or requested_isa()
    if requested != "auto":
        if not cpu_supports(requested):
            raise KernelsUnavailable(f"{ISA_ENV}={requested}, but this CPU lacks {' / '.join(CPU_FLAGS[requested])}")
        return [requested]
    found = [isa for isa in ISAS if cpu_supports(isa)]
    if not found:
        raise KernelsUnavailable("this CPU has neither AVX-512 (avx512f and avx512bw) nor AVX2 with FMA")
    return found


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def compiler() -> str:
    return os.environ.get("CC", "gcc")


@functools.cache
def compiler_identity(cc: str) -> str:
    """-> "<resolved path> <first line of --version>"; raises KernelsUnavailable if there is no such compiler."""
    path = shutil.which(cc)
    if path is None:
        raise KernelsUnavailable(f"no C compiler {cc!r} on PATH")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelsUnavailable(f"{cc} --version failed: {e}") from e
    return f"{os.path.realpath(path)} {(out.splitlines() or [''])[0]}"


def cache_key(identity: str, flags: list[str]) -> str:
    """16 hex digits over the compiler identity, the flags and every source and header (name and bytes)."""
    digest = hashlib.sha256("\0".join([identity, *flags]).encode())
    for f in SOURCES + HEADERS:
        digest.update(f"\0{f.name}\0".encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def compile_flags(isa: str, debug: bool) -> list[str]:
    return [*(DEBUG_FLAGS if debug else FLAGS), *ISA_FLAGS[isa]]


def library_name(isa: str, cc: str | None = None, debug: bool | None = None) -> str:
    cc = cc or compiler()
    debug = debug_requested() if debug is None else debug
    key = cache_key(compiler_identity(cc), compile_flags(isa, debug))
    return f"libspecgram_kernels-{isa}-{key}{'-debug' if debug else ''}.so"


def _user_cache() -> Path | None:
    try:
        return Path.home() / ".cache" / "specgram" / "kernels"
    except (KeyError, RuntimeError):  # no home directory (a bare container user)
        return None


def search_dirs() -> list[Path]:
    """Where a built library is looked for, in order."""
    env = os.environ.get(CACHE_ENV)
    return [d for d in (Path(env) if env else None, PREBUILT_DIR, _user_cache()) if d is not None]


def write_dirs() -> list[Path]:
    """Where a library compiled on demand goes: the first of these that can be written (then a temp dir)."""
    env = os.environ.get(CACHE_ENV)
    return [d for d in (Path(env) if env else None, _user_cache()) if d is not None]


@functools.cache
def _private_temp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="specgram-kernels-"))


def compile_into(out_dir: Path, isa: str, cc: str | None = None, debug: bool | None = None) -> Path:
    """Compile the `isa` library into out_dir (unless a file of the same key is there) -> its path. OSError if
    out_dir cannot be written; KernelsUnavailable if the compiler is missing or fails."""
    cc = cc or compiler()
    debug = debug_requested() if debug is None else debug
    out = Path(out_dir) / library_name(isa, cc, debug)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # build aside, then rename: atomic for racers
        tmp_out = Path(tmp) / out.name
        cmd = [cc, *compile_flags(isa, debug), "-o", str(tmp_out), *map(str, SOURCES)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        except subprocess.CalledProcessError as e:
            raise KernelsUnavailable(f"compiling failed ({' '.join(cmd)}):\n{(e.stderr or '')[-2000:]}") from e
        except subprocess.TimeoutExpired as e:
            raise KernelsUnavailable(f"compiling timed out ({' '.join(cmd)})") from e
        os.replace(tmp_out, out)
    return out


def build(isa: str, cc: str | None = None, debug: bool | None = None) -> Path:
    """-> path of an `isa` library of the current key: found in search_dirs(), else compiled into the first
    writable of write_dirs(), else into a private temporary directory."""
    cc = cc or compiler()
    debug = debug_requested() if debug is None else debug
    name = library_name(isa, cc, debug)
    for d in search_dirs():
        if (d / name).is_file():
            return d / name
    for d in [*write_dirs(), None]:
        target = d if d is not None else _private_temp_dir()
        try:
            return compile_into(target, isa, cc, debug)
        except OSError as e:  # read-only or missing mount: try the next place
            log.info("kernel build directory %s not writable (%s); trying the next", target, e)
    raise KernelsUnavailable("no writable directory to build the kernels in")


def open_library(path: Path, isa: str):
    """ctypes.CDLL of a built `isa` library with every entry point typed, `isa` set to its ISA (checked against
    the library's own answer) and `path` to its file."""
    import torch  # noqa: F401  - torch's libgomp must be loaded first, so the library binds to it

    try:
        lib = ctypes.CDLL(str(path))
        abi.bind(lib)
        built_for = lib.specgram_isa().decode()
    except (OSError, AttributeError) as e:
        raise KernelsUnavailable(f"loading {path} failed: {e}") from e
    if built_for != isa:
        raise KernelsUnavailable(f"{path} is the {built_for} build, not {isa}")
    lib.isa, lib.path = isa, Path(path)
    return lib


@functools.cache
def load_isa(isa: str):
    """-> the loaded `isa` library (built if need be); KernelsUnavailable where this CPU does not run it or it
    cannot be built or loaded. Cached: one library object per ISA per process."""
    if not cpu_supports(isa):
        raise KernelsUnavailable(f"this CPU lacks {' / '.join(CPU_FLAGS[isa])} (the {isa} kernels)")
    return open_library(build(isa), isa)


@functools.cache
def load():
    """-> the loaded kernel library of the ISA chosen (ctypes.CDLL with typed entry points; `.isa` names the
    ISA), or None (with a warning saying why) where no candidate can be built or loaded. Under auto, a build
    that fails is logged and the next ISA tried."""
    try:
        isas = candidate_isas()
        for i, isa in enumerate(isas):
            try:
                lib = load_isa(isa)
                break
            except KernelsUnavailable as e:
                if i + 1 == len(isas):
                    raise
                log.warning("native CPU kernels: the %s build failed, trying %s: %s", isa, isas[i + 1], e)
    except KernelsUnavailable as e:
        log.warning("native CPU kernels unavailable, the CPU forward falls back to PyTorch (slower): %s", e)
        return None
    log.info("native CPU kernels: the %s build (%s)", lib.isa, lib.path)
    return lib
