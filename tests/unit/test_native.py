"""The native CPU forward (specgram/native.py, kernels/*.c): agreement with transformers, and the batch and
width invariance that makes greedy speculative output equal non-speculative output bitwise - for each ISA's
build of the kernels that this CPU runs (AVX-512, AVX2), each on its own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgram.errors import ModelLoadError
from specgram.model import kernels, reference
from specgram.model.choice import choose, choose_for
from specgram.model.linear import NativeLinear
from specgram.model.runner import ModelRunner

from .kernel_cases import LINEAR_SHAPES, PREFILL_ROWS, assert_batch_invariant
from .tiny import build_model

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")

# transformers' eager float32 forward vs ours: the same math summed in another order
LOGIT_ATOL = 1e-4


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,bias", LINEAR_SHAPES)
def test_linear_matches_torch_and_is_batch_invariant(lib, n, k, bias, weight_dtype):
    torch.manual_seed(0)
    w = torch.randn(n, k) * 0.05
    b = torch.randn(n) if bias else None
    lin = NativeLinear(w, b, weight_dtype, lib)
    x = torch.randn(PREFILL_ROWS, k)
    full = assert_batch_invariant(lin, x)
    ref = F.linear(x, w.to(weight_dtype).float(), b)
    assert (full - ref).abs().max().item() < 1e-4


def _runners(model, **kw):
    return (
        ModelRunner(model, 4, 96, choose_for(model, linear="native", **kw)),
        ModelRunner(model, 4, 96, choose_for(model, linear="torch", **kw)),
    )


@pytest.mark.parametrize(
    "model_type,overrides",
    [
        ("llama", {}),
        ("qwen2", {}),  # q/k/v projections with bias
        ("mistral", {"sliding_window": 8}),  # attention window shorter than the prompt
        ("llama", {"num_key_value_heads": 4}),  # no grouping
        # rotary by a table per position (scaled), and dynamic NTK past 16 positions (frozen at max_seq_len 96)
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
        (
            "llama",
            {
                "max_position_embeddings": 16,
                "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
            },
        ),
    ],
)
def test_forward_matches_transformers(lib, model_type, overrides):
    model = build_model(model_type, seed=1, **overrides)
    native, eager = _runners(model)
    assert native.linear_kind == "native" and eager.linear_kind == "torch" and native.native.lib is lib
    ids = torch.randint(3, 259, (1, 30), generator=torch.Generator().manual_seed(0))
    ref = reference.logits(build_model(model_type, seed=1, **overrides), ids[0].tolist(), 96)  # [30, V]
    prefill = native.forward_rows([ids[0, :20].tolist()], [1], [0], last_only=False)[0]
    decode = native.forward_rows([ids[0, 20:].tolist()], [1], [20], last_only=False)[0]
    got = torch.cat([prefill, decode])
    assert (got - ref).abs().max().item() < LOGIT_ATOL
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_rows_are_bitwise_independent_of_batch_and_width(lib):
    model = build_model("llama", seed=2)
    runner = ModelRunner(model, 4, 96, choose_for(model, linear="native"))
    assert runner.native.lib is lib
    prompt = list(range(10, 40))
    other = list(range(50, 62))
    runner.forward_rows([prompt], [0], [0], last_only=True)
    alone = runner.forward_rows([[7, 8, 9]], [0], [30], last_only=False)[0]  # a verify row of width 3
    one = runner.forward_rows([[7]], [0], [30], last_only=False)[0]  # the same first token, width 1
    assert torch.equal(alone[0], one[0])
    # the same row next to a longer prefill in another slot, and padded to that row's width
    runner.forward_rows([prompt], [0], [0], last_only=True)
    mixed = runner.forward_rows([[7, 8, 9], other], [0, 2], [30, 0], last_only=False)[0]
    assert torch.equal(mixed[:3], alone)
    # prefilling the prompt together with another prompt leaves the row's cache bitwise the same
    runner.forward_rows([prompt, other + other], [0, 3], [0, 0], last_only=True)
    again = runner.forward_rows([[7, 8, 9]], [0], [30], last_only=False)[0]
    assert torch.equal(again, alone)


def test_bfloat16_weights_run_in_float32(lib):
    model = build_model("llama", seed=3).to(torch.bfloat16)
    runner = ModelRunner(model, 2, 64, choose_for(model, linear="native"))
    assert runner.dtype == torch.float32 and runner.cache.k.dtype == torch.float32
    ids = list(range(5, 25))
    with torch.inference_mode():
        ref = model.float()(torch.tensor([ids])).logits[0, -1]  # bf16 weights widened exactly, float32 math
    got = runner.forward_rows([ids], [0], [0], last_only=True)[0]
    assert (got - ref).abs().max().item() < LOGIT_ATOL


def test_kind_selection_and_fallbacks(monkeypatch):
    model = build_model("llama", seed=4)
    cpu, cfg = torch.device("cpu"), model.config
    assert choose(cfg, cpu, torch.float32).kind == "native"
    assert choose(cfg, cpu, torch.float32, linear="torch").kind == "torch"
    assert choose(cfg, cpu, torch.float16).kind == "torch"
    assert choose(cfg, torch.device("meta"), torch.float32).kind == "torch"
    assert choose(build_model("llama", seed=4, hidden_act="gelu").config, cpu, torch.float32).kind == "torch"
    with pytest.raises(ModelLoadError, match="linear must be one of"):
        choose(cfg, cpu, torch.float32, linear="fast")
    with pytest.raises(ModelLoadError, match="does not cover this model .activation 'gelu'"):
        choose(build_model("llama", seed=4, hidden_act="gelu").config, cpu, torch.float32, linear="native")
    # the CUDA-graph path is torch's
    assert ModelRunner(model, 2, 32, choose_for(model, static_width=3)).linear_kind == "torch"
    monkeypatch.setattr(kernels, "load", lambda: None)  # no ISA it runs / no compiler
    assert ModelRunner(model, 2, 32).linear_kind == "torch"
    with pytest.raises(ModelLoadError, match="not available"):
        ModelRunner(model, 2, 32, choose_for(model, linear="native"))


@pytest.mark.parametrize(
    "H,Hkv,window,D", [(9, 3, 0, 64), (9, 3, 6, 64), (4, 4, 0, 64), (10, 2, 0, 64), (24, 1, 5, 64), (6, 2, 0, 20)]
)  # D = 20: partial vectors
def test_attention_of_a_row_equals_its_tokens_alone(lib, H, Hkv, window, D):
    """Tokens of one row attended together (sharing K/V loads, in groups) give bitwise what each gives alone."""
    P, S = 64, 6
    g = torch.Generator().manual_seed(H * 100 + window)
    kc, vc = torch.randn(S, Hkv, D, P, generator=g), torch.randn(S, Hkv, P, D, generator=g)
    widths, starts = [9, 1, 5, 3, 13, 2], [20, 0, 7, 40, 30, 11]  # verify rows, a decode row, prefill chunks
    slots = torch.tensor([s for s, w in enumerate(widths) for _ in range(w)])
    positions = torch.tensor([p + t for p, w in zip(starts, widths, strict=True) for t in range(w)])
    N = slots.numel()
    q = torch.randn(N, H * D, generator=g)

    def attend(qs, sl, pos, k=kc, v=vc):
        out = torch.empty(qs.shape[0], H * D)
        lib.specgram_attention(
            qs.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            int(k.dtype == torch.bfloat16),
            sl.data_ptr(),
            pos.data_ptr(),
            qs.shape[0],
            S,
            H,
            Hkv,
            D,
            P,
            window,
            0.125,
            out.data_ptr(),
            2,
        )
        return out

    together = attend(q, slots, positions)
    for n in range(N):
        alone = attend(q[n : n + 1].contiguous(), slots[n : n + 1].contiguous(), positions[n : n + 1].contiguous())
        assert torch.equal(together[n], alone[0]), n
    lo = 0
    for w in widths:  # each row by itself (a single short row is split into smaller groups)
        row = attend(q[lo : lo + w].contiguous(), slots[lo : lo + w].contiguous(), positions[lo : lo + w].contiguous())
        assert torch.equal(row, together[lo : lo + w])
        lo += w
    # and against the definition (softmax over the token's own window of its slot)
    for n in range(N):
        pos, s = int(positions[n]), int(slots[n])
        lo = max(0, pos - window + 1) if window else 0
        for h in range(H):
            k = kc[s, h // (H // Hkv), :, lo : pos + 1]  # [D, len]
            v = vc[s, h // (H // Hkv), lo : pos + 1]  # [len, D]
            ref = torch.softmax(q[n, h * D : (h + 1) * D] @ k * 0.125, -1) @ v
            assert torch.allclose(together[n, h * D : (h + 1) * D], ref, atol=1e-5)
    # a bfloat16 cache: widened exactly as it is read, so bitwise a float32 cache holding the same values
    kb, vb = kc.bfloat16(), vc.bfloat16()
    assert torch.equal(attend(q, slots, positions, kb, vb), attend(q, slots, positions, kb.float(), vb.float()))


def test_out_of_range_slots_and_positions_raise_before_any_write(lib):
    runner = ModelRunner(m := build_model("llama", seed=5), 4, 32, choose_for(m, linear="native"))
    runner.forward_rows([[5, 6, 7]], [1], [0], last_only=True)
    k, v = runner.cache.k.clone(), runner.cache.v.clone()
    bad = [
        (([[1, 2]], [4], [0]), "slot 4 out of range: the cache has 4 slots"),
        (([[1, 2]], [-1], [0]), "slot -1 out of range"),
        (([[1, 2, 3]], [0], [30]), "position 32 out of range: the cache holds 32 positions"),
        (([[1]], [0], [-1]), "position -1 out of range"),
        (([[1, 2], [3]], [0, 0], [0, 5]), "consecutive positions"),
        (([[1, 999]], [0], [0]), "token id 999 out of range: the vocabulary has"),
        (([[-3]], [0], [0]), "token id -3 out of range"),
    ]
    for (rows, slots, starts), message in bad:
        with pytest.raises(ValueError, match=message):
            runner.forward_rows(rows, slots, starts, last_only=False)
    native = runner.native
    with pytest.raises(ValueError, match="positions: expected a contiguous int64"):
        native.layers_forward(
            runner.cache, torch.tensor([1]), torch.tensor([0]), torch.tensor([0], dtype=torch.int32), None
        )
    assert torch.equal(runner.cache.k, k) and torch.equal(runner.cache.v, v)
    runner.forward_rows([[1, 2]], [3], [30], last_only=True)  # the last slot and position: fine
