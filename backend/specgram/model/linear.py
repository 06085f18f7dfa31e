"""The native CPU forward's weight matmuls (kernels/gemm.c).

Why a kernel of our own on CPU: a decode, verify or draft step multiplies a few rows by every weight, so its
cost is reading the weights once. PyTorch's CPU matmuls (MKL / oneDNN) run those shapes well below the memory
bandwidth once M > 1 (docs/performance.md), and their per-row results change with M (other blocking), which
would let batch composition and draft width change greedy output. The native kernel reads each weight once per
register tile of rows (the tile heights: kernels/gemm.c) and accumulates every output in the same order whatever
M is: bitwise batch-invariant (tests/unit/test_native.py checks both properties).

Fused projections: q, k, v share one matrix and one call, as do gate and up: fewer, longer weight streams.
Weights are packed as float32, bfloat16 or int8 (weight-only, one scale per output: int8.py): the same panel
layout and tiling for all three, and the same accumulation order. With the activations quantized too (int16 or
int8 per row, on VNNI: kernels/gemm_i8a8.c) the int8 weights are packed in steps of 4 k (pack_k4) and the
input is quantized inside the call.
"""

from __future__ import annotations

import torch

from . import int4, int8, kernels
from .int8 import column_sums, quantize_rows
from .kernels import abi

BLOCK = 32  # outputs per packed block (NB in gemm.c)
PACK_BLOCKS = 256  # blocks pack_k4 lays out at a time
DIGITS = {"int16": 2, "int8": 1}  # quantized activations: base-256 digits per activation (gemm_i8a8.c)


def data_ptr(t: torch.Tensor | None) -> int | None:
    """A tensor's address for the kernels' structs (specgram.h); None (NULL) for none."""
    return None if t is None else t.data_ptr()


