import dataclasses
import os

import pytest

from specgram.config import EngineConfig
from specgram.drafting import registry
from specgram.engine.engine import Engine
from specgram.model import kernels

from ..conftest import TEST_DEVICE
from .tiny import save_checkpoint

SUFFIX = registry.DRAFTERS["suffix"]


@pytest.fixture(scope="session", autouse=True)
def no_suffix_store_by_default():
    """Unit tests run the same prompts again and again on one engine (a reference run, then speculative runs): a
    suffix store would draft each later run from the first one's outputs, and the tests of the other drafters
    would test it instead. The suffix drafter's tests build their engines with it (suffix_store)."""
    registry.DRAFTERS["suffix"] = dataclasses.replace(SUFFIX, make="tests.unit.helpers:no_drafter")
    yield
    registry.DRAFTERS["suffix"] = SUFFIX


@pytest.fixture
def suffix_store():
    """Engines built in this test have the suffix drafter where their config gives it a store."""
    registry.DRAFTERS["suffix"] = SUFFIX
    yield
    registry.DRAFTERS["suffix"] = dataclasses.replace(SUFFIX, make="tests.unit.helpers:no_drafter")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def make_engine(tiny_ckpt):
    def make(**kw) -> Engine:
        kw.setdefault("max_slots", 4)
        kw.setdefault("max_seq_len", 256)
        kw.setdefault("device", TEST_DEVICE)
        kw.setdefault("dtype", "float32")  # exactness tests compare with HF float32 on CPU
        # SPECGRAM_TEST_LINEAR=torch runs the suite over the PyTorch forward (the path CUDA runs), which "auto"
        # does not pick where the native kernels build
        kw.setdefault("linear", os.environ.get("SPECGRAM_TEST_LINEAR", "auto"))
        return Engine.from_config(EngineConfig(checkpoint=str(tiny_ckpt), **kw))

    return make


@pytest.fixture(params=kernels.ISAS)
def lib(request, monkeypatch):
    """One ISA's kernel library (each this CPU has, the others skipped), which the runners and engines built in
    the test then use (kernels.load() returns it)."""
    try:
        chosen = kernels.load_isa(request.param)
    except kernels.KernelsUnavailable as e:
        pytest.skip(f"the {request.param} kernels: {e}")
    monkeypatch.setattr(kernels, "load", lambda: chosen)
    return chosen


@pytest.fixture
def vnni(lib, monkeypatch):
    """`lib` (one ISA's build) where this CPU has its VNNI (the int8 x int8 and int4 products); skipped elsewhere."""
    monkeypatch.delenv(kernels.VNNI_ENV, raising=False)
    if not kernels.has_vnni(lib):
        pytest.skip(f"this CPU lacks {kernels.VNNI_FLAGS[lib.isa]} (the {lib.isa} build's VNNI products)")
    return lib
