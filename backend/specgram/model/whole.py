"""A checkpoint as transformers loads it whole (the PyTorch forward's models, checkpoints the native forward does
not read tensor by tensor, and references), and the check every load starts with: a supported family."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import ModelLoadError
from .families import DOCS, FAMILIES
from .gguf_checkpoint import checkpoint, config_of, gguf_file


def checkpoint_config(path: Path) -> dict:
    """The config.json of a checkpoint folder (or a GGUF file's config) of a supported family; ModelLoadError with
    the reason."""
    if gguf_file(path) is not None:
        cfg, where = config_of(path).to_dict(), path  # a GGUF's problems are ModelLoadErrors in words already
    else:
        if not path.is_dir():
            raise ModelLoadError(
                f"checkpoint folder {str(path)!r} does not exist (run scripts/setup.sh for the default "
                "model, or set the 'checkpoint' parameter to a local HF checkpoint folder or GGUF file)"
            )
        where = path / "config.json"
        if not where.exists():
            raise ModelLoadError(f"{str(path)!r} has no config.json: not a Hugging Face checkpoint folder")
        cfg = json.loads(where.read_text())
    if cfg.get("model_type") not in FAMILIES:
        raise ModelLoadError(
            f"model_type {cfg.get('model_type')!r} in {where} is not supported; this engine runs the decoder "
            f"families {', '.join(FAMILIES)} (see {DOCS})"
        )
    return cfg


def load_model(path: str | Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The transformers model of a checkpoint folder (or GGUF file, de-quantized by transformers' reader), on
    `device` in `dtype`; ModelLoadError with the reason."""
    from transformers import AutoModelForCausalLM

    checkpoint_config(Path(path))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but CUDA is not available on this machine")
    if gguf_file(path) is not None:
        return _from_gguf(path, dtype).to(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    except Exception as e:  # transformers raises many types; the message is what the user needs
        raise ModelLoadError(f"could not load the checkpoint {str(path)!r}: {e}") from e
    return model.to(device)


def _from_gguf(path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """The whole model of a GGUF file (the PyTorch forward's): built from the file's config and filled tensor by
    tensor with its de-quantized values (gguf_checkpoint.py), as the native forward reads them."""
    from transformers import AutoModelForCausalLM

    source = checkpoint(path)
    model = AutoModelForCausalLM.from_config(source.config(), dtype=dtype, attn_implementation="sdpa")
    source.rotary(model)
    files = source.tensors(model.config.num_hidden_layers)
    params = dict(model.named_parameters())  # a tied head is the embedding's parameter, listed once
    files.expect({name: tuple(p.shape) for name, p in params.items()})
    with torch.no_grad():
        for name, p in params.items():
            if name not in files or files.meta[name][0] != tuple(p.shape):
                raise ModelLoadError(f"{source.file}: no tensor for {name!r} {list(p.shape)} in the file")
            p.copy_(files.get(name))
    return model.eval()
