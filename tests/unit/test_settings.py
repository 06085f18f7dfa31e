"""engine/settings.py: every "auto" resolved once, from the config and the checkpoints' config.json alone."""

import shutil

import pytest
import torch
from transformers import AutoConfig

from specgram.config import EngineConfig
from specgram.engine.settings import INT4_COPY_PARAMS, resolve
from specgram.errors import ModelLoadError
from specgram.model import families, kernels
from specgram.model.choice import int8_form


@pytest.fixture
def config_only(tiny_ckpt, tmp_path):
    """A checkpoint folder holding its config.json and nothing else: resolving must not need the weights."""
    shutil.copy(tiny_ckpt / "config.json", tmp_path / "config.json")
    return str(tmp_path)


def test_auto_resolves_to_the_native_forward_and_the_shared_int8_copy(lib, config_only):
    s = resolve(EngineConfig(checkpoint=config_only))
    assert s.device == torch.device("cpu") and s.dtype == torch.float32
    assert (s.target.kind, s.target.weights, s.target.kv_dtype, s.target.lib) == ("native", "auto", "auto", lib)
    assert s.draft is None and s.drafter == "ngram" and s.prefix_cache  # draft_quantization's default: none
    s = resolve(EngineConfig(checkpoint=config_only, draft_quantization="auto"))  # the served model's setting
    d = s.draft
    assert (d.source, d.quantized, d.shares_cache, d.forward.kind, d.forward.weights) == (
        "target",
        "native",
        True,
        "native",
        int8_form(lib, target=False),
    )
    assert d.forward.kv_dtype == "auto" and d.dtype == torch.float32
    assert s.drafter == "draft_model" and s.prefix_cache


def test_a_target_of_a_billion_matmul_weights_drafts_with_an_int4_copy(lib, config_only, tmp_path):
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    E, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    D = E // cfg["num_attention_heads"]
    small = layers * (E * D * (2 * cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) + 3 * E * inter)
    assert families.matmul_params(AutoConfig.from_pretrained(config_only)) == small + vocab * E
    assert resolve(EngineConfig(checkpoint=config_only, draft_quantization="auto")).draft.forward.weights == int8_form(
        lib, target=False
    )
    # the same shapes with a vocabulary that takes the head past the threshold: only the counted weights matter
    cfg["vocab_size"] = -(-(INT4_COPY_PARAMS - small) // E)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = resolve(EngineConfig(checkpoint=config_only, draft_quantization="auto"))
    assert (s.draft.source, s.draft.shares_cache, s.draft.forward.weights) == ("target", True, "int4")
    cfg["vocab_size"] -= 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve(EngineConfig(checkpoint=config_only, draft_quantization="auto")).draft.forward.weights == int8_form(
        lib, target=False
    )


@pytest.mark.parametrize(
    "settings, target, draft, drafter, prefix",
    [
        (dict(linear="torch"), ("torch", "auto"), None, "ngram", False),
        (dict(linear="torch", prefix_cache="on"), ("torch", "auto"), None, "ngram", True),
        (dict(prefix_cache="off"), ("native", "auto"), None, "ngram", False),
        (dict(weights="int8", draft_quantization="auto"), ("native", "int8*"), None, "ngram", True),  # an int8 target
        (dict(linear="torch", draft_quantization="auto"), ("torch", "auto"), None, "ngram", False),
        (
            dict(linear="torch", draft_quantization="int8"),
            ("torch", "auto"),
            ("target", "torch", False),
            "draft_model",
            False,
        ),
        (
            dict(cuda_graphs=True, draft_quantization="int8"),
            ("torch", "auto"),
            ("target", "torch", False),
            "draft_model",
            False,
        ),
        (
            dict(drafter="grammar", draft_quantization="auto"),
            ("native", "auto"),
            ("target", "native", True),
            "grammar",
            True,
        ),
    ],
)
def test_each_auto_resolves_by_the_other_settings(lib, config_only, settings, target, draft, drafter, prefix):
    s = resolve(EngineConfig(checkpoint=config_only, **settings))
    weights = int8_form(lib) if target[1] == "int8*" else target[1]
    assert (s.target.kind, s.target.weights) == (target[0], weights)
    assert (None if s.draft is None else (s.draft.source, s.draft.quantized, s.draft.shares_cache)) == draft
    assert s.drafter == drafter and s.prefix_cache == prefix
    assert s.target.static_width == (settings.get("cuda_graphs", False) and 9)


def test_a_draft_checkpoint_is_its_own_model_with_its_own_cache(lib, config_only, tiny_ckpt):
    plain = resolve(EngineConfig(checkpoint=config_only, draft_checkpoint=str(tiny_ckpt), draft_dtype="bf16"))
    d = plain.draft
    assert (d.source, d.quantized, d.shares_cache, d.forward.kind, d.dtype) == (
        "checkpoint",
        "none",
        False,
        "native",
        torch.bfloat16,
    )
    named = EngineConfig(checkpoint=config_only, draft_checkpoint=str(tiny_ckpt), draft_quantization="int8")
    copy = resolve(named).draft
    assert (copy.quantized, copy.shares_cache, copy.forward.kv_dtype) == ("native", False, "bfloat16")


def test_without_kernels_everything_falls_back_to_pytorch(config_only, monkeypatch):
    monkeypatch.setattr(kernels, "load", lambda: None)
    s = resolve(EngineConfig(checkpoint=config_only, draft_quantization="auto"))
    assert s.target.kind == "torch" and s.draft is None and s.drafter == "ngram" and not s.prefix_cache
    with pytest.raises(ModelLoadError, match="native CPU forward does not run here: its kernels are not available"):
        resolve(EngineConfig(checkpoint=config_only, linear="native"))
    with pytest.raises(ModelLoadError, match="draft_quantization auto found no draft model"):
        resolve(EngineConfig(checkpoint=config_only, drafter="draft_model", draft_quantization="auto"))
    with pytest.raises(ModelLoadError, match="drafter 'draft_model' needs a draft model, and none is configured"):
        resolve(EngineConfig(checkpoint=config_only, drafter="draft_model"))


def test_a_checkpoint_it_cannot_read_is_one_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve(EngineConfig(checkpoint=str(tmp_path / "missing")))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match="model_type 'bert'"):
        resolve(EngineConfig(checkpoint=str(tmp_path)))
