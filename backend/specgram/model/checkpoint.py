"""A checkpoint read one tensor at a time, for the native CPU forward: its weights go straight into their served
form (packed.py) and no full-precision framework module is ever made.

What it replaces: transformers' from_pretrained materializes the whole model in the load dtype (a bfloat16
checkpoint served from float32 packs became a float32 copy first), and its parameters, views of the memory-mapped
files, keep every page the packing touched resident beside the packed weights. Here the model is built on the
meta device (its structure, config and generation config: what the engine and the packing read of it), and each
tensor is read from its safetensors file when the packing asks for it: the file is mapped for that read only,
so at any time the load holds what is packed so far plus one tensor.

The skeleton's rotary module is the one part that computes (native.py builds its tables with it): it is made
again on the CPU from the config. A checkpoint without safetensors files (PyTorch .bin) is loaded by
transformers as before (whole.load_model).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
from pathlib import Path

import torch

from ..errors import ModelLoadError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}  # what the packing reads


def kept_dtype(stored: torch.dtype | None) -> torch.dtype:
    """The dtype an embedding stored in `stored` is kept in: float32 or bfloat16 as they are (the kernels widen
    bfloat16 rows exactly), anything else as float32."""
    return stored if stored in (torch.float32, torch.bfloat16) else torch.float32


class TensorFiles:
    """A checkpoint folder's tensors by name, each read from its safetensors file on demand; every file's header
    (names, shapes, dtypes) read once here. ModelLoadError where a file is missing or unreadable."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        if (self.path / INDEX).exists():
            weight_map = json.loads((self.path / INDEX).read_text())["weight_map"]
            files = sorted({self.path / f for f in weight_map.values()})
        else:
            files = [self.path / SINGLE]
        self.files: dict[str, Path] = {}
        self.meta: dict[str, tuple[tuple[int, ...], str]] = {}  # name -> (shape, safetensors dtype)
        try:
            for file in files:
                with safe_open(str(file), "pt") as f:
                    for name in f.keys():
                        part = f.get_slice(name)
                        self.files[name], self.meta[name] = file, (tuple(part.get_shape()), part.get_dtype())
        except Exception as e:  # a missing shard, a damaged header: safetensors raises several types
            raise ModelLoadError(f"could not read the checkpoint {str(self.path)!r}: {e}") from e

    @staticmethod
    def present(path: str | Path) -> bool:
        return (Path(path) / INDEX).exists() or (Path(path) / SINGLE).exists()

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str, own: bool = False) -> torch.Tensor:
        """The tensor `name`, a view of its file's mapping (own: a copy of its own). A view's pages are read as the
        caller reads it and the mapping goes with its last reference: pack it, then drop it."""
        from safetensors import safe_open

        if name not in self.files:
            raise ModelLoadError(f"{self.path}: the checkpoint has no tensor {name!r}")
        try:
            with safe_open(str(self.files[name]), "pt") as f:
                t = f.get_tensor(name)
        except Exception as e:
            raise ModelLoadError(f"could not read {name!r} from {self.files[name]}: {e}") from e
        return t.clone() if own else t

    def dtype(self, name: str) -> torch.dtype | None:
        """The stored dtype of `name` as torch names it (None: no such tensor, or a dtype the packing does not
        read)."""
        return DTYPES.get(self.meta[name][1]) if name in self.meta else None


def release_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc's malloc_trim): packing a tensor frees temporaries
    that the allocator would otherwise keep resident, so the load's peak would grow with the tensors packed.
    Nothing where the C library has no malloc_trim."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def tied(model: torch.nn.Module) -> bool:
    """Whether the head is the embedding (no lm_head tensor of its own in the checkpoint)."""
    return model.lm_head.weight is model.model.embed_tokens.weight


class ModuleTensors:
    """The tensors a PackedDecoder reads, by module: from a TensorFiles (a skeleton model) or, for a model loaded
    whole (tests, the PyTorch path's models), from the module's own parameters."""

    def __init__(self, model: torch.nn.Module, files: TensorFiles | None = None):
        self.files = files
        self.names = {id(m): name for name, m in model.named_modules()}
        self.tied = tied(model)
        self.embed, self.head = model.model.embed_tokens, model.lm_head
        self._embedding: torch.Tensor | None = None

    def embedding(self) -> torch.Tensor:
        """The embedding rows as forward.c reads them, made once and shared by every PackedDecoder of this model
        (a target and its int8 copy): float32 or bfloat16 as stored (bfloat16 rows widen exactly), any other
        float dtype as float32; read from the files, a copy of its own (a view of the file's mapping would keep
        its pages mapped), else the module's own storage where it can."""
        if self._embedding is None:
            w = (
                self.embed.weight.detach()
                if self.files is None
                else self.files.get(f"{self.names[id(self.embed)]}.weight")
            )
            # a view of a mapped file is copied; a GGUF's de-quantized tensor is its own already
            mapped = self.files is not None and not getattr(self.files, "copies", False)
            self._embedding = w.to(kept_dtype(w.dtype), copy=mapped).contiguous()
        return self._embedding

    def unfit(self, model: torch.nn.Module) -> str | None:
        """None where the files hold every parameter of the model under its own name, in its shape and in a float
        dtype the packing reads; else the first that does not (the model is then loaded whole, by transformers,
        which knows other names, checks shapes and reads quantized formats)."""
        if self.files is None:
            return None
        if getattr(model.config, "quantization_config", None):
            return "a quantized checkpoint (quantization_config)"
        for name, p in model.named_parameters():
            if name not in self.files:
                return f"no tensor {name!r}"
            shape, dtype = self.files.meta[name]
            if shape != tuple(p.shape) or dtype not in DTYPES:
                return f"{name!r} is {dtype} {list(shape)} where the model has {list(p.shape)}"
        return None

    def weight(self, module: torch.nn.Module, own: bool = False) -> torch.Tensor:
        """The module's weight as stored; own: a copy of its own (a norm's, kept as it is: no view of a file's
        mapping outlives the load)."""
        return self._read(module, "weight", own)

    def weight_rows(self, module: torch.nn.Module):
        """The module's weight for a quantizer that reads it a block of rows at a time: a GGUF file's as LazyRows
        (de-quantized as read), any other as weight() gives it."""
        if self.files is None or not hasattr(self.files, "rows") or self.tied and module in (self.embed, self.head):
            return self.weight(module)
        return self.files.rows(f"{self.names[id(module)]}.weight")

    def int4(self, modules: list[torch.nn.Module]):
        """The modules' weights (rows appended in order) as the file stores them in int4.py's form, exactly:
        where every one is a GGUF Q4_K tensor (gguf_checkpoint.py); else None."""
        if self.files is None or not hasattr(self.files, "int4"):
            return None
        from .int4 import cat

        parts = [self.files.int4(f"{self.names[id(self._stored(m))]}.weight") for m in modules]
        return None if any(p is None for p in parts) else cat(parts)

    def _stored(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module whose tensor the files hold for `module`'s weight: a tied head's is the embedding's."""
        return self.embed if self.tied and module is self.head else module

    def bias(self, module: torch.nn.Module) -> torch.Tensor | None:
        return None if getattr(module, "bias", None) is None else self._read(module, "bias", own=True)

    def _read(self, module: torch.nn.Module, what: str, own: bool) -> torch.Tensor:
        if self.files is None:
            return getattr(module, what).detach()
        if self.tied and what == "weight" and module in (self.embed, self.head):
            return self.embedding()  # read once: the head packs from the rows already in memory
        return self.files.get(f"{self.names[id(module)]}.{what}", own)
