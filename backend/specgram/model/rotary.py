"""Rotary embeddings whose frequencies depend on the sequence length, fixed once per server (`freeze`).

transformers recomputes two rope types at every call from the call's largest position: longrope (Phi-3.5,
Phi-4-mini) takes its short factor while max(position) + 1 <= original_max_position_embeddings and its long
factor past it, for every position of the call; dynamic NTK rescales its base as the sequence grows. A serving
engine cannot follow that: a verify row that crosses the original context would rotate its earlier positions
with the other factor, a batch-mate past it would change the others, and keys already in the KV cache (or the
prefix cache) were rotated with whatever factor their own call chose. Output would then depend on the draft
length and the batch, which it never may.

Here the frequencies are chosen once, from the longest sequence the server holds (max_seq_len), as transformers
chooses them for a call whose largest position is max_seq_len - 1, and never change after: longrope takes its
short factor where max_seq_len <= original_max_position_embeddings and its long factor otherwise; dynamic NTK
keeps its base up to the original context and scales it for max_seq_len past it. The same rule vLLM applies
(by its max_model_len). How that relates to transformers' own forward of one sequence: where max_seq_len is
within the original context, equal for every sequence; past it, equal for sequences longer than the original
context and, for shorter ones, the long factor where transformers takes the short one. Serve with max_seq_len
<= original_max_position_embeddings to have short-context output equal to transformers'.
"""

from __future__ import annotations

import inspect
import types

import torch

from ..errors import ModelLoadError

LENGTH_DEPENDENT = ("longrope", "dynamic")  # rope types (or parts of their names) recomputed by length per call
FROZEN = "specgram_frozen"  # set on a module freeze() fixed: the max_seq_len it was fixed at


def rope_types(rotary: torch.nn.Module) -> list[str]:
    """The module's rope type(s): one string, or one per layer type (gemma3's dict)."""
    kind = getattr(rotary, "rope_type", "default")
    return [str(t) for t in kind.values()] if isinstance(kind, dict) else [str(kind)]


def length_dependent(rotary: torch.nn.Module) -> bool:
    return any(d in t for t in rope_types(rotary) for d in LENGTH_DEPENDENT)


def fixed(rotary: torch.nn.Module) -> bool:
    """Whether the module's tables are a function of the position alone (not length-dependent, or frozen)."""
    return not length_dependent(rotary) or getattr(rotary, FROZEN, None) is not None


def freeze(rotary: torch.nn.Module, max_seq_len: int, layer_types: tuple[str | None, ...] = (None,)) -> bool:
    """Fix a length-dependent rotary module's frequencies at those transformers uses for a call reaching position
    max_seq_len - 1, and stop it from updating them again (its forward without transformers' per-call update).
    -> whether it froze the module (one that is fixed already is left untouched)."""
    at = getattr(rotary, FROZEN, None)
    if at is not None and at != max_seq_len:  # one model, two runners of other lengths: one table cannot serve both
        raise ModelLoadError(
            f"this model's rotary is fixed at max_seq_len {at}; a runner of {max_seq_len} needs its own"
        )
    if fixed(rotary):
        return False
    forward = type(rotary).forward
    x = torch.empty(1, 1, 1, device=next(rotary.buffers()).device)
    last = torch.tensor([[max_seq_len - 1]], device=x.device)
    for layer_type in layer_types:  # transformers' own update, once, at the server's longest sequence
        forward(rotary, x, position_ids=last, **({"layer_type": layer_type} if layer_type else {}))
    plain = torch.no_grad()(inspect.unwrap(forward))  # the module's forward without the per-call update
    rotary.forward = types.MethodType(plain, rotary)  # the frequencies as they are now, from here on
    setattr(rotary, FROZEN, max_seq_len)
    return True
