"""Choosing the kernels' instruction set (specgram/model/kernels/__init__.py): AVX-512 where the CPU has it, else
AVX2 + FMA, else none (the PyTorch forward); SPECGRAM_KERNEL_ISA forcing one; each library knowing its own ISA;
and, for each ISA this CPU runs, the engine's greedy output token-identical with speculation on and off and
batched or alone (test_native.py checks the kernels' bitwise invariance under each ISA)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from specgram.model import kernels

from .helpers import PROMPTS, run, tokens_of

ALL = frozenset({"avx512f", "avx512bw", "avx2", "fma"})


@pytest.fixture
def cpu(monkeypatch):
    """cpu(flags): this process sees a CPU with those feature flags; SPECGRAM_KERNEL_ISA unset."""
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    return lambda flags: monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset(flags))


@pytest.mark.parametrize(
    "flags,expected",
    [
        (ALL, ["avx512", "avx2"]),
        (ALL - {"avx512bw"}, ["avx2"]),  # AVX-512 without BW: not enough for the AVX-512 build
        ({"avx512f", "avx512bw", "avx2"}, ["avx512"]),  # no FMA flag: no AVX2 build
    ],
)
def test_auto_tries_the_isas_this_cpu_runs_best_first(cpu, flags, expected):
    cpu(flags)
    assert kernels.candidate_isas() == expected


@pytest.mark.parametrize("flags", [set(), {"avx", "avx2"}, {"avx512f", "fma"}])
def test_no_isa_means_no_kernels(cpu, flags):
    cpu(flags)
    with pytest.raises(kernels.KernelsUnavailable, match="neither AVX-512 .* nor AVX2 with FMA"):
        kernels.candidate_isas()


def test_the_setting_forces_an_isa(cpu, monkeypatch):
    cpu(ALL)
    for value, expected in (
        ("avx2", ["avx2"]),
        (" AVX512 ", ["avx512"]),
        ("auto", ["avx512", "avx2"]),
        ("", ["avx512", "avx2"]),
    ):
        monkeypatch.setenv(kernels.ISA_ENV, value)
        assert kernels.candidate_isas() == expected
    monkeypatch.setenv(kernels.ISA_ENV, "sse4")
    with pytest.raises(kernels.KernelsUnavailable, match="SPECGRAM_KERNEL_ISA must be auto, avx512 or avx2"):
        kernels.candidate_isas()
    cpu({"avx2", "fma"})
    monkeypatch.setenv(kernels.ISA_ENV, "avx512")
    with pytest.raises(kernels.KernelsUnavailable, match="this CPU lacks avx512f / avx512bw"):
        kernels.candidate_isas()
    with pytest.raises(kernels.KernelsUnavailable, match="this CPU lacks avx512f / avx512bw"):
        kernels.load_isa.__wrapped__("avx512")


def test_auto_falls_back_to_avx2_when_the_avx512_build_fails(cpu, monkeypatch, caplog):
    cpu(ALL)
    avx2 = SimpleNamespace(isa="avx2", path=Path("libspecgram_kernels-avx2.so"))

    def load_isa(isa):
        if isa == "avx512":
            raise kernels.KernelsUnavailable("compiling failed (gcc: unrecognized option -mavx512bw)")
        return avx2

    monkeypatch.setattr(kernels, "load_isa", load_isa)
    with caplog.at_level(logging.INFO, logger=kernels.__name__):
        assert kernels.load.__wrapped__() is avx2
    assert "the avx512 build failed, trying avx2" in caplog.text and "the avx2 build" in caplog.text


CPU_ISAS = [isa for isa in kernels.ISAS if kernels.cpu_supports(isa)]
needs_kernels = pytest.mark.skipif(kernels.load() is None, reason="no native kernels on this machine")


@needs_kernels
@pytest.mark.parametrize("isa", CPU_ISAS)
def test_load_takes_the_forced_build_which_knows_its_isa(isa, monkeypatch):
    monkeypatch.setenv(kernels.ISA_ENV, isa)
    lib = kernels.load.__wrapped__()  # the uncached body of load(), under the setting
    assert lib is kernels.load_isa(isa) and lib.isa == isa and lib.specgram_isa() == isa.encode()
    assert lib.path.name.startswith(f"libspecgram_kernels-{isa}-")
    other = next((o for o in kernels.ISAS if o != isa), None)
    with pytest.raises(kernels.KernelsUnavailable, match=f"is the {isa} build, not {other}"):
        kernels.open_library(lib.path, other)


def test_greedy_output_is_the_same_speculating_or_not_batched_or_alone(lib, make_engine):
    engine = make_engine()
    assert engine.target.linear_kind == "native" and engine.target.native.lib is lib
    alone = [tokens_of(run(engine, [p], max_tokens=24)[0]) for p in PROMPTS]
    assert [tokens_of(o) for o in run(engine, PROMPTS, max_tokens=24)] == alone
    for k in (1, 4):
        spec = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=k, drafter="ngram")
        assert [tokens_of(o) for o in spec] == alone, k
