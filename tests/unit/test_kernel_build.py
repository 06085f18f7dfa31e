"""Building and finding the native kernel libraries (specgram/model/kernels/__init__.py, __main__.py): the cache
key, the directory order and its fall-backs, the warning when the kernels are unavailable, the debug build's
asserts, and the sources shipping inside the wheel. Choosing the ISA: test_kernel_isa.py."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from specgram.model import kernels
from specgram.model.kernels import abi
from specgram.model.kernels.__main__ import main as kernels_main

REPO = Path(__file__).resolve().parents[2]
HAVE_GCC = shutil.which("gcc") is not None
CPU_ISAS = [isa for isa in kernels.ISAS if kernels.cpu_supports(isa)]
NATIVE = HAVE_GCC and bool(CPU_ISAS)

FAKE_CC = """#!/bin/sh
# a stand-in compiler: --version prints an identity; otherwise writes a dummy file at the -o argument
if [ "$1" = "--version" ]; then echo "fakecc {version}"; exit 0; fi
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then shift; echo "not a library" > "$1"; fi
  shift
done
exit {rc}
"""


def _fake_cc(tmp_path: Path, version: str = "1.0", rc: int = 0) -> str:
    path = tmp_path / f"fakecc-{version}-{rc}"
    path.write_text(FAKE_CC.format(version=version, rc=rc))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Every directory the kernels may use, redirected under tmp_path; `blocked` cannot be created (a file
    stands in its parent's place)."""
    (tmp_path / "file").write_text("")
    d = {
        "env": tmp_path / "env",
        "prebuilt": tmp_path / "prebuilt",
        "home": tmp_path / "home",
        "temp": tmp_path / "temp",
        "blocked": tmp_path / "file" / "sub",
    }
    monkeypatch.setattr(kernels, "PREBUILT_DIR", d["prebuilt"])
    monkeypatch.setattr(kernels, "_private_temp_dir", lambda: d["temp"])
    monkeypatch.setenv("HOME", str(d["home"]))
    monkeypatch.delenv(kernels.CACHE_ENV, raising=False)
    monkeypatch.delenv(kernels.DEBUG_ENV, raising=False)
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    monkeypatch.setenv("CC", _fake_cc(tmp_path))
    d["user"] = d["home"] / ".cache" / "specgram" / "kernels"
    return d


def test_cache_key_covers_compiler_flags_isa_and_sources(tmp_path, monkeypatch):
    gcc, flags = "/usr/bin/gcc gcc 12.2.0", kernels.compile_flags("avx512", False)
    base = kernels.cache_key(gcc, flags)
    assert base == kernels.cache_key(gcc, flags)
    assert base != kernels.cache_key("/usr/bin/gcc gcc 13.1.0", flags)
    assert base != kernels.cache_key(gcc, kernels.compile_flags("avx512", True))
    assert base != kernels.cache_key(gcc, kernels.compile_flags("avx2", False))
    for name in ("SOURCES", "HEADERS"):
        copies = []
        for f in getattr(kernels, name):
            shutil.copy(f, tmp_path / f.name)
            copies.append(tmp_path / f.name)
        monkeypatch.setattr(kernels, name, copies)
        assert kernels.cache_key(gcc, flags) == base
        copies[1].write_text(copies[1].read_text() + "\n")
        assert kernels.cache_key(gcc, flags) != base
        base = kernels.cache_key(gcc, flags)


def test_the_cache_key_reads_every_source_and_header_of_the_kernels():
    """An edit to any file the compiler reads must change the library's name (else a stale build is reused)."""
    import re

    keyed = {f.name for f in kernels.SOURCES + kernels.HEADERS}
    on_disk = {f.name for f in kernels.HERE.iterdir() if f.suffix in (".c", ".h")}
    included = {m for f in kernels.HERE.glob("*.[ch]") for m in re.findall(r'#include "([^"]+)"', f.read_text())}
    assert "tree.h" in included and included <= keyed, included - keyed  # what the compiler reads of ours
    assert keyed == on_disk, on_disk ^ keyed


