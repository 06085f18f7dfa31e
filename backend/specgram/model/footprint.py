"""What a load will keep in memory, from a checkpoint's config alone: checked against the memory available before
anything is read, so a load that cannot fit is a clear load error, not a process the kernel kills halfway.

A runner keeps (native CPU forward): its matmul weights in the served form (float32 4 bytes, bfloat16 2, int8 1
byte per weight and a float32 scale per output row, int4 4.75 bits per weight with its scales: int4.py), the
embedding (float32 or bfloat16 as stored), the norms (negligible) and, unless it shares another's, a KV cache of
layers x slots x KV heads x head size x positions, for K and V, in the cache's dtype. The PyTorch forward keeps the
model's parameters in its dtype. Loading itself
holds one tensor more at a time (checkpoint.py), which the margin covers. Not counted: LoRA adapters (small),
CUDA graphs' headroom (CUDA is not checked); a reduced draft head is counted whole (an overestimate).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelLoadError

MARGIN = 1.1  # the largest tensor in flight, allocator slack, the grammar's tables
GiB = 2**30


@dataclass(frozen=True)
class Part:
    what: str  # e.g. "target weights (float32)"
    nbytes: int


def _matmuls(model: torch.nn.Module) -> tuple[int, int, int]:
    """-> (weights, output rows, int4 bytes) of the forward's matmuls (projections and the head), real or on the
    meta device."""
    from .choice import projections
    from .int4 import packed_bytes

    mods = projections(model)
    int4 = sum(packed_bytes(*m.weight.shape) for m in mods)
    return sum(m.weight.numel() for m in mods), sum(m.weight.shape[0] for m in mods), int4


def runner_parts(
    label: str, model: torch.nn.Module, weights: str, dtype: torch.dtype, kv: Part | None,
    embedding: torch.dtype | None, native: bool,
) -> list[Part]:  # fmt: skip
    """A runner's resident bytes: its matmul weights in their form ("auto": `dtype`; int4 forms: int4.py's
    packing; else int8), its embedding in
    `embedding` (None: it shares another runner's) and its KV cache (kv; None: it shares another's). A tied head
    is a second copy on the native forward (packed), the embedding itself on PyTorch's."""
    n, rows, int4 = _matmuls(model)
    emb = model.model.embed_tokens.weight
    if not native and model.lm_head.weight is emb:
        n, rows = n - emb.numel(), rows - emb.shape[0]  # counted as the embedding
    if weights == "auto":
        parts = [Part(f"{label} weights ({str(dtype).removeprefix('torch.')})", n * dtype.itemsize)]
    elif weights.startswith("int4"):
        parts = [Part(f"{label} weights (int4)", int4)]
    else:
        parts = [Part(f"{label} weights (int8)", n + 4 * rows)]
    if embedding is not None:
        parts.append(Part(f"{label} embedding", emb.numel() * embedding.itemsize))
    return parts + ([kv] if kv is not None else [])


def kv_part(label: str, cfg, slots: int, positions: int, dtype: torch.dtype) -> Part:
    from .families import head_dim

    per = cfg.num_hidden_layers * slots * cfg.num_key_value_heads * head_dim(cfg) * positions * 2
    return Part(f"{label} KV cache", per * dtype.itemsize)


def available() -> int | None:
    """The memory the kernel can give without swapping (MemAvailable), or None where it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check(parts: list[Part], free: int | None = None, remedies: tuple[str, ...] = ()) -> None:
    """ModelLoadError naming each part, and `remedies` (the settings that would lower them), where their sum
    (with MARGIN) exceeds the memory available."""
    free = available() if free is None else free
    need = int(sum(p.nbytes for p in parts) * MARGIN)
    if free is not None and need > free:
        listed = ", ".join(f"{p.what} {p.nbytes / GiB:.2f}" for p in parts)
        todo = ", ".join(("lower max_slots or max_seq_len", *remedies, "or use a machine with more memory"))
        raise ModelLoadError(
            f"this load needs about {need / GiB:.1f} GiB ({listed} GiB, and {MARGIN - 1:.0%} margin) where "
            f"{free / GiB:.1f} GiB are available: {todo}"
        )
