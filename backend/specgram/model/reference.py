"""transformers' own forward of one sequence, as a server of max_seq_len tokens computes it: the reference that
check_model and the family tests compare the engine's forwards with.

The one place the two can differ by design is a rope whose frequencies transformers picks by the call's length
(longrope, dynamic NTK): the server fixes them at max_seq_len (rotary.py). The reference then runs the sequence
with filler tokens after it, up to the length at which transformers picks those same frequencies (past
longrope's original context; max_seq_len for dynamic NTK). Attention is causal, so the sequence's own logits
are unchanged by what follows it, but for the frequencies.
"""

from __future__ import annotations

import torch

FILLER = 0  # any id: the filler's own logits are dropped, and causal attention keeps it out of the sequence's


def frozen_length(cfg, max_seq_len: int) -> int:
    """How long a sequence transformers' forward must see to pick the frequencies a server of max_seq_len fixes
    (rotary.py): past longrope's original context where max_seq_len crosses it; exactly max_seq_len for dynamic
    NTK past max_position_embeddings (its base scales with the length); 0 where any length does."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    kind = str(rope.get("rope_type", "default"))
    if kind == "longrope":
        original = rope.get("original_max_position_embeddings") or cfg.original_max_position_embeddings
        return original + 1 if max_seq_len > original else 0
    if "dynamic" in kind and max_seq_len > cfg.max_position_embeddings:
        return max_seq_len
    return 0


@torch.inference_mode()
def logits(model: torch.nn.Module, ids: list[int], max_seq_len: int) -> torch.Tensor:
    """transformers' forward of `ids` -> float32 logits [len(ids), V] on the CPU, as a server of max_seq_len
    tokens computes them (`model` itself unfrozen: transformers' own)."""
    filler = [FILLER] * max(0, frozen_length(model.config, max_seq_len) - len(ids))
    out = model(torch.tensor([ids + filler], device=model.device)).logits[0, : len(ids)]
    return out.float().cpu()


def greedy(model: torch.nn.Module, ids: list[int], n: int, max_seq_len: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `ids` by n tokens (a full forward per token: no cache to differ in)
    -> (the tokens, the gap between the top two logits at each, relative to the largest logit's magnitude)."""
    seq, gaps = list(ids), []
    for _ in range(n):
        row = logits(model, seq, max_seq_len)[-1]
        top = row.topk(2)
        seq.append(int(top.indices[0]))
        gaps.append(float(top.values[0] - top.values[1]) / max(float(row.abs().max()), 1.0))
    return seq[len(ids) :], gaps