def test_compiler_identity_names_path_and_version(tmp_path):
    a, b = _fake_cc(tmp_path, "1.0"), _fake_cc(tmp_path, "2.0")
    assert kernels.compiler_identity(a) == f"{os.path.realpath(a)} fakecc 1.0"
    assert kernels.library_name("avx512", a, False) != kernels.library_name("avx512", b, False)
    assert kernels.library_name("avx512", a, True).endswith("-debug.so")
    assert kernels.library_name("avx2", a, False).startswith("libspecgram_kernels-avx2-")
    with pytest.raises(kernels.KernelsUnavailable, match="no C compiler"):
        kernels.compiler_identity(str(tmp_path / "no-such-cc"))


def test_lookup_order(dirs, monkeypatch):
    name = kernels.library_name("avx512")
    for d in ("env", "prebuilt", "user"):
        dirs[d].mkdir(parents=True)
        (dirs[d] / name).write_text("")
    assert kernels.build("avx512") == dirs["prebuilt"] / name  # no $SPECGRAM_KERNEL_CACHE
    monkeypatch.setenv(kernels.CACHE_ENV, str(dirs["env"]))
    assert kernels.build("avx512") == dirs["env"] / name
    (dirs["env"] / name).unlink()
    assert kernels.build("avx512") == dirs["prebuilt"] / name  # a prebuilt library before compiling
    (dirs["prebuilt"] / name).unlink()
    assert kernels.build("avx512") == dirs["user"] / name
    assert kernels.build("avx2") == dirs["env"] / kernels.library_name("avx2")  # another ISA: another file
    monkeypatch.setenv(kernels.DEBUG_ENV, "1")  # another key: compiled into $...CACHE
    assert kernels.build("avx512") == dirs["env"] / kernels.library_name("avx512", debug=True)


def test_compiles_into_the_first_writable_directory(dirs, monkeypatch):
    name = kernels.library_name("avx2")
    monkeypatch.setenv(kernels.CACHE_ENV, str(dirs["blocked"]))
    assert kernels.build("avx2") == dirs["user"] / name
    (dirs["user"] / name).unlink()
    monkeypatch.setenv("HOME", str(dirs["blocked"]))  # no writable cache at all
    assert kernels.build("avx2") == dirs["temp"] / name


