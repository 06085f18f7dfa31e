"""Int8 weights times activations quantized to int8 per row and block of 256 inputs (kernels/gemm_i8b.c, runner
weights "int8-blocks": what `weights int8` serves a target as where the CPU has VNNI): the product bitwise equal to
int8.reference_blocks and bitwise batch-invariant; its error against fp32 activations, and against one scale per row
where a channel is an outlier; such a model's logits bitwise batch- and width-invariant and close to fp32's; the
engine's target in int8 on it, exact with itself at every draft length, while its int8 draft copy keeps int16
activations - for each ISA's build that this CPU runs, skipped where it lacks that build's VNNI."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from specgram.model import int8, kernels
from specgram.model.choice import choose_for
from specgram.model.kernels import abi
from specgram.model.linear import NativeLinear, pack_k4
from specgram.model.runner import ModelRunner

from .helpers import PROMPTS, assert_rows_bitwise_independent, logits_against, run, tokens_of
from .kernel_cases import LINEAR_SHAPES, PREFILL_ROWS, assert_batch_invariant, outlier_rows, vnni_builds
from .tiny import build_model

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")

ACTIVATIONS = int8.ACTIVATIONS[int8.BLOCKS]


@pytest.mark.parametrize("n,k,bias", [*LINEAR_SHAPES, (70, 2100, True), (40, 300, False)])
def test_the_product_is_bitwise_its_reference_and_batch_invariant(vnni, n, k, bias):
    """Beside the shared shapes: several blocks with a short last one (2100 inputs), a partial second (300)."""
    torch.manual_seed(n + k)
    w = torch.randn(n, k) * 0.05
    w[1] = 0  # a weight row of zeros: scale 0
    b = torch.randn(n) if bias else None
    lin = NativeLinear(w, b, torch.int8, vnni, activations=ACTIVATIONS)
    q, scale = int8.quantize_rows(w)
    assert lin.descriptor().kind == abi.LIN_I8B and lin.colsum is None and torch.equal(lin.scale, scale)
    assert lin.packed.dtype == torch.uint8 and torch.equal(lin.packed.view(torch.int8) ^ -128, pack_k4(q))
    x = outlier_rows(PREFILL_ROWS, k, seed=n)
    if k > 256:
        x[7, :256] = 0  # a zero block in a row that is not zero
    full = assert_batch_invariant(lin, x)
    assert torch.equal(full, int8.reference_blocks(x, q, scale, b))
    assert not full[3].any() if b is None else torch.equal(full[3], b)  # a zero row: 0 (+ bias)


def test_the_two_isa_builds_give_the_same_bits():
    libs = vnni_builds()
    if len(libs) < 2:
        pytest.skip("needs both ISA builds with VNNI")
    torch.manual_seed(3)
    w, b, x = torch.randn(300, 600) * 0.05, torch.randn(300), outlier_rows(20, 600, seed=3)
    a, c = (NativeLinear(w, b, torch.int8, lib, activations=ACTIVATIONS)(x) for lib in libs)
    assert torch.equal(a, c)


def test_the_product_is_close_to_the_float_product_and_keeps_an_outlier_to_its_block(vnni):
    torch.manual_seed(1)
    w, x = torch.randn(256, 2048) * 0.05, torch.randn(9, 2048)
    q, scale = int8.quantize_rows(w)
    own = x @ int8.dequantize_rows(q, scale).T  # the int8 weights with fp32 activations
    lin = NativeLinear(w, None, torch.int8, vnni, activations=ACTIVATIONS)
    rel = lambda y, ref: ((y - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(lin(x), own) < 0.02  # measured 0.007: a step of max / 127 per block
    x[:, 5] = 60.0  # one outlier channel, in the first of 8 blocks
    own = x @ int8.dequantize_rows(q, scale).T
    per_row = NativeLinear(w, None, torch.int8, vnni, activations="int8")  # gemm_i8a8.c: one int8 scale per row
    blocks, row = rel(lin(x), own), rel(per_row(x), own)
    assert blocks < row / 2, (blocks, row)  # measured 0.029 against 0.082


def _runner(model, slots: int = 4, positions: int = 96) -> ModelRunner:
    runner = ModelRunner(model, slots, positions, choose_for(model, linear="native", weights=int8.BLOCKS))
    assert runner.weights == int8.BLOCKS and runner.native is not None
    assert all(lin.descriptor().kind == abi.LIN_I8B for lin in runner.linear_layers())
    return runner


@pytest.mark.parametrize("tied", [False, True])
def test_a_model_rows_are_bitwise_independent_of_batch_and_width(vnni, tied):
    runner = _runner(build_model("llama", seed=2, tie_word_embeddings=tied))
    assert runner.native.lib is vnni
    assert_rows_bitwise_independent(runner)


def test_the_logits_are_close_to_fp32(vnni):
    model = build_model("llama", seed=1, init=0.1)
    fp32 = ModelRunner(model, 2, 96, choose_for(model, linear="native"))
    rel, agree = logits_against(fp32, _runner(model, 2))
    # measured: median 0.031, max 0.050, top-1 97% (int16 per row: 0.023, 0.037, 98%)
    assert 0 < rel.median().item() < 0.05 and rel.max().item() < 0.08 and agree >= 0.9, (rel, agree)


def test_an_int8_target_serves_int8_blocks_exact_with_itself_and_its_copy_keeps_int16(vnni, make_engine):
    with closing(make_engine(weights="int8")) as engine:
        assert engine.target.weights == int8.BLOCKS and engine.target.native.lib is vnni
        alone = [tokens_of(run(engine, [p], max_tokens=24)[0]) for p in PROMPTS]
        assert [tokens_of(o) for o in run(engine, PROMPTS, max_tokens=24)] == alone
        for k in (1, 3, -1):
            assert [tokens_of(o) for o in run(engine, PROMPTS, max_tokens=24, num_draft_tokens=k)] == alone, k
    with closing(make_engine(draft_quantization="int8")) as engine:
        assert engine.target.weights == "auto" and engine.drafters["draft_model"].runner.weights == int8.DYNAMIC
