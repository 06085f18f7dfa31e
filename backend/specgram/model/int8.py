"""Int8 weight-only quantization for the native kernels (gemm.c's int8 product).

Symmetric, one fp32 scale per output channel: for a weight W [N, K], scale[n] = max_k |W[n, k]| / 127 and
q[n, k] = round(W[n, k] / scale[n]) in [-127, 127] (round half to even; a row of zeros gets scale 0 and
q = 0). The kernel computes y[m, n] = (sum_k x[m, k] * q[n, k]) * scale[n] (+ bias[n]) with fp32 activations
and fp32 accumulation, in the fp32 kernel's order, so int8 products are as batch-invariant as fp32 ones.

What is quantized (native.py): every weight matmul of the forward - q/k/v/o, gate/up/down and lm_head
(tied or not: the lm_head gets its own int8 copy, the embedding stays fp32). Fused projections (q|k|v,
gate|up) quantize row by row, so fusing changes nothing. Norms, rotary and the KV cache stay fp32.

Lossy against the fp32 weights: each weight moves by up to scale / 2. Exact with itself: an int8 model's
logits are bitwise the same alone, batched or as verify positions.
"""
from __future__ import annotations

import torch

QMAX = 127
WEIGHTS = ("auto", "int8")   # the `weights` setting: auto = the checkpoint's dtype, int8 = this quantization


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (any float dtype) -> (q int8 [N, K], scale float32 [N]) with weight ~ q * scale[:, None]."""
    w = weight.detach().to("cpu", torch.float32)
    scale = w.abs().amax(dim=1) / QMAX                                            # [N]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))                  # zero rows: q = 0 / 1 = 0
    q = torch.round(w / safe[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale.contiguous()


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight that (q, scale) stand for: q * scale[:, None]."""
    return q.float() * scale[:, None]