def test_compile_failure_is_reported(dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", _fake_cc(tmp_path, rc=1))
    for isa in kernels.ISAS:
        with pytest.raises(kernels.KernelsUnavailable, match="compiling failed"):
            kernels.build(isa)
    assert kernels_main(["build", "--out", str(dirs["prebuilt"])]) == 1


def test_load_warns_when_unavailable(monkeypatch, caplog):
    def fail(*a, **k):
        raise kernels.KernelsUnavailable("no C compiler 'gcc' on PATH")

    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx512f", "avx512bw", "avx2", "fma"}))
    monkeypatch.setattr(kernels, "load_isa", fail)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        assert kernels.load.__wrapped__() is None  # the uncached body of load()
    assert "the avx512 build failed, trying avx2" in caplog.text
    assert "falls back to PyTorch" in caplog.text and "no C compiler" in caplog.text


@pytest.mark.skipif(not NATIVE, reason="needs gcc and an AVX-512 or AVX2 CPU")
def test_build_command(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    assert kernels_main(["build", "--out", str(tmp_path)]) == 0  # every ISA, whatever this CPU runs
    out, err = capsys.readouterr()
    paths = [Path(line) for line in out.split()]
    assert paths == [tmp_path / kernels.library_name(isa, debug=False) for isa in kernels.ISAS]
    assert f"this CPU runs the {CPU_ISAS[0]} build" in err
    assert kernels_main(["build", "--isa", "avx2", "--out", str(tmp_path)]) == int("avx2" not in CPU_ISAS)
    assert capsys.readouterr().out.split() == [str(paths[1])]


@pytest.mark.skipif(not NATIVE, reason="needs gcc and an AVX-512 or AVX2 CPU")
@pytest.mark.parametrize("isa", CPU_ISAS)
def test_every_build_this_machine_can_run_compiles_and_loads(isa):
    """Where gcc and the ISA are there, a build that fails is a defect, not a reason to skip the native tests."""
    lib = kernels.load_isa(isa)
    assert lib.isa == isa and all(hasattr(lib, name) for name in abi.FUNCTIONS)


@pytest.mark.skipif(not NATIVE, reason="needs gcc and an AVX-512 or AVX2 CPU")
@pytest.mark.parametrize("isa", CPU_ISAS)
def test_specgram_h_is_the_whole_contract_and_its_mirrors_match_the_compiler(isa):
    """Every symbol the library exports is declared in specgram.h (the rest are hidden: team.h), every declared
    entry point is exported, and each struct's ctypes mirror has the compiler's size."""
    lib = kernels.load_isa(isa)
    assert {name: c for name, (c, _) in abi.sizes(lib).items()} == {
        name: py for name, (_, py) in abi.sizes(lib).items()
    }
    assert set(abi.STRUCTS) == {
        "specgram_linear",
        "specgram_layer",
        "specgram_decoder",
        "specgram_lora_part",
        "specgram_lora",
    }
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm to list the library's exported symbols")
    listing = subprocess.run([nm, "-D", "--defined-only", str(lib.path)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in listing.splitlines() if " T specgram_" in line}
    assert exported == set(abi.FUNCTIONS)


def test_the_declared_signatures_are_read_as_ctypes_types():
    restype, args = abi.FUNCTIONS["specgram_decoder_forward"]
    assert restype is ctypes.c_int and len(args) == 23 and args[0] is ctypes.c_void_p and args[-1] is ctypes.c_int
    assert abi.FUNCTIONS["specgram_isa"] == (ctypes.c_char_p, [])
    assert abi.FUNCTIONS["specgram_attention"][1][13] is ctypes.c_float  # the score scale
    assert dict(abi.Layer._fields_)["eps_next"] is ctypes.c_float
    assert dict(abi.Decoder._fields_)["layer"] == ctypes.POINTER(abi.Layer)
    assert dict(abi.Lora._fields_)["parts"] == ctypes.POINTER(abi.LoraPart) and abi.LORA_MAX_RANK == 256
    assert (abi.LIN_F32, abi.LIN_I8A8, abi.BAD_TOKEN, abi.BAD_HEAD_ROW) == (0, 3, 1, 5)


@pytest.mark.skipif(not NATIVE, reason="needs gcc and an AVX-512 or AVX2 CPU")
@pytest.mark.parametrize("isa", CPU_ISAS)
def test_debug_build_asserts_bounds(tmp_path, isa):
    """SPECGRAM_KERNEL_DEBUG=1 builds with asserts: an in-range call runs, a slot past the cache aborts."""
    script = textwrap.dedent(f"""
        import sys, torch
        from specgram.model import kernels
        lib = kernels.load()
        assert lib is not None and lib.isa == {isa!r} and lib.path.name.endswith("-debug.so")
        S, H, D, P = 2, 2, 16, 32
        kc, vc, q, out = torch.zeros(S, H, D, P), torch.zeros(S, H, P, D), torch.ones(1, H * D), torch.empty(1, H * D)
        def attend(slot):
            s, p = torch.tensor([slot]), torch.tensor([3])
            lib.specgram_attention(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), 0, s.data_ptr(), p.data_ptr(), 1, S, H,
                                   H, D, P, 0, 0.25, out.data_ptr(), 1)
        attend(1)
        print("in range: ok", flush=True)
        attend(S)
        print("out of range: not caught", flush=True)
    """)
    env = {
        **os.environ,
        kernels.DEBUG_ENV: "1",
        kernels.CACHE_ENV: str(tmp_path),
        kernels.ISA_ENV: isa,
        "PYTHONPATH": str(REPO / "backend"),
    }
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "in range: ok" in r.stdout, r.stderr
    assert r.returncode != 0 and "not caught" not in r.stdout
    assert "Assertion" in r.stderr and "slots[n] < S" in r.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None,
    reason="building the wheel offline (--no-build-isolation) needs setuptools in this environment",
)
def test_wheel_ships_the_kernel_sources(tmp_path):
    """A non-editable install must carry the .c / .h files: the kernels compile from them."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "backend" / "pyproject.toml", src)
    shutil.copytree(
        REPO / "backend" / "specgram",
        src / "specgram",
        ignore=shutil.ignore_patterns("__pycache__", "_build", "*.egg-info"),
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            str(src),
            "-w",
            str(tmp_path / "wheel"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("specgram-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in kernels.SOURCES + kernels.HEADERS:
        assert f"specgram/model/kernels/{f.name}" in names
    assert not any("_build" in n for n in names)
