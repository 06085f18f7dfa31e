"""A GGUF file as a checkpoint, read as it comes and opened once: its header (gguf_format.py), the transformers
config of the model it was converted from and its tokenizer, both from its metadata (gguf_families.py), and its
tensors one at a time from the file under the transformers model's names, with the converter's changes undone
(q and k rows put back in order, norm offsets taken off).

What each block type becomes (packed.py chooses per product, under the `weights` setting):
- Q4_K: int4.py's form holds its blocks exactly (4-bit codes, 6-bit sub-scales and mins, fp16 super-scales: the
  same two-level scales in groups of 32 and super-blocks of 8), so under `weights` auto and int4 a product whose
  parts are all Q4_K keeps the file's weights bit for bit: int4(name) unpacks them, no second rounding (q and k
  rows reordered whole: a row's blocks move with it).
- Every other type is de-quantized to float32, exactly the file's values (Q4_0, Q5_0, Q5_K, Q6_K, Q8_0 in torch
  by gguf_blocks.py; Q4_1, Q5_1, Q2_K, Q3_K, the IQ types, F16, BF16, F32 by the gguf package), then packed in the
  product's form: int8 with a scale per output row under `weights` auto (a second rounding, of 255 levels per row
  against the file's 31-255 per block: the closest form the kernels have), int4 under `weights int4` (a second
  rounding to 4 bits).
Norms, biases and the embedding are read as float32 (the embedding's rows exactly the file's values).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError
from . import gguf_blocks, gguf_families
from .gguf_format import GGUFError, GGUFHeader, read_header
from .int4 import GROUP, SUPER, Int4Weight

SUFFIX = ".gguf"
STORED = "gguf"  # runner weights: per product, int4 where the file's blocks are all Q4_K, else int8 (packed.py)
ROWS = 4096  # rows de-quantized at a time
PROJECTOR = "mmproj"  # a vision projector's file name holds this (llama.cpp's multimodal GGUFs)
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens",)  # read as lists (the vocabulary size, the tokenizer's checks)


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a checkpoint path names: the path itself (a .gguf file), or a folder's model .gguf where the
    folder has no other weights (safetensors or .bin) and one .gguf besides any vision projector (mmproj); None
    otherwise. ModelLoadError for a folder of several model files (it names them: the checkpoint must name one)."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix == SUFFIX else None
    if not p.is_dir() or any(p.glob("*.safetensors")) or any(p.glob("*.bin")):
        return None
    found = sorted(f for f in p.glob(f"*{SUFFIX}") if PROJECTOR not in f.name.lower())
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ModelLoadError(f"{p} holds several GGUF models ({names}): set the checkpoint to the file to serve")
    return found[0] if found else None


class GGUFCheckpoint:
    """One GGUF file, its header read once (checkpoint(path) keeps one per file and version): the config, the
    tokenizer, the tensors."""

    def __init__(self, file: Path):
        self.file = file
        self.header: GGUFHeader = read_header(file, TOKENIZER_ARRAYS)
        self.family = gguf_families.family(self.header)
        cfg = gguf_families.config_dict(self.header)
        self._rope_factors(cfg)
        from transformers import AutoConfig

        try:
            self._config = AutoConfig.for_model(**cfg)
        except Exception as e:  # transformers validates the values; its message names the one it refused
            raise GGUFError(f"{file}: its metadata makes no valid {cfg['model_type']} config: {e}") from e

    def config(self):
        return copy.deepcopy(self._config)  # callers set attributes on theirs

    def _vector(self, name: str) -> list[float]:
        t = self.header.tensors[name]
        if t.type_name != "F32" or len(t.shape) != 1:
            raise GGUFError(f"{self.file}: tensor {name!r} is {t.type_name} {list(t.shape)}; F32 [n] expected")
        return np.fromfile(self.file, dtype=np.float32, count=t.shape[0], offset=t.offset).tolist()

    def _rope_factors(self, cfg: dict) -> None:
        """Phi-3's longrope factors, which the converter moved from the config into tensors, back into it."""
        t = self.header.tensors
        if "rope_factors_long.weight" in t and "rope_factors_short.weight" in t:
            cfg["rope_parameters"]["long_factor"] = self._vector("rope_factors_long.weight")
            cfg["rope_parameters"]["short_factor"] = self._vector("rope_factors_short.weight")

    def rotary(self, model: torch.nn.Module) -> None:
        """Llama 3's rope scaling as the file holds it: a divisor per frequency (rope_freqs), applied to the model's
        plain rotary frequencies (the converter computed the divisors from the config's llama3 parameters)."""
        if "rope_freqs.weight" not in self.header.tensors:
            return
        divisors = torch.tensor(self._vector("rope_freqs.weight"), dtype=torch.float32)
        rotary = model.model.rotary_emb
        if divisors.shape != rotary.inv_freq.shape:
            raise GGUFError(
                f"{self.file}: rope_freqs has {len(divisors)} values for {len(rotary.inv_freq)} frequencies"
            )
        rotary.inv_freq = rotary.inv_freq / divisors
        rotary.original_inv_freq = rotary.inv_freq

    def tokenizer(self):
        """The file's tokenizer, built by transformers from the metadata (its class by model_type, as AutoTokenizer
        would choose it, without AutoTokenizer's reading the whole file's metadata for a config first)."""
        from transformers import TokenizersBackend
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

        name = TOKENIZER_MAPPING_NAMES.get(self.family.model_type)
        cls = (tokenizer_class_from_name(name) if name else None) or TokenizersBackend
        return cls.from_pretrained(str(self.file.parent), gguf_file=self.file.name)

    def tensors(self, layers: int) -> GGUFTensors:
        return GGUFTensors(self, layers)


