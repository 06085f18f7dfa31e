"""A checkpoint as transformers loads it whole (the PyTorch forward's models, checkpoints the native forward does
not read tensor by tensor, and references): a GGUF file's built from its config and filled with its de-quantized
tensors, a folder's by transformers' from_pretrained."""

from __future__ import annotations

import torch

from ..errors import ModelLoadError
from .source import Source


def load_model(source: Source, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The transformers model of an opened checkpoint (source.py: a supported family), on `device` in `dtype`: a
    folder's by from_pretrained, a GGUF file's de-quantized (_from_gguf); ModelLoadError with the reason."""
    from transformers import AutoModelForCausalLM

    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but CUDA is not available on this machine")
    if source.gguf is not None:
        return _from_gguf(source, dtype).to(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, attn_implementation="sdpa")
    except Exception as e:  # transformers raises many types; the message is what the user needs
        raise ModelLoadError(f"could not load the checkpoint {str(source.path)!r}: {e}") from e
    return model.to(device)


def _from_gguf(source: Source, dtype: torch.dtype) -> torch.nn.Module:
    """The whole model of a GGUF file (the PyTorch forward's): built from the file's config and filled tensor by
    tensor with its de-quantized values (gguf_checkpoint.py), as the native forward reads them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(source.config(), dtype=dtype, attn_implementation="sdpa")
    source.gguf.rotary(model)
    files = source.tensors(model)
    params = dict(model.named_parameters())  # a tied head is the embedding's parameter, listed once
    with torch.no_grad():
        for name, p in params.items():
            if name not in files or files.meta[name][0] != tuple(p.shape):
                raise ModelLoadError(f"{source.path}: no tensor for {name!r} {list(p.shape)} in the file")
            p.copy_(files.get(name))
    return model.eval()
