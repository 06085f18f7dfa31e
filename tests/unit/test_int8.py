"""Int8 weight-only matmuls on the native kernels (model/int8.py, gemm.c's int8 product): the quantization, the
product against a float64 reference of the same quantized weights and its bitwise batch invariance; an int8
model's logits bitwise batch- and width-invariant and close to fp32's; an int8 target's greedy output the same
with speculation on or off; the int8 native draft copy (weight-only, VNNI turned off; the int8-dynamic copy:
test_int8_dynamic.py) drafting for an fp32 target without changing its output; and the settings - for each ISA's
build of the kernels that this CPU runs."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.settings import resolve
from specgram.errors import ModelLoadError
from specgram.model import kernels
from specgram.model.choice import choose_for
from specgram.model.int8 import BLOCKS, DYNAMIC, dequantize_rows, quantize_rows
from specgram.model.linear import NativeLinear
from specgram.model.runner import ModelRunner
from specgram.request import SamplingParams

from .helpers import PROMPTS, assert_rows_bitwise_independent, logits_against, run, tokens_of
from .kernel_cases import LINEAR_SHAPES, PREFILL_ROWS, assert_batch_invariant
from .tiny import build_model, save_checkpoint

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")

REL_TOL = 1e-5  # fp32 accumulation against float64, relative to the largest output


def test_quantization_is_symmetric_per_output_row():
    torch.manual_seed(0)
    w = torch.randn(70, 33) * torch.logspace(-3, 1, 70)[:, None]  # rows of very different magnitude
    w[5] = 0  # a row of zeros
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (70,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.equal(scale, w.abs().amax(1) / 127)
    nonzero = [i for i in range(70) if i != 5]
    assert torch.equal(q[nonzero].abs().amax(1), torch.full((69,), 127, dtype=torch.int8))  # each row's max -> 127
    assert scale[5] == 0 and not q[5].any()
    err = (dequantize_rows(q, scale) - w).abs()
    assert bool((err <= scale[:, None] * 0.5 * (1 + 1e-6)).all())  # within half a step of its row
    assert torch.equal(quantize_rows(w.to(torch.bfloat16))[0], quantize_rows(w.to(torch.bfloat16).float())[0])


@pytest.mark.parametrize("n,k,bias", LINEAR_SHAPES)
def test_int8_linear_matches_its_quantized_weights_and_is_batch_invariant(lib, n, k, bias):
    torch.manual_seed(n + k)
    w = torch.randn(n, k) * 0.05
    b = torch.randn(n) if bias else None
    lin = NativeLinear(w, b, torch.int8, lib)
    assert lin.packed.dtype == torch.int8 and lin.packed.shape == (-(-n // 32), k, 32)
    q, scale = quantize_rows(w)
    x = torch.randn(PREFILL_ROWS, k)
    full = assert_batch_invariant(lin, x)
    ref = (x.double() @ q.double().T) * scale.double()
    if b is not None:
        ref += b.double()
    assert ((full.double() - ref).abs().max() / ref.abs().max()).item() < REL_TOL


def test_int8_linear_is_close_to_the_float_weights(lib):
    torch.manual_seed(1)
    w, x = torch.randn(256, 512) * 0.05, torch.randn(9, 512)
    got, exact = NativeLinear(w, None, torch.int8, lib)(x), x @ w.T
    rel = ((got - exact).norm() / exact.norm()).item()
    assert 1e-3 < rel < 2e-2  # lossy (Gaussian rows, per-row int8: ~0.8% of the norm), but close


def _int8_runner(model, slots: int = 4, positions: int = 96) -> ModelRunner:
    runner = ModelRunner(model, slots, positions, choose_for(model, linear="native", weights="int8"))
    assert runner.weights == "int8" and runner.native is not None
    assert all(lin.packed.dtype == torch.int8 for lin in runner.linear_layers())  # the lm_head's too
    return runner


@pytest.mark.parametrize("tied", [False, True])
def test_int8_model_rows_are_bitwise_independent_of_batch_and_width(lib, tied):
    runner = _int8_runner(build_model("llama", seed=2, tie_word_embeddings=tied))
    assert runner.native.lib is lib
    assert_rows_bitwise_independent(runner)


@pytest.mark.parametrize(
    "init,max_median,max_rel,min_agree",
    [
        (0.3, 0.08, 0.25, 0.8),  # the tests' tiny model: large weights, a high-gain random network
        (0.1, 0.04, 0.06, 0.9),  # weights at a third of that: errors grow less through the layers
    ],
)
def test_int8_logits_are_close_to_fp32(lib, init, max_median, max_rel, min_agree):
    model = build_model("llama", seed=1, init=init)
    fp32, int8 = ModelRunner(model, 2, 96, choose_for(model, linear="native")), _int8_runner(model, 2)
    rel, agree = logits_against(fp32, int8)
    assert 0 < rel.median().item() < max_median and rel.max().item() < max_rel, rel
    assert agree >= min_agree, agree  # the same top-1 token at most positions


@pytest.mark.parametrize("vnni", [True, False])
def test_int8_target_greedy_output_is_the_same_speculating_or_not_batched_or_alone(
    lib, make_engine, tmp_path, monkeypatch, vnni
):
    """weights int8: int16 activations where the CPU has VNNI (runner weights int8-dynamic), else fp32 ones."""
    if vnni and not kernels.has_vnni(lib):
        pytest.skip("this CPU lacks VNNI for this build")
    if not vnni:
        monkeypatch.setenv(kernels.VNNI_ENV, "0")
    draft = save_checkpoint(tmp_path / "draft", seed=11)  # other weights: its drafts are mostly wrong
    with closing(make_engine(weights="int8", draft_checkpoint=str(draft))) as engine:
        assert engine.target.weights == (BLOCKS if vnni else "int8") and engine.target.native.lib is lib
        alone = [tokens_of(run(engine, [p], max_tokens=24)[0]) for p in PROMPTS]
        assert [tokens_of(o) for o in run(engine, PROMPTS, max_tokens=24)] == alone
        for k, drafter in ((1, "ngram"), (4, "ngram"), (3, "draft_model")):
            spec = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=k, drafter=drafter)
            assert [tokens_of(o) for o in spec] == alone, (k, drafter)


def test_the_native_int8_draft_copy_drafts_for_an_fp32_target_without_changing_its_output(
    lib, make_engine, monkeypatch
):
    monkeypatch.setenv(kernels.VNNI_ENV, "0")  # the weight-only copy (int8-dynamic on VNNI: test_int8_dynamic.py)
    with closing(make_engine(draft_quantization="int8")) as engine:
        copy = engine.drafters["draft_model"].runner
        assert engine.target.weights == "auto" and copy.weights == "int8" and copy.native.lib is lib
        assert copy.model is engine.target.model and copy.cache is engine.target.cache  # shared model, shared cache
        alone = [tokens_of(run(engine, [p], max_tokens=24)[0]) for p in PROMPTS]
        spec = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=3, drafter="draft_model")
    assert [tokens_of(o) for o in spec] == alone
    drafted = sum(o[-1].spec.drafted for o in spec)
    accepted = sum(o[-1].spec.accepted for o in spec)
    assert drafted > 0 and accepted / drafted > 0.5  # a close copy of the target: most drafts accepted


def test_the_target_copy_shares_the_target_cache_reads_no_prompt_and_leaves_the_target_kv_as_without_drafts(
    lib, make_engine
):
    """The copy attends to the target's K and V: admission feeds it nothing, a proposal feeds the last committed
    token (and the forced prefix, and its drafts), and after the run every committed position of the target's
    cache holds bitwise what a run without speculation wrote there (the verify overwrote what the copy wrote)."""
    prompt, n_out = PROMPTS[0], 24
    with closing(make_engine(draft_quantization="int8")) as plain:
        alone = tokens_of(run(plain, [prompt], max_tokens=n_out, ignore_eos=True)[0])
        k_ref, v_ref = plain.target.cache.k.clone(), plain.target.cache.v.clone()
        n_prompt = len(plain.make_request(SamplingParams(), text=prompt).prompt_ids)
    with closing(make_engine(draft_quantization="int8")) as engine:
        drafter = engine.drafters["draft_model"]
        assert drafter.shares_cache and not drafter.reads_prompts
        fed = []
        forward_rows = drafter.runner.forward_rows
        drafter.runner.forward_rows = lambda rows, *a, **kw: (
            fed.append(list(map(len, rows))) or forward_rows(rows, *a, **kw)
        )
        spec = run(engine, [prompt], max_tokens=n_out, ignore_eos=True, num_draft_tokens=3, drafter="draft_model")
        assert tokens_of(spec[0]) == alone and spec[0][-1].spec.accepted > 0
        assert fed and max(max(f) for f in fed) == 1  # never a prompt or a catch-up: one token a row
        n = n_prompt + n_out - 1  # committed tokens with K and V in the cache
        cache = engine.target.cache
        assert torch.equal(cache.k[..., :n], k_ref[..., :n]) and torch.equal(cache.v[:, :, :, :n], v_ref[:, :, :, :n])


def test_without_native_kernels_the_int8_draft_is_torch_dynamic_quantization(make_engine, monkeypatch):
    monkeypatch.setattr(kernels, "load", lambda: None)  # no ISA it runs / no compiler
    with closing(make_engine(draft_quantization="int8")) as engine:
        copy = engine.drafters["draft_model"].runner
    assert engine.target.linear_kind == "torch" and copy.linear_kind == "torch" and copy.weights == "auto"
    assert "quantized" in type(copy.model.model.layers[0].self_attn.q_proj).__module__
    with pytest.raises(ModelLoadError, match="weights int8 runs on the native CPU forward only"):
        make_engine(weights="int8")


def test_draft_quantization_auto_is_the_int8_copy_or_a_named_draft_in_int4(lib, make_engine, tiny_ckpt, monkeypatch):
    with closing(make_engine(draft_quantization="auto")) as engine:
        assert engine.drafters["draft_model"].runner.weights == (DYNAMIC if kernels.has_vnni(lib) else "int8")
        req = engine.make_request(SamplingParams(), text="hi")
        assert req.params.drafter == "draft_model"  # drafter auto: the loaded draft model
    with closing(make_engine(draft_quantization="auto", weights="int8")) as engine:
        assert "draft_model" not in engine.drafters  # an int8 target: its copy would be itself
        assert engine.make_request(SamplingParams(), text="hi").params.drafter == "ngram"
    with closing(make_engine(draft_quantization="auto", draft_checkpoint=str(tiny_ckpt))) as engine:
        draft = engine.drafters["draft_model"].runner  # the named draft: int4 on the native forward
        assert draft.weights == "int4" and not draft.shares_cache
    monkeypatch.setenv(kernels.VNNI_ENV, "0")
    with closing(make_engine(draft_quantization="auto", draft_checkpoint=str(tiny_ckpt))) as engine:
        assert engine.drafters["draft_model"].runner.weights == "int4"  # without VNNI too (gemm_i4.c's own loops)
    monkeypatch.setattr(kernels, "load", lambda: None)
    with closing(make_engine(draft_quantization="auto")) as engine:
        assert "draft_model" not in engine.drafters  # the PyTorch forward: no int8 copy
    with pytest.raises(ModelLoadError, match="draft_quantization auto found no draft model"):
        make_engine(draft_quantization="auto", drafter="draft_model")


def test_the_weights_setting_is_validated(tiny_ckpt):
    ok = EngineConfig(checkpoint=str(tiny_ckpt), weights="int8")
    assert ok.weights == "int8" and EngineConfig(checkpoint=str(tiny_ckpt)).weights == "auto"
    with pytest.raises(ModelLoadError, match="weights must be one of auto, int8, int4"):
        EngineConfig(checkpoint=str(tiny_ckpt), weights="int2")
    for bad, why in ((dict(linear="torch"), "linear is torch"), (dict(cuda_graphs=True), "cuda_graphs is on")):
        with pytest.raises(ModelLoadError, match=f"weights int8 runs on the native CPU forward only.*{why}"):
            resolve(EngineConfig(checkpoint=str(tiny_ckpt), weights="int8", **bad))
    with pytest.raises(
        ModelLoadError, match="weights must be one of auto, int8, int4, int8-dynamic, int8-dynamic8, int8-blocks, gguf"
    ):
        ModelRunner(m := build_model("llama", seed=4), 2, 32, choose_for(m, weights="fp8"))
    with pytest.raises(ModelLoadError, match="native CPU forward only.*linear is torch"):
        ModelRunner(m := build_model("llama", seed=4), 2, 32, choose_for(m, linear="torch", weights="int8"))
