"""Int8 weights times activations quantized per row to int16 or int8 (kernels/gemm_i8a8.c, weights "int8-dynamic" /
"int8-dynamic8"): the product bitwise equal to a pure-torch reference of the same integer arithmetic and float order,
and bitwise batch-invariant; the two ISA builds equal; the VNNI decision and its override; such a model's logits
bitwise batch- and width-invariant and close to fp32's; and the int8 draft copy being int8-dynamic where the CPU has
VNNI, drafting for an fp32 target without changing its output - for each ISA's build of the kernels that this
CPU runs (skipped where it lacks that build's VNNI)."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from specgram.config import EngineConfig
from specgram.errors import ModelLoadError
from specgram.model import kernels
from specgram.model.choice import choose_for
from specgram.model.int8 import ACTIVATIONS, DYNAMIC, DYNAMIC8, column_sums, quantize_rows
from specgram.model.linear import NativeLinear, pack_k4
from specgram.model.runner import ModelRunner

from .helpers import PROMPTS, assert_rows_bitwise_independent, logits_against, run, tokens_of
from .kernel_cases import LINEAR_SHAPES, PREFILL_ROWS, assert_batch_invariant, outlier_rows, vnni_builds
from .tiny import build_model

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, activations: str) -> torch.Tensor:
    """gemm_i8a8.c's arithmetic in torch: the rows quantized as documented there, each digit's products with the
    int8 weights summed exactly (int64), then the fp32 operations in the header's order."""
    q, wscale = quantize_rows(w)
    levels = 127.0 if activations == "int8" else 32767.0
    amax = x.abs().amax(dim=1)
    xs = amax / levels
    inv = torch.where(amax > 0, torch.full_like(amax, levels) / amax, torch.zeros_like(amax))  # not levels / amax:
    xq = torch.round(x * inv[:, None]).clamp(-levels, levels).long()  # torch computes that as reciprocal * L
    colsum, qT = q.sum(1).long(), q.long().T
    if activations == "int8":
        acc = ((xq + 128) @ qT - 128 * colsum).float()
    else:
        hi, lo = (xq + 32768) // 256, (xq + 32768) % 256  # the two base-256 digits, each a u8
        acc = ((hi @ qT - 128 * colsum).float() * 256) + (lo @ qT).float()
    y = (acc * wscale) * xs[:, None]
    return y if b is None else y + b


