"""A bfloat16 KV cache on the native forward (ModelRunner kv_dtype, engine setting kv_cache_dtype, the int8 draft
copy's cache): its rows bitwise batch-invariant and its logits close to a float32 cache's; an engine serving with
it gives the same greedy tokens alone, batched and speculating; the setting validated - for each ISA's build of
the kernels that this CPU runs. (The attention kernel on a bfloat16 cache against a float32 one of the same values:
test_native.py; the whole stack against the kernels one by one: test_forward_stack.py.)"""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.settings import resolve
from specgram.errors import ModelLoadError
from specgram.model import kernels
from specgram.model.choice import choose_for
from specgram.model.runner import ModelRunner

from .helpers import PROMPTS, assert_rows_bitwise_independent, logits_against, run, tokens_of
from .tiny import build_model

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")


def test_a_bfloat16_cache_is_batch_invariant_and_close_to_float32(lib):
    model = build_model("llama", seed=6)
    exact = ModelRunner(model, 4, 96, choose_for(model, linear="native"))
    half = ModelRunner(model, 4, 96, choose_for(model, linear="native", kv_dtype="bfloat16"))
    assert half.cache.k.dtype == half.cache.v.dtype == torch.bfloat16 and half.dtype == torch.float32
    assert_rows_bitwise_independent(half)
    rel, top1 = logits_against(exact, half)
    assert 0 < rel.max().item() < 0.05 and top1 >= 0.95  # lossy (K and V rounded to 8 bits), but slightly
    with pytest.raises(ModelLoadError, match="kv_cache_dtype bfloat16 runs on the native CPU forward only"):
        ModelRunner(model, 2, 32, choose_for(model, linear="torch", kv_dtype="bfloat16"))
    with pytest.raises(ModelLoadError, match="kv_dtype must be"):
        ModelRunner(model, 2, 32, choose_for(model, kv_dtype="fp8"))


def test_an_engine_with_a_bfloat16_cache_gives_the_same_tokens_alone_batched_and_speculating(lib, make_engine):
    with closing(make_engine(kv_cache_dtype="bfloat16", draft_quantization="int8")) as engine:
        copy = engine.drafters["draft_model"].runner
        assert engine.target.cache.k.dtype == torch.bfloat16 and engine.target.native.lib is lib
        assert copy.cache.k.dtype == torch.bfloat16 and copy.model is engine.target.model
        alone = [tokens_of(run(engine, [p], max_tokens=24)[0]) for p in PROMPTS]
        assert [tokens_of(o) for o in run(engine, PROMPTS, max_tokens=24)] == alone
        for k, drafter in ((4, "ngram"), (3, "draft_model")):
            spec = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=k, drafter=drafter)
            assert [tokens_of(o) for o in spec] == alone, (k, drafter)


@pytest.mark.parametrize("kv", ["auto", "bfloat16"])
def test_the_target_int8_copy_uses_the_target_cache_and_another_checkpoint_copy_a_bfloat16_one(
    lib, make_engine, tiny_ckpt, kv
):
    with closing(make_engine(draft_quantization="int8", kv_cache_dtype=kv)) as engine:
        assert engine.target.cache.k.dtype == (torch.bfloat16 if kv == "bfloat16" else torch.float32)
        assert engine.drafters["draft_model"].runner.cache is engine.target.cache
        alone = [tokens_of(run(engine, [p], max_tokens=16)[0]) for p in PROMPTS]
        spec = run(engine, PROMPTS, max_tokens=16, num_draft_tokens=3, drafter="draft_model")
        assert [tokens_of(o) for o in spec] == alone
    with closing(make_engine(draft_quantization="int8", draft_checkpoint=str(tiny_ckpt))) as engine:
        copy = engine.drafters["draft_model"]
        assert not copy.shares_cache and copy.runner.cache.k.dtype == torch.bfloat16
        assert engine.target.cache.k.dtype == torch.float32


def test_the_kv_cache_dtype_setting_is_validated(tiny_ckpt):
    assert EngineConfig(checkpoint=str(tiny_ckpt)).kv_cache_dtype == "auto"
    assert EngineConfig(checkpoint=str(tiny_ckpt), kv_cache_dtype="bfloat16").kv_cache_dtype == "bfloat16"
    with pytest.raises(ModelLoadError, match="kv_cache_dtype must be one of auto, bfloat16"):
        EngineConfig(checkpoint=str(tiny_ckpt), kv_cache_dtype="fp8")
    for bad in (dict(linear="torch"), dict(cuda_graphs=True)):
        with pytest.raises(ModelLoadError, match="kv_cache_dtype bfloat16 runs on the native CPU forward only"):
            resolve(EngineConfig(checkpoint=str(tiny_ckpt), kv_cache_dtype="bfloat16", **bad))
