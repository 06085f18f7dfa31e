"""Int8 weight-only matmuls on the native kernels (model/int8.py, gemm.c's int8 product): the quantization, the
product against a float64 reference of the same quantized weights, and its bitwise batch invariance - for
each ISA's build of the kernels that this CPU runs."""
from __future__ import annotations

import pytest
import torch

from specgram.model import kernels
from specgram.model.int8 import dequantize_rows, quantize_rows
from specgram.model.linear import NativeLinear

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason="native kernels need AVX-512 or AVX2 and a C compiler")

REL_TOL = 1e-5     # fp32 accumulation against float64, relative to the largest output


@pytest.fixture(params=kernels.ISAS)
def lib(request, monkeypatch):
    """One ISA's kernel library, which the runners built in the test then use (kernels.load() returns it)."""
    try:
        chosen = kernels.load_isa(request.param)
    except kernels.KernelsUnavailable as e:
        pytest.skip(f"the {request.param} kernels: {e}")
    monkeypatch.setattr(kernels, "load", lambda: chosen)
    return chosen


def test_quantization_is_symmetric_per_output_row():
    torch.manual_seed(0)
    w = torch.randn(70, 33) * torch.logspace(-3, 1, 70)[:, None]     # rows of very different magnitude
    w[5] = 0                                                          # a row of zeros
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (70,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.equal(scale, w.abs().amax(1) / 127)
    nonzero = [i for i in range(70) if i != 5]
    assert torch.equal(q[nonzero].abs().amax(1), torch.full((69,), 127, dtype=torch.int8))  # each row's max -> 127
    assert scale[5] == 0 and not q[5].any()
    err = (dequantize_rows(q, scale) - w).abs()
    assert bool((err <= scale[:, None] * 0.5 * (1 + 1e-6)).all())    # within half a step of its row
    assert torch.equal(quantize_rows(w.to(torch.bfloat16))[0], quantize_rows(w.to(torch.bfloat16).float())[0])


@pytest.mark.parametrize("n,k,bias", [(64, 64, False), (100, 70, True), (576, 1536, False), (1000, 96, True),
                                      (31, 5, True)])
def test_int8_linear_matches_its_quantized_weights_and_is_batch_invariant(lib, n, k, bias):
    torch.manual_seed(n + k)
    w = torch.randn(n, k) * 0.05
    b = torch.randn(n) if bias else None
    lin = NativeLinear(w, b, torch.int8, lib)
    assert lin.packed.dtype == torch.int8 and lin.packed.shape == (-(-n // 32), k, 32)
    q, scale = quantize_rows(w)
    x = torch.randn(130, k)                            # 17 row tiles: the prefill-sized schedule
    full = lin(x)
    ref = (x.double() @ q.double().T) * scale.double()
    if b is not None:
        ref += b.double()
    assert ((full.double() - ref).abs().max() / ref.abs().max()).item() < REL_TOL
    for i in range(41):                                # one row alone == the same row among 130
        assert torch.equal(lin(x[i:i + 1])[0], full[i])
    for m in (2, 3, 4, 5, 7, 8, 9, 16, 17, 40, 41, 64):   # every tile height (8 / 3) and remainder, each schedule
        assert torch.equal(lin(x[:m]), full[:m])


def test_int8_linear_is_close_to_the_float_weights(lib):
    torch.manual_seed(1)
    w, x = torch.randn(256, 512) * 0.05, torch.randn(9, 512)
    got, exact = NativeLinear(w, None, torch.int8, lib)(x), x @ w.T
    rel = ((got - exact).norm() / exact.norm()).item()
    assert 1e-3 < rel < 2e-2                # lossy (Gaussian rows, per-row int8: ~0.8% of the norm), but close
