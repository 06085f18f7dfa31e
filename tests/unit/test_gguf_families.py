"""GGUF files of every served family (model/gguf_families.py): a tiny random model of each, written as llama.cpp's
converter writes it (tiny_gguf.save_family_gguf: permuted q/k rows, Gemma's offset norms, Llama 3's rope_freqs,
Phi-3's longrope factors, metadata only where the format has it), read back to its folder's config and tensors,
and served with the folder's greedy ids in the same weight form at every draft length."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.model import kernels
from specgram.model.checkpoint import TensorFiles
from specgram.model.gguf_checkpoint import checkpoint
from specgram.model.source import open_source

from .helpers import PROMPTS, run, tokens_of
from .tiny import FAMILY_CONFIGS, build_model, build_tokenizer
from .tiny_gguf import save_family_gguf

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")

# what a GGUF cannot say, as llama.cpp's runtime assumes it: no sliding window for a llama-architecture file;
# Gemma 3's every-6th-layer global attention and a score scale of 1 / sqrt(head_dim)
CASES = {
    "llama": dict(),  # Llama 3 rope scaling, untied
    "llama_tied": dict(
        model_type="llama", tie_word_embeddings=True, rope_parameters=FAMILY_CONFIGS["llama"]["rope_parameters"]
    ),
    "qwen2": dict(),
    "qwen3": dict(),  # head_dim 24 at hidden 64
    "qwen3_bias": dict(),
    "mistral": dict(sliding_window=None),
    "gemma3_text": dict(
        num_layers=6, query_pre_attn_scalar=24, layer_types=["sliding_attention"] * 5 + ["full_attention"]
    ),
    "phi3": dict(),
    "phi4_mini": dict(),  # partial rotary, longrope, tied
    "smollm3": dict(),
    "granite": dict(),
}
CONFIG_KEYS = (
    "model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "tie_word_embeddings", "vocab_size", "layer_types", "sliding_window",
    "query_pre_attn_scalar", "no_rope_layers", "embedding_multiplier", "residual_multiplier",
    "attention_multiplier", "logits_scaling", "attention_bias",
)  # fmt: skip


def _model(case: str):
    kw = {**FAMILY_CONFIGS.get(case, {}), **CASES[case]}
    layers = kw.pop("num_layers", 4)
    return build_model(kw.pop("model_type", case), seed=3, num_layers=layers, random_norms=True, **kw)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(folder, gguf file) of one case's model."""
    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    model = _model(request.param)
    model.save_pretrained(root / "folder")
    build_tokenizer().save_pretrained(root / "folder")
    return root / "folder", save_family_gguf(model, root / f"{request.param}.gguf")


def test_the_config_and_every_tensor_read_back_as_the_folder_has_them(pair):
    folder, file = pair
    ours, theirs = checkpoint(file).config(), open_source(folder).skeleton(torch.float32).config
    for key in CONFIG_KEYS:
        if hasattr(theirs, key):
            want = {"mistral": "llama"}.get(getattr(theirs, key)) if key == "model_type" else None
            want = want or getattr(theirs, key)  # a Mistral is written as (and served as) llama
            # the metadata's floats are float32
            assert getattr(ours, key, None) == (pytest.approx(want, rel=1e-7) if isinstance(want, float) else want), key
    model = open_source(file).skeleton(torch.float32)
    reference = open_source(folder).skeleton(torch.float32)
    # the rotary frequencies (Llama 3's from the file's divisors, Phi-3's longrope from its factors) as the folder's
    tables = dict(reference.model.rotary_emb.named_buffers())
    assert tables and all("inv_freq" in name for name in tables)
    for name, t in model.model.rotary_emb.named_buffers():
        assert torch.allclose(t, tables[name], rtol=1e-6, atol=0), name
    files, folder_files = checkpoint(file).tensors(ours.num_hidden_layers), TensorFiles(folder)
    params = dict(model.named_parameters())
    files.expect({name: p.shape for name, p in params.items()})
    assert set(files.meta) == set(params)
    for name in params:
        # exact but for Gemma's norms, stored as float32(1 + w): w back to within an ulp of 1
        assert torch.allclose(files.get(name), folder_files.get(name).float(), rtol=0, atol=1e-7), name


@pytest.mark.parametrize("weights", ["int8"])
def test_served_with_the_folders_greedy_ids_at_every_draft_length(pair, weights):
    folder, file = pair

    def ids(path, k):
        config = EngineConfig(checkpoint=str(path), device="cpu", max_slots=4, max_seq_len=256, weights=weights)
        with closing(Engine.from_config(config)) as e:
            return [tokens_of(o) for o in run(e, PROMPTS, max_tokens=12, num_draft_tokens=k)]

    for k in (0, 3):
        assert ids(file, k) == ids(folder, k), k
