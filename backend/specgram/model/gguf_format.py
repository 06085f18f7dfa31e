"""A GGUF file's header: its metadata and its tensor table, read once, checked against the file's size.

Why not the gguf package's GGUFReader: it makes a numpy view per element of every metadata array (a 151k-token
vocabulary and its 151k merges are ~600k views: seconds and ~0.4 GB), where a load needs a few dozen scalars and,
for the tokenizer, the two string arrays as Python strings. The format is small (llama.cpp's gguf.h: magic, version,
counts, key-value pairs, then per tensor its name, dimensions, type and offset, the data aligned after); the gguf
package still names the block types, gives their sizes and de-quantizes them.

Every problem is a GGUFError (a ModelLoadError) that names the file and, where it is one tensor's, the tensor.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

from ..errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 (2023) counted in 32 bits; llama.cpp has written v3 since
ALIGNMENT = 32  # general.alignment's default
# metadata value types (gguf.h): fixed-size scalars by struct format; 8 string, 9 array
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
FLOATS = {0: "F32", 1: "F16", 30: "BF16"}  # the type ids that hold values, not blocks


class GGUFError(ModelLoadError):
    """A GGUF file this engine cannot read, with the reason in words."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: the file lists the fastest dimension first
    type_id: int
    type_name: str  # gguf's name of the block type ("Q4_K", "F32", ...)
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    metadata: dict  # key -> value; string arrays as lists only for the keys asked for, else their length
    tensors: dict[str, TensorInfo]

    @property
    def arch(self) -> str:
        return self.metadata["general.architecture"]

    def get(self, key: str, default=None):
        """A metadata value by its key after the architecture's prefix ("attention.head_count")."""
        return self.metadata.get(f"{self.arch}.{key}", default)


class _Cursor:
    """Reads little-endian values from a mapped file, with a GGUFError (not struct's) where the file ends."""

    def __init__(self, data, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def need(self, size: int) -> None:
        """GGUFError where fewer than `size` bytes are left."""
        if self.pos + size > len(self.data):
            raise GGUFError(f"{self.path}: the file ends inside its header (at byte {self.pos}): truncated")

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        self.need(size)
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        n = self.take("Q")
        self.need(n)
        raw = self.data[self.pos : self.pos + n]  # bytes (a slice of the mapping is a copy)
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: a header string is not UTF-8 (at byte {self.pos - n}): corrupt") from e

    def skip_string(self) -> None:
        n = self.take("Q")  # first: `self.pos += self.take(...)` would add to the position before the read
        self.pos += n

    def value(self, kind: int, keep: bool):
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in SCALARS:
                fmt, size = SCALARS[item], count * struct.calcsize(SCALARS[item])
                self.need(size)
                values = list(struct.unpack_from(f"<{count}{fmt}", self.data, self.pos))
                self.pos += size
                return values
            if item == STRING:
                if keep:
                    return [self.string() for _ in range(count)]
                for _ in range(count):
                    self.skip_string()
                return count
        raise GGUFError(f"{self.path}: a metadata value of unknown type {kind} (at byte {self.pos}): corrupt")


def _type(type_id: int, tensor: str, path: Path) -> tuple[str, int, int]:
    """-> (name, values per block, bytes per block) of a ggml type id; GGUFError naming the tensor for one that
    the gguf package does not know or cannot de-quantize."""
    import gguf
    from gguf.quants import _type_traits  # the types the package de-quantizes (besides F32 / F16 / BF16)

    try:
        t = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        raise GGUFError(f"{path}: tensor {tensor!r} has block type code {type_id}, which is unknown") from None
    if type_id not in FLOATS and t not in _type_traits:
        raise GGUFError(f"{path}: tensor {tensor!r} is stored as {t.name}, a block type this engine cannot read")
    block, size = gguf.GGML_QUANT_SIZES[t]
    return t.name, block, size


def read_header(path: str | Path, string_arrays: tuple[str, ...] = ()) -> GGUFHeader:
    """The header of the GGUF file at `path`: every metadata value (the string arrays named in `string_arrays` as
    lists, other string arrays as their length) and every tensor's place, each checked to lie within the file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            if size < 24:
                raise GGUFError(f"{path}: {size} bytes: too short to be a GGUF file")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GGUFError(f"could not read {path}: {e}") from e
    try:
        return _parse(data, path, size, string_arrays)
    finally:
        data.close()


def _parse(data, path: Path, size: int, string_arrays: tuple[str, ...]) -> GGUFHeader:
    if data[:4] != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
    c = _Cursor(data, path)
    c.pos = 4
    version = c.take("I")
    if version not in VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version}; this engine reads versions {VERSIONS[0]}-{VERSIONS[-1]}")
    n_tensors, n_kv = c.take("Q"), c.take("Q")
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.take("I"), key in string_arrays)
    if "general.architecture" not in metadata:
        raise GGUFError(f"{path}: the file names no architecture (general.architecture)")
    table = []
    for _ in range(n_tensors):
        name = c.string()
        dims = c.take(f"{c.take('I')}Q")
        dims = dims if isinstance(dims, tuple) else (dims,)
        table.append((name, tuple(reversed(dims)), c.take("I"), c.take("Q")))
    align = int(metadata.get("general.alignment", ALIGNMENT))
    start = (c.pos + align - 1) // align * align
    tensors = {}
    for name, shape, type_id, offset in table:
        type_name, block, bsize = _type(type_id, name, path)
        n = prod(shape)
        if shape and shape[-1] % block:
            raise GGUFError(f"{path}: tensor {name!r} {list(shape)} is not whole blocks of {block} ({type_name})")
        nbytes = n // block * bsize
        end = start + offset + nbytes
        if end > size:
            raise GGUFError(
                f"{path}: tensor {name!r} ends {end - size} bytes past the end of the file ({size} bytes): "
                "the file is truncated (an interrupted download or copy?)"
            )
        tensors[name] = TensorInfo(name, shape, type_id, type_name, start + offset, nbytes)
    return GGUFHeader(path, metadata, tensors)
