import os

import pytest

from specgram.config import EngineConfig
from specgram.engine.engine import Engine

from ..conftest import TEST_DEVICE
from .tiny import save_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def make_engine(tiny_ckpt):
    def make(**kw) -> Engine:
        kw.setdefault("max_slots", 4)
        kw.setdefault("max_seq_len", 256)
        kw.setdefault("device", TEST_DEVICE)
        kw.setdefault("dtype", "float32")      # exactness tests compare with HF float32 on CPU
        # SPECGRAM_TEST_LINEAR=torch runs the suite over the PyTorch forward (the path CUDA runs), which "auto"
        # does not pick where the native kernels build
        kw.setdefault("linear", os.environ.get("SPECGRAM_TEST_LINEAR", "auto"))
        return Engine.from_config(EngineConfig(checkpoint=str(tiny_ckpt), **kw))
    return make
