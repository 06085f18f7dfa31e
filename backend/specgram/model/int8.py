"""Int8 quantization for the native kernels: weight-only (gemm.c's int8 product), or with the activations
quantized too (gemm_i8a8.c's products, "int8-dynamic" and "int8-dynamic8").

Symmetric, one fp32 scale per output channel: for a weight W [N, K], scale[n] = max_k |W[n, k]| / 127 and
q[n, k] = round(W[n, k] / scale[n]) in [-127, 127] (round half to even; a row of zeros gets scale 0 and
q = 0). The kernel computes y[m, n] = (sum_k x[m, k] * q[n, k]) * scale[n] (+ bias[n]) with fp32 activations
and fp32 accumulation, in the fp32 kernel's order, so int8 products are as batch-invariant as fp32 ones.

What is quantized (native.py): every weight matmul of the forward - q/k/v/o, gate/up/down and lm_head
(tied or not: the lm_head gets its own int8 copy, the embedding stays fp32). Fused projections (q|k|v,
gate|up) quantize row by row, so fusing changes nothing. Norms, rotary and the KV cache stay fp32.

Lossy against the fp32 weights: each weight moves by up to scale / 2. Exact with itself: an int8 model's
logits are bitwise the same alone, batched or as verify positions.

int8-dynamic and int8-dynamic8 (on VNNI): the same weights and scales, and each matmul's input quantized per
row in the call, to L = 32767 (int8-dynamic: int16 activations) or L = 127 (int8-dynamic8: int8 ones) levels a side:
xs[m] = max_k |x[m, k]| / L and xq = round(x * (L / max_k |x[m, k]|)) in [-L, L]; the kernel sums xq * q exactly
in integers (int16: as two base-256 digits, each an int8 product) and scales once,
y = (float(sum_k xq[m, k] q[n, k]) * scale[n]) * xs[m] (+ bias[n]); the exact float order is in gemm_i8a8.c.
Integer sums have no order, so both are batch-invariant too. int16 activations keep the copy as close to fp32
as int8 weights alone; int8 ones lose more, for activations whose largest channel is far above their median
(docs/architecture.md, the int8 forms, has the agreement figures). int8-blocks (on VNNI): the same weights and
scales, each matmul's input quantized to int8 per row and block of 256 inputs as int4's products quantize theirs
(int4.quantize_activations), one vpdpbusd per 4 inputs (gemm_i8b.c; reference_blocks() below): a verify of 9 rows
at about the cost int16's takes for 5. Runners' weights values, not the engine's settings: the engine's `weights`
int8 is int8-blocks where the CPU has VNNI, else int8; its int8 draft copy int8-dynamic (engine/settings.py).
"""

from __future__ import annotations

import torch

from ..config import WEIGHTS
from . import int4

QMAX = 127
DYNAMIC, DYNAMIC8 = "int8-dynamic", "int8-dynamic8"  # int8 weights, activations per row to int16 / int8 (runners)
BLOCKS = "int8-blocks"  # int8 weights, activations to int8 per row and block of 256 inputs (gemm_i8b.c; runners)
RUNNER_WEIGHTS = (*WEIGHTS, DYNAMIC, DYNAMIC8, BLOCKS)
# NativeLinear's activations under each: int8-blocks' rows are int4's (gemm_i8b.c reads gemm_i4.c's quantized rows)
ACTIVATIONS = {DYNAMIC: "int16", DYNAMIC8: "int8", BLOCKS: int4.ACTIVATIONS}


CHUNK = 4096  # rows summed at a time by column_sums: chunks only bound torch's int32 temporaries
CHUNK_VALUES = 1 << 18  # values quantized at a time (1 MiB of float32): each row is on its own, so chunks only
# bound the float temporaries, kept in cache (4096 rows of a 8960-wide matrix, 147 MB each, took 3x as long)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (any float dtype) -> (q int8 [N, K], scale float32 [N]) with weight ~ q * scale[:, None]."""
    n, rows = weight.shape[0], max(1, CHUNK_VALUES // max(1, weight.shape[1]))
    q, scale = torch.empty(weight.shape, dtype=torch.int8), torch.empty(n, dtype=torch.float32)
    for i in range(0, n, rows):
        w = weight[i : i + rows].detach().to("cpu", torch.float32)
        s = w.abs().amax(dim=1) / QMAX  # [rows]
        safe = torch.where(s > 0, s, torch.ones_like(s))  # zero rows: q = 0 / 1 = 0
        q[i : i + rows] = torch.round(w / safe[:, None]).clamp_(-QMAX, QMAX)
        scale[i : i + rows] = s
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight that (q, scale) stand for: q * scale[:, None]."""
    return q.float() * scale[:, None]


def column_sums(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] -> int32 [N]: sum_k q[n, k] (gemm_i8a8.c's correction for its unsigned activations)."""
    out = torch.empty(q.shape[0], dtype=torch.int32)
    for i in range(0, q.shape[0], CHUNK):  # torch widens what it sums to int32 first: a chunk at a time
        out[i : i + CHUNK] = q[i : i + CHUNK].sum(dim=1, dtype=torch.int32)
    return out


def reference_blocks(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gemm_i8b.c's product, bitwise, in plain torch: x fp32 [M, K], q int8 [N, K], scale [N] -> y fp32 [M, N]."""
    m_rows, k = x.shape
    xq, xs = int4.quantize_activations(x.float())  # [M, SB * 256], [M, SB]
    sb = xs.shape[1]
    qp = torch.zeros(q.shape[0], sb * int4.BLOCK, dtype=torch.int64)
    qp[:, :k] = q.long()
    integer = torch.einsum("mbk,nbk->mnb", xq.view(m_rows, sb, -1), qp.view(-1, sb, int4.BLOCK))  # exact
    acc = torch.zeros(m_rows, q.shape[0])
    for b in range(sb):
        acc = acc + integer[:, :, b].float() * xs[:, b : b + 1]
    y = acc * scale
    return y + bias.float() if bias is not None else y
