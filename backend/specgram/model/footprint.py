"""What a load will keep in memory, from a checkpoint's config alone: checked against the memory available before
anything is read, so a load that cannot fit is a clear load error, not a process the kernel kills halfway.

A runner keeps (native CPU forward): its matmul weights in the served form (float32 4 bytes, bfloat16 2, int8 1
byte per weight and a float32 scale per output row), the embedding (float32 or bfloat16 as stored), the norms
(negligible) and, unless it shares another's, a KV cache of layers x slots x KV heads x head size x positions,
for K and V, in the cache's dtype. The PyTorch forward keeps the model's parameters in its dtype. Loading itself
holds one tensor more at a time (checkpoint.py), which the margin covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelLoadError

BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.int8: 1}
MARGIN = 1.1  # the largest tensor in flight, allocator slack, the grammar's tables
GiB = 2**30


@dataclass(frozen=True)
class Part:
    what: str  # e.g. "target weights (float32)"
    nbytes: int


def _matmuls(model: torch.nn.Module) -> tuple[int, int]:
    """-> (weights, output rows) of the forward's matmuls (projections and the head), real or on the meta device."""
    from .choice import projections

    mods = projections(model)
    return sum(m.weight.numel() for m in mods), sum(m.weight.shape[0] for m in mods)


def runner_parts(label: str, model: torch.nn.Module, weights: str, dtype: torch.dtype, kv: Part | None) -> list[Part]:
    """A runner's resident bytes: its matmul weights in their form ("auto": `dtype`; else int8), its embedding
    (not for a "draft copy": it shares its target's) and its KV cache (kv; None: it shares another's)."""
    n, rows = _matmuls(model)
    if weights == "auto":
        parts = [Part(f"{label} weights ({str(dtype).removeprefix('torch.')})", n * BYTES[dtype])]
    else:
        parts = [Part(f"{label} weights (int8)", n + 4 * rows)]
    emb = model.model.embed_tokens.weight
    if label != "draft copy":
        parts.append(Part(f"{label} embedding", emb.numel() * BYTES.get(emb.dtype, 4)))
    return parts + ([kv] if kv is not None else [])


def kv_part(label: str, cfg, slots: int, positions: int, dtype: torch.dtype) -> Part:
    from .families import head_dim

    per = cfg.num_hidden_layers * slots * cfg.num_key_value_heads * head_dim(cfg) * positions * 2
    return Part(f"{label} KV cache", per * BYTES[dtype])


def available() -> int | None:
    """The memory the kernel can give without swapping (MemAvailable), or None where it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check(parts: list[Part], free: int | None = None) -> None:
    """ModelLoadError naming each part where their sum (with MARGIN) exceeds the memory available."""
    free = available() if free is None else free
    need = int(sum(p.nbytes for p in parts) * MARGIN)
    if free is not None and need > free:
        listed = ", ".join(f"{p.what} {p.nbytes / GiB:.2f}" for p in parts)
        raise ModelLoadError(
            f"this load needs about {need / GiB:.1f} GiB ({listed} GiB, and {MARGIN - 1:.0%} margin) where "
            f"{free / GiB:.1f} GiB are available: lower max_slots or max_seq_len, serve int8 weights "
            "(weights int8), set draft_quantization none, or use a machine with more memory"
        )