@pytest.mark.parametrize("activations", ["int16", "int8"])
@pytest.mark.parametrize("n,k,bias", LINEAR_SHAPES)
def test_quantized_activations_are_bitwise_their_integer_reference_and_batch_invariant(vnni, n, k, bias, activations):
    torch.manual_seed(n + k)
    w = torch.randn(n, k) * 0.05
    w[1] = 0  # a weight row of zeros: scale 0
    b = torch.randn(n) if bias else None
    lin = NativeLinear(w, b, torch.int8, vnni, activations=activations)
    q, scale = quantize_rows(w)
    assert lin.packed.dtype == torch.int8 and lin.packed.shape == (-(-n // 32), -(-k // 4), 32, 4)
    assert torch.equal(lin.scale, scale) and torch.equal(lin.colsum, q.sum(1).int())
    x = outlier_rows(PREFILL_ROWS, k, seed=n)
    full = assert_batch_invariant(lin, x)
    assert torch.equal(full, reference(x, w, b, activations))
    assert not full[3].any() if b is None else torch.equal(full[3], b)  # a zero row: 0 (+ bias)


def test_the_call_follows_buffers_that_move(vnni):
    torch.manual_seed(5)
    w, x = torch.randn(70, 40) * 0.05, torch.randn(3, 40)
    lin = NativeLinear(w, torch.randn(70), torch.int8, vnni, activations="int16")
    before, ptr = lin(x), lin.packed.data_ptr()
    lin.share_memory()  # Module._apply: new storage for every buffer
    assert lin.packed.data_ptr() != ptr and torch.equal(lin(x), before)


def test_pack_k4_layout():
    q = torch.randint(-127, 128, (37, 10), dtype=torch.int8)
    p = pack_k4(q)
    assert p.shape == (2, 3, 32, 4) and p.is_contiguous()
    for b, k4, j, kk in ((0, 0, 0, 0), (1, 2, 4, 1), (0, 1, 31, 3), (1, 0, 3, 2)):
        assert p[b, k4, j, kk] == q[32 * b + j, 4 * k4 + kk]
    assert not p[1, :, 5:].any() and not p[:, 2, :, 2:].any()  # zero past N = 37 and past K = 10
    assert torch.equal(column_sums(q), q.sum(1).int())


def test_the_two_isa_builds_give_the_same_bits():
    libs = vnni_builds()
    if len(libs) < 2:
        pytest.skip("needs both ISA builds with VNNI")
    torch.manual_seed(3)
    w, b, x = torch.randn(300, 258) * 0.05, torch.randn(300), outlier_rows(20, 258, seed=3)
    for activations in ("int16", "int8"):
        a, c = (NativeLinear(w, b, torch.int8, lib, activations=activations)(x) for lib in libs)
        assert torch.equal(a, c)  # integer sums and elementwise fp32 only: nothing depends on the vector width


def test_quantized_activations_are_close_to_the_float_product(vnni):
    torch.manual_seed(1)
    w, x = torch.randn(256, 512) * 0.05, torch.randn(9, 512)
    x[:, 7] *= 50  # an outlier channel, as language models' inputs have
    exact = x @ w.T
    rel = {
        act: ((NativeLinear(w, None, torch.int8, vnni, activations=act)(x) - exact).norm() / exact.norm()).item()
        for act in ("float32", "int16", "int8")
    }
    assert 1e-3 < rel["float32"] < 2e-2  # the int8 weights' own error
    assert abs(rel["int16"] - rel["float32"]) < 0.05 * rel["float32"]  # int16 activations add next to nothing
    assert rel["int8"] > 1.5 * rel["float32"]  # int8 ones, a step of max / 127, add much


def test_the_vnni_decision_follows_the_cpu_flags_and_the_override(lib, monkeypatch):
    monkeypatch.delenv(kernels.VNNI_ENV, raising=False)
    flag = kernels.VNNI_FLAGS[lib.isa]
    for flags, expected in (({flag}, True), (set(kernels.VNNI_FLAGS.values()) - {flag}, False), (set(), False)):
        monkeypatch.setattr(kernels, "cpu_flags", lambda f=flags: frozenset(f))
        assert kernels.has_vnni(lib) is expected
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({flag}))
    for value, expected in (("0", False), (" 0 ", False), ("1", True), ("", True)):
        monkeypatch.setenv(kernels.VNNI_ENV, value)
        assert kernels.has_vnni(lib) is expected
    assert lib.specgram_i8a8_built() == 1  # gcc >= 11 (or the AVX-512 build) compiles the product

    class BuiltWithout:  # the AVX2 library as gcc before 11 builds it: no product
        isa = lib.isa

        @staticmethod
        def specgram_i8a8_built() -> int:
            return 0

    monkeypatch.setenv(kernels.VNNI_ENV, "1")
    assert not kernels.has_vnni(BuiltWithout())
    monkeypatch.setenv(kernels.VNNI_ENV, "0")
    for weights, act in ACTIVATIONS.items():
        with pytest.raises(ValueError, match="VNNI"):
            NativeLinear(torch.randn(32, 8), None, torch.int8, lib, activations=act)
        with pytest.raises(ModelLoadError, match=f"weights {weights} needs VNNI"):
            ModelRunner(m := build_model("llama", seed=4), 2, 32, choose_for(m, linear="native", weights=weights))
    with pytest.raises(ValueError, match="int8 weights"):
        NativeLinear(torch.randn(32, 8), None, torch.float32, lib, activations="int16")
    with pytest.raises(ValueError, match="activations must be"):
        NativeLinear(torch.randn(32, 8), None, torch.int8, lib, activations="int4")


def _quantized_runner(model, weights: str, slots: int = 4, positions: int = 96) -> ModelRunner:
    runner = ModelRunner(model, slots, positions, choose_for(model, linear="native", weights=weights))
    assert runner.weights == weights and runner.native is not None
    assert all(
        lin.activations == ACTIVATIONS[weights] and lin.packed.dtype == torch.int8 for lin in runner.linear_layers()
    )
    return runner


@pytest.mark.parametrize("weights,tied", [(DYNAMIC, False), (DYNAMIC, True), (DYNAMIC8, False)])
def test_quantized_model_rows_are_bitwise_independent_of_batch_and_width(vnni, weights, tied):
    runner = _quantized_runner(build_model("llama", seed=2, tie_word_embeddings=tied), weights)
    assert runner.native.lib is vnni
    assert_rows_bitwise_independent(runner)


@pytest.mark.parametrize(
    "weights,max_median,max_rel,min_agree",
    [
        (DYNAMIC, 0.04, 0.06, 0.9),  # test_int8.py's bounds for int8 weights alone, same model
        (DYNAMIC8, 0.06, 0.12, 0.85),
    ],
)
def test_quantized_logits_are_close_to_fp32(vnni, weights, max_median, max_rel, min_agree):
    model = build_model("llama", seed=1, init=0.1)
    fp32 = ModelRunner(model, 2, 96, choose_for(model, linear="native"))
    quantized = _quantized_runner(model, weights, 2)
    rel, agree = logits_against(fp32, quantized)
    assert 0 < rel.median().item() < max_median and rel.max().item() < max_rel, rel
    assert agree >= min_agree, agree


def test_the_int8_draft_copy_is_int8_dynamic_on_vnni_and_drafts_without_changing_the_output(vnni, make_engine):
    with closing(make_engine(draft_quantization="int8")) as engine:
        copy = engine.drafters["draft_model"].runner
        assert engine.target.weights == "auto" and copy.weights == DYNAMIC and copy.native.lib is vnni
        assert copy.model is engine.target.model and copy.cache is engine.target.cache  # shared model, shared cache
        alone = [tokens_of(run(engine, [p], max_tokens=24)[0]) for p in PROMPTS]
        assert [tokens_of(o) for o in run(engine, PROMPTS, max_tokens=24)] == alone
        spec = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=3, drafter="draft_model")
        spec_alone = [run(engine, [p], max_tokens=24, num_draft_tokens=2, drafter="draft_model")[0] for p in PROMPTS]
    assert [tokens_of(o) for o in spec] == alone and [tokens_of(o) for o in spec_alone] == alone
    drafted = sum(o[-1].spec.drafted for o in spec)
    accepted = sum(o[-1].spec.accepted for o in spec)
    assert drafted > 0 and accepted / drafted > 0.5  # a close copy of the target: most drafts accepted
    with closing(make_engine(draft_quantization="auto")) as engine:
        assert engine.drafters["draft_model"].runner.weights == DYNAMIC


def test_without_vnni_the_int8_draft_copy_is_weight_only(lib, make_engine, monkeypatch):
    monkeypatch.setenv(kernels.VNNI_ENV, "0")
    with closing(make_engine(draft_quantization="int8")) as engine:
        assert engine.drafters["draft_model"].runner.weights == "int8"


@pytest.mark.parametrize("weights", [DYNAMIC, DYNAMIC8])
def test_quantized_activations_are_no_engine_setting(tiny_ckpt, weights):
    with pytest.raises(ModelLoadError, match="weights must be one of auto, int8,"):
        EngineConfig(checkpoint=str(tiny_ckpt), weights=weights)
