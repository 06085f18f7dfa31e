"""transformers' own forward of one sequence, as a server of max_seq_len tokens computes it: the reference that
check_model and the family tests compare the engine's forwards with.

The one place the two can differ by design is a rope whose frequencies transformers picks by the call's length
(longrope): the server fixes them at max_seq_len (rotary.py). Where max_seq_len crosses the original context the
server takes the long factor throughout, which transformers takes for any call past that context; the reference
then runs the sequence with filler tokens after it, up to past the original context. Attention is causal, so the
sequence's own logits are unchanged by what follows it, but for the factor.
"""

from __future__ import annotations

import torch

FILLER = 0  # any id: the filler's own logits are dropped, and causal attention keeps it out of the sequence's


def original_context(cfg) -> int | None:
    """The original context of a longrope config (None for every other rope)."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type") != "longrope":
        return None
    return rope.get("original_max_position_embeddings") or getattr(cfg, "original_max_position_embeddings", None)


@torch.inference_mode()
def logits(model: torch.nn.Module, ids: list[int], max_seq_len: int) -> torch.Tensor:
    """transformers' forward of `ids` -> float32 logits [len(ids), V] on the CPU, as a server of max_seq_len
    tokens computes them."""
    original = original_context(model.config)
    filler = []
    if original and max_seq_len > original:
        filler = [FILLER] * max(0, original + 1 - len(ids))
    out = model(torch.tensor([ids + filler], device=model.device)).logits[0, : len(ids)]
    return out.float().cpu()


def greedy(model: torch.nn.Module, ids: list[int], n: int, max_seq_len: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `ids` by n tokens (a full forward per token: no cache to differ in)
    -> (the tokens, the gap between the top two logits at each)."""
    seq, gaps = list(ids), []
    for _ in range(n):
        top = logits(model, seq, max_seq_len)[-1].topk(2)
        seq.append(int(top.indices[0]))
        gaps.append(float(top.values[0] - top.values[1]))
    return seq[len(ids) :], gaps
