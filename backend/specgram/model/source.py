"""A checkpoint source, opened once: a Hugging Face folder (safetensors, or PyTorch .bin files that transformers
loads whole) or a GGUF file (gguf_checkpoint.py).

A load asks its source for everything it reads of a checkpoint: the family check, the config and generation
config, the tokenizer, the model's skeleton on the meta device, the tensors by the engine's names, the stored dtype
of the embedding and the bytes on disk. Nothing else in a load looks at paths or suffixes. open_source(path) keeps
one Source per path and version (the files' sizes and times), so the settings, the memory check, the skeleton and
the packing, which all ask for the config, read each header once.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch

from ..errors import ModelLoadError
from .checkpoint import INDEX, SINGLE, TensorFiles, kept_dtype
from .families import DOCS, FAMILIES
from .gguf_checkpoint import GGUFCheckpoint, checkpoint, gguf_file

SAFETENSORS, GGUF, WHOLE = "safetensors", "gguf", "whole"  # Source.kind: read tensor by tensor, or whole


def supported(model_type: str | None, where) -> None:
    """ModelLoadError naming the served families where model_type is not one of them."""
    if model_type not in FAMILIES:
        raise ModelLoadError(
            f"model_type {model_type!r} in {where} is not supported; this engine runs the decoder "
            f"families {', '.join(FAMILIES)} (see {DOCS})"
        )


class Source:
    """One checkpoint as a load reads it. kind: SAFETENSORS or GGUF (the native forward reads its tensors one at a
    time: tensors()), WHOLE (a folder without safetensors: transformers loads the model whole)."""

    def __init__(self, path: Path):
        self.path = path
        self.gguf: GGUFCheckpoint | None = None
        file = gguf_file(path)
        if file is not None:
            self.kind, self.gguf = GGUF, checkpoint(file)  # the one reading of this file version
            self._config = self.gguf.config()
            supported(self._config.model_type, file)
            self.nbytes = file.stat().st_size
            self._files = None
            return
        if not path.is_dir():
            raise ModelLoadError(
                f"checkpoint folder {str(path)!r} does not exist (run scripts/setup.sh for the default "
                "model, or set the 'checkpoint' parameter to a local HF checkpoint folder or GGUF file)"
            )
        where = path / "config.json"
        if not where.exists():
            raise ModelLoadError(f"{str(path)!r} has no config.json: not a Hugging Face checkpoint folder")
        supported(json.loads(where.read_text()).get("model_type"), where)
        from transformers import AutoConfig

        try:
            self._config = AutoConfig.from_pretrained(path)
        except Exception as e:  # transformers raises many types; the message is what the user needs
            raise ModelLoadError(f"could not read the model config of {str(path)!r}: {e}") from e
        present = TensorFiles.present(path)
        self.kind = SAFETENSORS if present else WHOLE
        self._files = TensorFiles(path) if present else None  # every shard's header, once
        weights = list(path.glob("*.safetensors")) or list(path.glob("*.bin"))
        self.nbytes = sum(f.stat().st_size for f in weights)

    def config(self):
        """The transformers config (a copy: callers set attributes on theirs)."""
        return copy.deepcopy(self._config)

    def generation_config(self):
        """The folder's generation_config.json (None: a GGUF file, or a folder without one)."""
        if self.gguf is not None:
            return None
        from transformers import GenerationConfig

        try:
            return GenerationConfig.from_pretrained(self.path)
        except OSError:  # no generation_config.json
            return None

    def tokenizer(self):
        """The checkpoint's tokenizer (a GGUF's from its metadata); ModelLoadError with the reason."""
        try:
            if self.gguf is not None:
                return self.gguf.tokenizer()
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(self.path)
        except Exception as e:
            raise ModelLoadError(f"could not load the tokenizer from {str(self.path)!r}: {e}") from e

    def skeleton(self, dtype: torch.dtype) -> torch.nn.Module:
        """The transformers model on the meta device, in `dtype` (what the packing serves), with the generation
        config and a working rotary module on the CPU (a GGUF's rope scaling applied as the file holds it)."""
        from transformers import AutoModelForCausalLM

        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(self.config(), dtype=dtype, attn_implementation="sdpa")
        except Exception as e:  # transformers raises many types; the message is what the user needs
            raise ModelLoadError(f"could not load the checkpoint {str(self.path)!r}: {e}") from e
        gen = self.generation_config()
        if gen is not None:  # else the config's own
            model.generation_config = gen
        rotary = model.model.rotary_emb
        model.model.rotary_emb = type(rotary)(config=model.config)  # outside the meta context: on the CPU
        if self.gguf is not None:
            self.gguf.rotary(model)  # Llama 3's rope scaling, which a GGUF holds as a tensor
        return model.eval()

    def tensors(self, model: torch.nn.Module):
        """The tensors of `model` (its skeleton) as the packing reads them: the folder's TensorFiles, or the GGUF
        file's under the model's names; None for a WHOLE source."""
        if self.gguf is not None:
            files = self.gguf.tensors(model.config.num_hidden_layers)
            files.expect({name: p.shape for name, p in model.named_parameters()})
            return files
        return self._files

    def embedding_dtype(self) -> torch.dtype:
        """The dtype the native forward keeps the embedding in: as stored where float32 or bfloat16, else float32
        (a GGUF's: de-quantized)."""
        if self._files is None:
            return torch.float32
        return kept_dtype(self._files.dtype("model.embed_tokens.weight"))


@functools.lru_cache(maxsize=8)
def _opened(path: str, version: tuple) -> Source:
    del version  # the key: a checkpoint rewritten in place is read again
    return Source(Path(path))


def _version(p: Path) -> tuple:
    """What changes when a checkpoint is rewritten: the sizes and times of the files a Source reads first."""
    files = [p] if p.is_file() else [p / n for n in ("config.json", INDEX, SINGLE)] + sorted(p.glob("*.gguf"))
    return tuple((f.name, st.st_size, st.st_mtime_ns) for f in files if f.exists() for st in [f.stat()])


def open_source(path: str | Path) -> Source:
    """The checkpoint at path (a folder or a .gguf file), opened once per version; ModelLoadError with the reason
    where it cannot be served."""
    p = Path(path).resolve()
    return _opened(str(p), _version(p))