@functools.lru_cache(maxsize=4)
def _opened(file: str, mtime: float, size: int) -> GGUFCheckpoint:
    del mtime, size  # the key: a file replaced in place is read again
    return GGUFCheckpoint(Path(file))


def checkpoint(path: str | Path) -> GGUFCheckpoint:
    """The GGUF checkpoint at path (a .gguf file, or a folder holding one), its header read once per version."""
    f = gguf_file(path)
    if f is None:
        raise ModelLoadError(f"{path} is not a GGUF file")
    st = f.stat()
    return _opened(str(f.resolve()), st.st_mtime, st.st_size)


def _rows(data: np.ndarray) -> torch.Tensor:
    """A tensor's rows of bytes (a mapping of the file, or rows picked from one) as a u8 tensor of its own: the
    file's pages read once into it, the mapping left read-only."""
    return torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))


class LazyRows:
    """A [N, K] matrix that a quantizer reads a block of rows at a time (int8.quantize_rows, int4.quantize: they use
    .shape and [i:j] only): each block is read(index) -> float32 [len(index), K] when asked for; w[index] (a long
    tensor: a draft's reduced head) picks rows without reading any."""

    def __init__(self, shape: tuple[int, int], read, index: torch.Tensor | None = None):
        self._read, self._index = read, index
        self.shape = (shape[0] if index is None else len(index), shape[1])

    def __getitem__(self, key) -> torch.Tensor | LazyRows:
        if isinstance(key, torch.Tensor):
            return LazyRows(self.shape, self._read, key if self._index is None else self._index[key])
        i, j, step = key.indices(self.shape[0])
        assert step == 1, "blocks of rows only"
        return self._read(torch.arange(i, j) if self._index is None else self._index[i:j])