def pack(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight [N, K] -> packed [ceil(N / 32), K, 32] of `dtype` (float32, bfloat16, or int8 for a weight that is
    int8 already), contiguous; element [b, k, j] = weight[32 b + j, k], zero past N."""
    n, k = weight.shape
    blocks, full = -(-n // BLOCK), n // BLOCK
    out = torch.empty(blocks, k, BLOCK, dtype=dtype)  # written in one pass: no padded or transposed copy of W
    w = weight.detach().cpu()
    out[:full] = w[: full * BLOCK].view(full, BLOCK, k).transpose(1, 2)
    if full < blocks:  # the last block: its rows past N are zero
        out[full].zero_()
        out[full, :, : n - full * BLOCK] = w[full * BLOCK :].T
    return out


def pack_k4(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] -> packed int8 [ceil(N / 32), ceil(K / 4), 32, 4] (gemm_i8a8.c), contiguous; element
    [b, k4, j, kk] = q[32 b + j, 4 k4 + kk], zero past N and past K."""
    n, k = q.shape
    blocks, steps = -(-n // BLOCK), -(-k // 4)
    out = torch.empty(blocks, steps, BLOCK, 4, dtype=torch.int8)
    for b0 in range(0, blocks, PACK_BLOCKS):  # a piece at a time: no padded or transposed copy of the whole q
        b1 = min(b0 + PACK_BLOCKS, blocks)
        padded = torch.zeros((b1 - b0) * BLOCK, steps * 4, dtype=torch.int8)
        rows = q[b0 * BLOCK : b1 * BLOCK].detach().cpu()
        padded[: rows.shape[0], :k] = rows
        out[b0:b1] = padded.view(b1 - b0, BLOCK, steps, 4).transpose(1, 2)
    return out


def pack_blocks(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] -> gemm_i8b.c's weights: pack_k4's layout, each byte q + 128 as u8 (the unsigned operand)."""
    return (pack_k4(q).view(torch.uint8) ^ 0x80).contiguous()  # two's complement + 128 = flip the sign bit


class NativeLinear(torch.nn.Module):
    """y = x @ W.T (+ b) through gemm.c; x float32 [..., K] -> float32 [..., N]. CPU only. weight_dtype float32
    or bfloat16 packs W as that dtype; int8 quantizes it (int8.quantize_rows: `packed` int8 and `scale` [N]),
    and the kernel computes (x @ q.T) * scale (+ b).
    activations "int16" or "int8" (int8 weights only; needs VNNI, kernels.has_vnni): gemm_i8a8.c's product
    instead, `packed` in pack_k4's layout with `colsum` [N] int32 beside the scale; x is quantized per row in
    the call to that many bits (int16: as two int8 digits). "int8-blocks" (int8 weights, VNNI): gemm_i8b.c's product,
    `packed` as pack_k4's bytes + 128, x quantized to int8 per row and block of 256. weight_dtype int4.DTYPE (with
    int4.ACTIVATIONS: int8 per block of 256 inputs): 4-bit group-quantized weights, gemm_i4.c's product (its VNNI
    loops where kernels.has_vnni, else the same results without), `packed` its byte stream."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        weight_dtype: torch.dtype,
        lib,
        activations: str = "float32",
    ):
        super().__init__()
        if isinstance(weight, int4.Int4Weight):  # quantized already (a GGUF file's Q4_K blocks)
            self.out_features, self.in_features = weight.q.shape[0], weight.in_features
        else:
            self.out_features, self.in_features = weight.shape
        self.weight_dtype, self.activations = weight_dtype, activations
        colsum, self.vnni = None, bool(kernels.has_vnni(lib))
        if weight_dtype == int4.DTYPE:
            if activations != int4.ACTIVATIONS:
                raise ValueError(f"int4 weights need {int4.ACTIVATIONS} activations, got {activations!r}")
            q = weight if isinstance(weight, int4.Int4Weight) else int4.quantize(weight)
            packed, scale, self._fn = int4.pack(q), None, lib.specgram_gemm_i4
        elif activations == int8.ACTIVATIONS[int8.BLOCKS]:
            if weight_dtype != torch.int8 or not kernels.has_vnni(lib):
                raise ValueError(f"{activations} activations need int8 weights and a CPU with VNNI (kernels.has_vnni)")
            q, scale = quantize_rows(weight)
            packed, self._fn = pack_blocks(q), lib.specgram_gemm_i8b
        elif activations in DIGITS:
            if weight_dtype != torch.int8 or not kernels.has_vnni(lib):
                raise ValueError(f"{activations} activations need int8 weights and a CPU with VNNI (kernels.has_vnni)")
            q, scale = quantize_rows(weight)
            packed, colsum, self._fn = pack_k4(q), column_sums(q), lib.specgram_gemm_i8a8
        elif activations != "float32":
            raise ValueError(f"activations must be float32, int16, int8 or int8-blocks, got {activations!r}")
        elif weight_dtype == torch.int8:
            q, scale = quantize_rows(weight)
            packed, self._fn = pack(q, torch.int8), lib.specgram_gemm_i8
        else:
            packed, scale = pack(weight.float(), weight_dtype), None
            self._fn = lib.specgram_gemm_bf16 if weight_dtype == torch.bfloat16 else lib.specgram_gemm_f32
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("colsum", colsum, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous(), persistent=False)
        self._refresh()

    def _refresh(self) -> None:
        """The call's constant arguments: K, the row stride, the weights' addresses (packed, then scale and colsum
        where present), the activations' digits (quantized activations), int4's VNNI switch, N and the bias address
        (0: none); recomputed whenever Module._apply replaces the buffers."""
        b = self._buffers
        w = [b[k].data_ptr() for k in ("packed", "scale", "colsum") if b[k] is not None]
        if self.weight_dtype == int4.DTYPE:
            w.append(int(self.vnni))
        elif self.activations in DIGITS:
            w.append(DIGITS[self.activations])
        bias = 0 if b["bias"] is None else b["bias"].data_ptr()
        self._args = (self.in_features, self.in_features, *w, self.out_features, bias)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._refresh()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.float().contiguous()
        return self.into(x2, torch.empty(x2.shape[0], self.out_features, dtype=torch.float32)).view(
            *lead, self.out_features
        )

    def into(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [M, N] = the product of x [M, K] -> y; both float32 and contiguous, not checked (forward() makes them
        so; native.py passes its own buffers, reused across layers)."""
        # a call per weight matrix (the PyTorch-side path): each is a gap in the weight stream, so the constant
        # arguments are built once (_refresh), outputs come preallocated, and the module is called without
        # Module.__call__'s hook machinery (below)
        m = x.shape[0]
        if m:
            self._fn(x.data_ptr(), m, *self._args, y.data_ptr(), self.out_features, torch.get_num_threads())
        return y

    __call__ = forward  # no hooks are ever registered on these modules

    def descriptor(self) -> abi.Linear:
        """This product as forward.c's specgram_linear: its kind and the addresses of its buffers (valid while the
        module keeps them)."""
        if self.weight_dtype == int4.DTYPE:
            kind = abi.LIN_I4 if self.vnni else abi.LIN_I4_MADD
        elif self.activations == int8.ACTIVATIONS[int8.BLOCKS]:
            kind = abi.LIN_I8B
        elif self.activations in DIGITS:
            kind = abi.LIN_I8A8
        else:
            kind = {torch.int8: abi.LIN_I8, torch.bfloat16: abi.LIN_BF16}.get(self.weight_dtype, abi.LIN_F32)
        buffers = (data_ptr(self._buffers[k]) for k in ("packed", "scale", "colsum", "bias"))
        digits = DIGITS.get(self.activations, 0) if kind == abi.LIN_I8A8 else 0
        return abi.Linear(kind, digits, self.in_features, self.out_features, *buffers)


def make_linear(
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    lib,
    weight_dtype: torch.dtype,
    activations: str = "float32",
    stored: int4.Int4Weight | None = None,
) -> NativeLinear:
    """One module computing the concatenation of several projections of the same input (fused when > 1), with
    its weights packed as weight_dtype (float32, bfloat16, int8 or int4.DTYPE) and its input as `activations`
    (NativeLinear). stored: the int4 weights as a file stores them (weights then only give the shapes)."""
    if all(b is None for b in biases):
        bias = None
    else:
        bias = torch.cat(
            [b if b is not None else torch.zeros(w.shape[0]) for w, b in zip(weights, biases, strict=True)]
        )
    if stored is not None:
        return NativeLinear(stored, bias, weight_dtype, lib, activations)
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]
    return NativeLinear(weight, bias, weight_dtype, lib, activations)
