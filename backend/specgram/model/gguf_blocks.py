"""GGUF block types de-quantized in torch: the common types of llama.cpp's files (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K,
Q6_K) to float32, bitwise the values the `gguf` package's numpy decoders give (the same fp16 -> fp32 widening and
the same fp32 products in the same order; tests/unit/test_gguf_blocks.py compares them on random blocks).

Why not the package's: its decoders run on one core over groups of 16 rows, with a numpy split per group; a
1.5B Q4_K_M file's Q6_K tensors and Q4_K embedding took ~4 s of a 14 s load there. These are whole-tensor torch
operations on torch's threads. Any other type still goes through the package (decode() returns None for it).

Layouts (ggml-common.h): every block starts with its fp16 scale d (and, for the K types, dmin) and holds QK values:
  Q4_0  QK 32:  d, qs[16]              nibbles: value j < 16 the low nibble of qs[j], j >= 16 the high one of qs[j-16]
  Q5_0  QK 32:  d, qh u32, qs[16]      as Q4_0, bit j of qh the value's fifth bit; value = d * (q - 16)
  Q8_0  QK 32:  d, qs[32] int8         value = d * q
  Q4_K  QK 256: d, dmin, scales[12], qs[128]   8 groups of 32, 6-bit sub-scale and min each (get_scale_min)
  Q5_K  QK 256: d, dmin, scales[12], qh[32], qs[128]   as Q4_K with a fifth bit per value from qh
  Q6_K  QK 256: ql[128], qh[64], scales[16] int8, d    16 groups of 16, value = d * scale * (q - 32)
"""

from __future__ import annotations

import torch

QK_K = 256
SIZES = {
    "Q4_0": (32, 18),
    "Q5_0": (32, 22),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}  # type -> (values, bytes) per block


def _f16(b: torch.Tensor) -> torch.Tensor:
    """u8 [..., 2] (little-endian fp16) -> float32 [..., 1], exactly (every fp16 is an fp32)."""
    return b.contiguous().view(torch.float16).float()


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """u8 [..., span] -> u8 [..., 2 * span]: each chunk's low nibbles, then its high ones."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K packed scales u8 [n, 12] -> (sub-scales, mins) u8 [n, 8] each (6 bits): bytes 0-3 hold scales
    0-3 in their low 6 bits and the top bits of 4-7, bytes 4-7 the mins likewise, bytes 8-11 the low 4 bits of
    scale and min 4-7."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc, mn


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = nibbles(b[:, 2:]).view(-1, 32).to(torch.int8) - 8
    return _f16(b[:, 0:2]) * q.float()


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    qh = b[:, 2:6].contiguous().view(torch.int32)  # the 32 fifth bits, bit j for value j
    high = ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)
    low = nibbles(b[:, 6:])
    q = (low | (high << 4)).to(torch.int8) - 16
    return _f16(b[:, 0:2]) * q.float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, 0:2])


def q4_k_fields(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks u8 [n, 144] -> (d, dmin float32 [n, 1]; sub-scales, mins u8 [n, 8]; codes u8 [n, 256] in value
    order: chunk c of 32 bytes holds group 2c in its low nibbles, 2c + 1 in its high ones)."""
    sc, mn = scale_min(b[:, 4:16])
    return _f16(b[:, 0:2]), _f16(b[:, 2:4]), sc, mn, nibbles(b[:, 16:].reshape(-1, 4, 32)).view(-1, QK_K)


def _k_scales(d, dmin, sc, mn) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: per block and group of 32, (d * sc, dmin * mn) as float32 [n, 8, 1] (the package's products)."""
    return (d * sc.float()).unsqueeze(-1), (dmin * mn.float()).unsqueeze(-1)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, mn, q = q4_k_fields(b)
    d, dm = _k_scales(d, dmin, sc, mn)
    return (d * q.view(-1, 8, 32).float() - dm).view(-1, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    sc, mn = scale_min(b[:, 4:16])
    d, dm = _k_scales(_f16(b[:, 0:2]), _f16(b[:, 2:4]), sc, mn)
    low = nibbles(b[:, 48:].reshape(-1, 4, 32)).view(-1, 8, 32)
    qh = b[:, 16:48].view(-1, 1, 32)  # bit g of qh[j]: the fifth bit of value j of group g
    high = (qh >> torch.arange(8, dtype=torch.uint8).view(1, 8, 1)) & 1
    return (d * (low | (high << 4)).float() - dm).view(-1, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    scales, d = b[:, 192:208].contiguous().view(torch.int8).float(), _f16(b[:, 208:210])
    dl = (d * scales).view(-1, 16, 1)
    low = nibbles(ql).view(-1, 8, 32)  # per half: 4 runs of 32
    high = ((qh.unsqueeze(2) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)) & 3).view(-1, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return (dl * q.view(-1, 16, 16).float()).view(-1, QK_K)


DECODERS = {"Q4_0": _q4_0, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def decode(type_name: str, rows: torch.Tensor) -> torch.Tensor | None:
    """rows u8 [R, bytes] of blocks of `type_name` -> float32 [R, values] (None: a type this module lacks)."""
    fn = DECODERS.get(type_name)
    if fn is None:
        return None
    values, size = SIZES[type_name]
    r = rows.shape[0]
    return fn(rows.reshape(-1, size)).reshape(r, rows.shape[1] // size * values)
