"""A GGUF file as a checkpoint, read as it comes: its config and tokenizer from its metadata (transformers' GGUF
reader), its tensors one at a time from the memory-mapped file (the gguf package), under the names of the
transformers model (gguf's own name map).

What each block type becomes (packed.py chooses per product, under the `weights` setting):
- Q4_K: int4.py's form holds its blocks exactly (4-bit codes, 6-bit sub-scales and mins, fp16 super-scales: the
  same two-level scales in groups of 32 and super-blocks of 8), so under `weights` auto and int4 a product whose
  parts are all Q4_K keeps the file's weights bit for bit: int4(name) unpacks them, no second rounding.
- Every other type (Q4_0, Q4_1, Q5_0, Q5_K, Q6_K, Q8_0, F16, BF16, F32): de-quantized to float32 by the gguf
  package (exact: the file's values), then packed in the product's form: int8 with a scale per output row under
  `weights` auto (a second rounding, of 255 levels per row against the file's 31-255 per block: the closest form
  the kernels have), int4 under `weights int4` (a second rounding to 4 bits).
Norms, biases and the embedding are read as float32 (the embedding's rows exactly the file's values).

Architectures read directly: qwen2, whose GGUF tensors are the transformers tensors renamed (tested against
transformers' reading of the file); llama's converter permutes q and k rows, so other architectures are loaded
whole by transformers' own GGUF loader (de-quantized to the load dtype), as a folder of .bin files is, and under
`weights auto` packed in int8 throughout (ModuleTensors.int4 finds no blocks to keep).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError
from .int4 import GROUP, SUPER, Int4Weight

SUFFIX = ".gguf"
STORED = "gguf"  # runner weights: per product, int4 where the file's blocks are all Q4_K, else int8 (packed.py)
ROWS = 4096  # rows de-quantized at a time
DIRECT = ("qwen2",)  # general.architecture values whose tensors are read one at a time


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a checkpoint path names: the path itself (a .gguf file), or a folder's only .gguf where the
    folder has no other weights (safetensors or .bin); None otherwise."""
    p = Path(path)
    if p.is_file():
        return p if p.suffix == SUFFIX else None
    if not p.is_dir() or any(p.glob("*.safetensors")) or any(p.glob("*.bin")):
        return None
    found = sorted(p.glob(f"*{SUFFIX}"))
    return found[0] if len(found) == 1 else None


def pretrained(path: str | Path) -> tuple[str, dict]:
    """A checkpoint path as transformers' from_pretrained takes it: (folder, {"gguf_file": name}) for a GGUF,
    (path, {}) otherwise."""
    f = gguf_file(path)
    return (str(path), {}) if f is None else (str(f.parent), {"gguf_file": f.name})


@functools.lru_cache(maxsize=8)
def _config(file: str, mtime: float):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(Path(file).parent), gguf_file=Path(file).name)


def config_of(path: str | Path):
    """The transformers config of a checkpoint (a GGUF's parsed once per file: its metadata takes seconds)."""
    from transformers import AutoConfig

    f = gguf_file(path)
    if f is None:
        return AutoConfig.from_pretrained(path)
    return copy.deepcopy(_config(str(f), f.stat().st_mtime))


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


def _quant_type(name: str):
    import gguf

    return gguf.GGMLQuantizationType[name]


