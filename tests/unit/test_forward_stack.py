"""The decoder stack in one native call (kernels/forward.c) against the same kernels called one by one through
their own entry points: the hidden states, every KV-cache entry and the lm_head's logits bitwise equal, for each
weight form, for decode, verify and prefill-sized batches (the GEMM's dealt ranges and its dynamic schedule), with
and without an attention window, with a float32 and a bfloat16 KV cache - for each ISA's build of the kernels that
this CPU runs."""

from __future__ import annotations

import pytest
import torch

from specgram.model import families, kernels
from specgram.model.choice import choose_for
from specgram.model.runner import ModelRunner

from .tiny import FAMILY_CONFIGS, build_family

# the families the native forward covers (each family's distinguishing config: q/k norms, partial and absent
# rotary, multipliers, fused projections, windows)
NATIVE_FAMILIES = [n for n in FAMILY_CONFIGS if families.native_gap(families.describe(build_family(n).config)) is None]

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")


def kernel_by_kernel(native, cache, tokens, slots, positions, window):
    """native.py's forward as separate kernel calls (each its own OpenMP region): the reference."""
    lib, nt, bf16 = native.lib, torch.get_num_threads(), int(cache.k.dtype == torch.bfloat16)
    N, E, H, Hkv, D = tokens.shape[0], native.E, native.H, native.Hkv, native.D
    S, P = cache.v.shape[1], cache.v.shape[3]
    h = (native._embed_weight[tokens].float() * native.arch.embed_scale).contiguous()
    cos, sin = native._tables(positions[None])  # [tables x N, rotary]
    x, q, att, act = torch.empty(N, E), torch.empty(N, H * D), torch.empty(N, H * D), torch.empty(N, native.inter)
    qkv, o, gu, down = (torch.empty(N, n) for n in ((H + 2 * Hkv) * D, E, 2 * native.inter, E))
    p = lambda t: t.data_ptr()  # noqa: E731
    addr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    res, act_code = native.arch.residual_scale, native._decoder.act
    first = native.layers[0]
    lib.specgram_add_rmsnorm(p(h), None, None, 0.0, 1.0, p(first.w_in), first.eps_in, p(x), N, E, nt)
    for i, L in enumerate(native.layers):
        k, v = cache.k[i], cache.v[i]
        L.qkv.into(x, qkv)
        rotary, qk = (native.rotary_dims if L.rope else 0), (addr(L.q_norm), addr(L.k_norm), L.qk_eps)
        c, s = cos[L.table * N :], sin[L.table * N :]
        lib.specgram_rope_cache_write(
            p(qkv), p(c), p(s), p(k), p(v), bf16, p(slots), p(positions), N, S, H, Hkv, D, P, rotary, *qk, p(q), nt
        )
        w = (window or 0) if L.sliding else 0
        lib.specgram_attention(
            p(q), p(k), p(v), bf16, p(slots), p(positions), N, S, H, Hkv, D, P, w, native.scaling, p(att), nt
        )
        L.o.into(att, o)
        branch = (addr(L.w_attn_out), L.eps_attn_out, res)
        lib.specgram_add_rmsnorm(p(h), p(o), *branch, p(L.w_post), L.eps_post, p(x), N, E, nt)
        L.gate_up.into(x, gu)
        lib.specgram_act_mul(p(gu), p(act), N, native.inter, act_code, nt)
        L.down.into(act, down)
        nxt = native.layers[i + 1] if i + 1 < len(native.layers) else None
        w, eps = (nxt.w_in, nxt.eps_in) if nxt is not None else (native.w_final, native.eps_final)
        branch = (addr(L.w_mlp_out), L.eps_mlp_out, res)
        lib.specgram_add_rmsnorm(p(h), p(down), *branch, p(w), eps, p(x), N, E, nt)
    return x


def batch(rows):
    """[(slot, start, length)] -> tokens, slots, positions [N] long (seeded token ids)."""
    g = torch.Generator().manual_seed(sum(n for _, _, n in rows))
    slots = torch.tensor([s for s, _, n in rows for _ in range(n)])
    positions = torch.tensor([p for _, start, n in rows for p in range(start, start + n)])
    return torch.randint(3, 259, (slots.shape[0],), generator=g), slots, positions


WEIGHTS = ["auto", "bfloat16", "int8", "int8-dynamic", "int8-dynamic8"]
BATCHES = {
    "decode": [(0, 40, 1)],
    "verify rows": [(0, 40, 5), (1, 30, 5), (2, 50, 1)],
    "prefill chunk beside a verify row": [(3, 0, 140), (0, 40, 4)],  # 140 rows: the dynamic schedule
}


@pytest.mark.parametrize("kv_dtype", ["auto", "bfloat16"])
@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("shape", list(BATCHES))
@pytest.mark.parametrize("family", NATIVE_FAMILIES)
def test_one_call_equals_the_kernels_one_by_one(lib, weights, shape, family, kv_dtype):
    model = build_family(family, seed=5)
    with torch.no_grad():  # norms of ones would hide a norm applied in the wrong place
        for name, t in model.named_parameters():
            if name.endswith("norm.weight"):
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=torch.Generator().manual_seed(len(name))))
    if weights == "bfloat16":
        model, weights = model.to(torch.bfloat16), "auto"
    if weights in ("int8-dynamic", "int8-dynamic8") and not kernels.has_vnni(lib):
        pytest.skip(f"this CPU lacks {kernels.VNNI_FLAGS[lib.isa]}")
    runner = ModelRunner(model, 4, 200, choose_for(model, linear="native", weights=weights, kv_dtype=kv_dtype))
    assert runner.cache.k.dtype == (torch.bfloat16 if kv_dtype == "bfloat16" else torch.float32)
    native, window = runner.native, runner.window
    assert native.lib is lib
    history = batch([(s, 0, 50) for s in range(3)])  # earlier tokens in the cache
    native.layers_forward(runner.cache, *history, window)
    tokens, slots, positions = batch(BATCHES[shape])
    k0, v0 = runner.cache.k.clone(), runner.cache.v.clone()
    got = native.layers_forward(runner.cache, tokens, slots, positions, window)
    k1, v1 = runner.cache.k.clone(), runner.cache.v.clone()
    runner.cache.k.copy_(k0)
    runner.cache.v.copy_(v0)
    want = kernel_by_kernel(native, runner.cache, tokens, slots, positions, window)
    assert torch.equal(got, want)
    assert torch.equal(k1, runner.cache.k) and torch.equal(v1, runner.cache.v)
    assert not torch.equal(k0, k1)  # the call did write the new tokens' K
    # the lm_head in the same call: on chosen rows (a row's last token, in any order) and on all of them
    N = tokens.shape[0]
    for head_rows in (torch.tensor([N - 1, 0]), None):
        runner.cache.k.copy_(k0)
        runner.cache.v.copy_(v0)
        logits = native._run(runner.cache, tokens, slots, positions, None, window, head_rows)
        ref = native.lm_head(want if head_rows is None else want[head_rows])
        assert torch.equal(logits, ref / native.arch.logits_divisor if native.arch.logits_divisor != 1 else ref)
