"""Broken and odd GGUF files: each refused at load with a message in words naming the file and the problem (never
numpy's or a KeyError's text), by the engine and by `check_model` (exit 2); a folder of several models asks which.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from specgram import check_model
from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.errors import ModelLoadError
from specgram.model import kernels
from specgram.model.gguf_checkpoint import checkpoint, gguf_file

from .tiny_gguf import save_gguf

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")

QUIET = ("Traceback", "cannot reshape", "KeyError", "IndexError", "struct.error")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return save_gguf(tmp_path_factory.mktemp("gguf-good") / "good.gguf", seed=4)


def _type_field(data: bytes, tensor: str) -> int:
    """The byte offset of a tensor's block-type code in the header's tensor table: its name (u64 length, bytes),
    its dimension count (u32), its dimensions (u64 each), then the type (u32)."""
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * n_dims


def _broken(good, tmp_path, how: str):
    data = good.read_bytes()
    path = tmp_path / f"{how}.gguf"
    if how == "truncated":
        path.write_bytes(data[: len(data) * 3 // 4])
    elif how == "random":
        path.write_bytes(np.random.default_rng(0).bytes(len(data) // 8))
    elif how == "short":
        path.write_bytes(b"GGUF")
    elif how == "header-cut":
        path.write_bytes(data[:200])
    elif how == "type-code":
        at = _type_field(data, "blk.1.attn_q.weight")
        path.write_bytes(data[:at] + struct.pack("<I", 977) + data[at + 4 :])
    elif how == "architecture":
        data = data.replace(b"qwen2", b"mamba")  # every metadata key and the architecture's name with it
        path.write_bytes(data)
    return path


EXPECTED = {  # how -> words the refusal says
    "truncated": ("ends", "bytes past the end of the file", "truncated", "tensor 'blk."),
    "random": ("not a GGUF file",),
    "short": ("too short to be a GGUF file",),
    "header-cut": ("ends inside its header", "truncated"),
    "type-code": ("'blk.1.attn_q.weight'", "block type code 977", "unknown"),
    "architecture": ("'mamba'", "qwen2", "llama", "gemma3", "served"),
}


@pytest.mark.parametrize("how", list(EXPECTED))
def test_a_broken_file_is_refused_in_words_naming_it(good, tmp_path, how):
    path = _broken(good, tmp_path, how)
    with pytest.raises(ModelLoadError) as e:
        checkpoint(path).tensors(2)
    msg = str(e.value)
    assert str(path) in msg, msg
    for words in EXPECTED[how]:
        assert words in msg, (words, msg)
    if how == "truncated":  # how many bytes are missing: the tensor's end beyond the file's size
        size = path.stat().st_size
        missing = int(msg.split(" ends ")[1].split(" bytes")[0])
        assert 0 < missing <= len(good.read_bytes()) - size


@pytest.mark.parametrize("how", ["truncated", "random", "type-code", "architecture"])
def test_check_model_exits_2_for_a_broken_file_and_the_engine_refuses_it(good, tmp_path, capsys, how):
    path = _broken(good, tmp_path, how)
    assert check_model.main([str(path), "--set", "max_slots=2"]) == 2
    err = capsys.readouterr().err
    assert EXPECTED[how][0] in err and not any(q in err for q in QUIET), err
    with pytest.raises(ModelLoadError) as e:
        Engine.from_config(EngineConfig(checkpoint=str(path), device="cpu", max_slots=2, max_seq_len=256))
    assert EXPECTED[how][0] in str(e.value)


def test_a_folder_with_a_vision_projector_serves_its_model_and_several_models_ask_which(good, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model-q4_k_m.gguf").write_bytes(good.read_bytes())
    (folder / "mmproj-model-f16.gguf").write_bytes(b"GGUF")  # a projector: never read as the model
    assert gguf_file(folder) == folder / "model-q4_k_m.gguf"
    (folder / "model-q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="several GGUF models.*model-q4_k_m.gguf, model-q8_0.gguf"):
        gguf_file(folder)