class GGUFTensors:
    """A GGUF file's tensors under transformers' names, read on demand (what ModuleTensors reads of a TensorFiles:
    names, shapes, get; every tensor reads as float32), and int4() for those whose blocks int4.py holds exactly.
    Each read undoes the converter's change to that tensor (gguf_families.py)."""

    copies = True  # get() returns a tensor of its own (de-quantized), never a view of the file

    def __init__(self, source: GGUFCheckpoint, layers: int):
        import gguf

        self.path, self.source = source.file, source
        self.by_gguf = source.header.tensors
        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[source.header.arch]
        self.names = gguf.get_tensor_name_map(arch, layers)
        self.meta: dict[str, tuple[tuple[int, ...], str]] = {}
        cfg = source._config
        self._heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}

    def gguf_name(self, name: str) -> str | None:
        """transformers' tensor name -> the file's (None: no such tensor)."""
        module, _, what = name.rpartition(".")
        mapped = self.names.get_name(module)
        return None if mapped is None or f"{mapped}.{what}" not in self.by_gguf else f"{mapped}.{what}"

    def expect(self, names: dict[str, tuple[int, ...]]) -> None:
        """Record the model's tensor names and shapes that the file holds (meta, as TensorFiles has it)."""
        for name in names:
            g = self.gguf_name(name)
            if g is not None:
                self.meta[name] = (self.by_gguf[g].shape, "F32")

    def __contains__(self, name: str) -> bool:
        return name in self.meta

    def block_type(self, name: str) -> str:
        return self.by_gguf[self.gguf_name(name)].type_name

    def _order(self, name: str) -> torch.Tensor | None:
        """The file's row of each of the tensor's rows where the converter reordered them (q and k of the
        families whose converter is llama's), else None."""
        module = name.rpartition(".")[0].rpartition(".")[2]
        if not self.source.family.unpermute or module not in self._heads:
            return None
        return gguf_families.unpermute_rows(self.meta[name][0][0], self._heads[module])

    def _offset(self, name: str) -> float:
        return self.source.family.norm_offset if "norm" in name.rpartition(".")[0].rpartition(".")[2] else 0.0

    def _data(self, name: str) -> np.ndarray:
        """The tensor's bytes (a row of blocks, or of values, per output row: [rows, bytes]) from a mapping of its
        own: its pages leave this process with the array (one mapping of the whole file would keep every page read
        resident until the load ends: a 1 GB file's worth on top of the packed weights)."""
        t = self.by_gguf[self.gguf_name(name)]
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(rows, t.nbytes // rows))

    def _decode(self, name: str, data: np.ndarray) -> torch.Tensor:
        """Rows of the tensor's bytes -> float32 rows (the file's values, the norm offset taken off)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self.by_gguf[self.gguf_name(name)]
        if t.type_name in gguf_blocks.DECODERS:  # the common types in torch, on its threads
            out = gguf_blocks.decode(t.type_name, _rows(data))
        else:  # the others by the package; a copy: an F32 tensor's would be a view of the file
            out = torch.from_numpy(dequantize(data, GGMLQuantizationType(t.type_id)).astype(np.float32))
        offset = self._offset(name)
        return out - offset if offset else out

    def get(self, name: str, own: bool = False) -> torch.Tensor:
        """The tensor as float32, the file's values (de-quantized: _decode), in the transformers
        model's row order; always a copy of its own."""
        del own
        if name not in self.meta:
            raise ModelLoadError(f"{self.path}: the GGUF file has no tensor for {name!r}")
        shape = self.meta[name][0]
        data, order = self._data(name), self._order(name)
        if len(shape) == 1:  # a norm or a bias (a q or k bias reordered as its rows are)
            v = self._decode(name, data).reshape(-1)
            return v.clone() if order is None else v[order]
        out = torch.empty(shape, dtype=torch.float32)
        rows = out.view(-1, shape[-1])
        for i in range(0, rows.shape[0], ROWS):  # in pieces: the package's temporaries stay small
            pick = slice(i, i + ROWS) if order is None else order[i : i + ROWS].numpy()
            rows[i : i + ROWS] = self._decode(name, data[pick]).reshape(-1, rows.shape[1])
        return out

    def rows(self, name: str) -> LazyRows:
        """The weight as LazyRows: de-quantized a block of rows at a time as the quantizer asks (the head's 152k
        rows are never all float32 at once)."""
        shape, data, order = self.meta[name][0], self._data(name), self._order(name)

        def read(index: torch.Tensor) -> torch.Tensor:
            return self._decode(name, data[(index if order is None else order[index]).numpy()])

        return LazyRows(shape, read)

    def int4(self, name: str) -> Int4Weight | None:
        """The weight's Q4_K blocks in int4.py's form, exactly (None: stored as another type)."""
        if name not in self.meta or self.block_type(name) != "Q4_K":
            return None
        n, k = self.meta[name][0]
        data, order = self._data(name), self._order(name)
        blocks = _rows(data if order is None else data[order.numpy()]).view(-1, 144)  # rows moved whole; 256 a block
        d, dmin, sc, mn, codes = gguf_blocks.q4_k_fields(blocks)  # per block: scales, 6-bit sub-scales and mins
        assert (k // GROUP) % SUPER == 0  # Q4_K rows are whole 256-weight blocks
        return Int4Weight(
            codes.reshape(n, k),
            sc.reshape(n, -1),
            mn.reshape(n, -1),
            d.reshape(n, -1),
            dmin.reshape(n, -1),
            k,
        )