class GGUFTensors:
    """A GGUF file's tensors under transformers' names, read on demand (what ModuleTensors reads of a TensorFiles:
    names, shapes, get; every tensor reads as float32), and int4() for those whose blocks int4.py holds exactly."""

    copies = True  # get() returns a tensor of its own (de-quantized), never a view of the file

    def __init__(self, file: Path, layers: int):
        import gguf

        self.path = file
        try:
            reader = gguf.GGUFReader(str(file))
        except Exception as e:
            raise ModelLoadError(f"could not read the GGUF file {str(file)!r}: {e}") from e
        field = reader.fields["general.architecture"]
        self.arch = bytes(field.parts[field.data[0]]).decode()
        # the tensors (views of the file's mapping) only: the reader's parsed metadata (a 151k-token vocabulary's
        # strings as numpy arrays: 0.4 GB for Qwen2.5) goes with it
        self.by_gguf = {t.name: t for t in reader.tensors}
        del reader
        if self.arch not in DIRECT:
            raise ModelLoadError(f"GGUF architecture {self.arch!r} is not read directly")
        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[self.arch]
        self.names = gguf.get_tensor_name_map(arch, layers)
        self.meta: dict[str, tuple[tuple[int, ...], str]] = {}

    def gguf_name(self, name: str) -> str | None:
        """transformers' tensor name -> the file's (None: no such tensor)."""
        module, _, what = name.rpartition(".")
        mapped = self.names.get_name(module)
        return None if mapped is None or f"{mapped}.{what}" not in self.by_gguf else f"{mapped}.{what}"

    def expect(self, names: dict[str, tuple[int, ...]]) -> None:
        """Record the model's tensor names and shapes that the file holds (meta, as TensorFiles has it; the
        file's shapes are reversed: GGUF lists the fastest dimension first)."""
        for name in names:
            g = self.gguf_name(name)
            if g is not None:
                t = self.by_gguf[g]
                self.meta[name] = (tuple(int(d) for d in reversed(t.shape.tolist())), "F32")

    def __contains__(self, name: str) -> bool:
        return name in self.meta

    def block_type(self, name: str) -> str:
        return self.by_gguf[self.gguf_name(name)].tensor_type.name

    def get(self, name: str, own: bool = False) -> torch.Tensor:
        """The tensor as float32, the file's values (de-quantized by the gguf package); always a copy of its own."""
        from gguf.quants import dequantize

        del own
        if name not in self.meta:
            raise ModelLoadError(f"{self.path}: the GGUF file has no tensor for {name!r}")
        t = self.by_gguf[self.gguf_name(name)]
        shape = self.meta[name][0]
        out = torch.empty(shape, dtype=torch.float32)
        rows = out.view(-1, shape[-1]) if len(shape) > 1 else out.view(1, -1)
        data = self._data(t).reshape(rows.shape[0], -1)  # a row of blocks (or of values) per output row
        for i in range(0, rows.shape[0], ROWS):  # in pieces: the package's temporaries stay small
            rows[i : i + ROWS] = torch.from_numpy(dequantize(data[i : i + ROWS], t.tensor_type).astype(np.float32))
        return out

    def _data(self, t) -> np.ndarray:
        """Tensor t's bytes as the reader types them, from a mapping of its own: its pages leave this process with
        the array (the reader's mapping of the whole file would keep every page read resident until the load
        ends: a 1 GB file's worth on top of the packed weights)."""
        return np.memmap(self.path, dtype=t.data.dtype, mode="r", offset=int(t.data_offset), shape=t.data.shape)

    def rows(self, name: str) -> LazyRows:
        """The weight as LazyRows: de-quantized a block of rows at a time as the quantizer asks (the head's 152k
        rows are never all float32 at once)."""
        from gguf.quants import dequantize

        t, shape = self.by_gguf[self.gguf_name(name)], self.meta[name][0]
        data = self._data(t).reshape(shape[0], -1)

        def read(index: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(dequantize(data[index.numpy()], t.tensor_type).astype(np.float32))

        return LazyRows(shape, read)

    def int4(self, name: str) -> Int4Weight | None:
        """The weight's Q4_K blocks in int4.py's form, exactly (None: stored as another type)."""
        from gguf.quants import Q4_K

        t = self.by_gguf[self.gguf_name(name)]
        if t.tensor_type.name != "Q4_K":
            return None
        n, k = self.meta[name][0]
        blocks = self._data(t).reshape(n * k // 256, 144)  # 256 weights per block: d, dmin, scales, codes
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(n, -1)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(n, -1)
        sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [blocks, 8] each: the 6-bit sub-scales and mins
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32)  # 4 chunks of 32 bytes: low nibbles one group, high the next
        codes = (qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
        groups = k // GROUP
        assert groups % SUPER == 0  # Q4_K rows are whole 256-weight blocks
        return Int4Weight(
            torch.from_numpy(codes.reshape(n, k).copy()),
            torch.from_numpy(np.ascontiguousarray(sc.reshape(n, groups), dtype=np.uint8)),
            torch.from_numpy(np.ascontiguousarray(mn.reshape(n, groups), dtype=np.uint8)),
            torch.from_numpy(d),
            torch.from_numpy(dmin),
            k,
        )
