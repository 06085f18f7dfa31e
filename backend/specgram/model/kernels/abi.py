"""The library's contract, read from its one declaration, specgram.h: the entry points' ctypes signatures, the
structs that specgram_decoder_forward reads as ctypes mirrors (same fields, same order, same C types, so ctypes
lays them out as the compiler does: the tests compare the sizes with specgram_abi_sizes), and the constants.
Nothing here is written twice: a field or an argument changes in specgram.h only.

A model's structs are built once at load (native.py) and hold raw addresses of its packed weights: the tensors
they point into must outlive them (the NativeForward keeps both).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

HEADER = Path(__file__).with_name("specgram.h")

_SCALARS = {
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "size_t": ctypes.c_size_t,
}
_DECL = re.compile(r"^(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)$")  # one parameter or field: [const] type [*] name


def _text() -> str:
    return re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)


def _type(base: str, pointer: bool, structs: dict, field: bool):
    """The ctypes type of a declared C type: pointers are c_void_p, but a struct's pointer to another struct is
    a POINTER to its mirror (assigned a ctypes array), and a returned `char *` is c_char_p."""
    if pointer:
        if field and base in structs:
            return ctypes.POINTER(structs[base])
        return ctypes.c_char_p if base == "char" else ctypes.c_void_p
    if base in structs:
        return structs[base]
    if base == "void":
        return None
    return _SCALARS[base]


def _parse():
    text = _text()
    constants = {m[1]: int(m[2]) for m in re.finditer(r"#define\s+SPECGRAM_(\w+)\s+(-?\d+)\b", text)}
    structs: dict[str, type] = {}
    for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(specgram_\w+)\s*;", text, flags=re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            head, *more = decl.split(",")
            m = re.match(r"^((?:const\s+)?\w+)\s*(.*)$", head.strip())
            base = m[1].split()[-1]
            for one in (m[2], *more):
                star, fname = re.match(r"^\s*(\*?)\s*(\w+)\s*$", one).groups()
                fields.append((fname, _type(base, bool(star), structs, field=True)))
        structs[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
    functions = {}
    for ret, star, name, params in re.findall(r"(?:const\s+)?(\w+)\s*(\*?)\s*(specgram_\w+)\s*\(([^)]*)\)\s*;", text):
        args = []
        for p in (x.strip() for x in params.split(",")):
            if p == "void":
                continue
            m = _DECL.match(" ".join(p.split()))
            if m is None:
                raise ValueError(f"{HEADER.name}: cannot read the parameter {p!r} of {name}")
            args.append(_type(m[1], bool(m[2]), structs, field=False))
        functions[name] = (_type(ret, bool(star), structs, field=False), args)
    return constants, structs, functions


CONSTANTS, STRUCTS, FUNCTIONS = _parse()  # FUNCTIONS: name -> (restype, argtypes)

Linear, Layer, Decoder = STRUCTS["specgram_linear"], STRUCTS["specgram_layer"], STRUCTS["specgram_decoder"]
LoraPart, Lora = STRUCTS["specgram_lora_part"], STRUCTS["specgram_lora"]
LORA_MAX_RANK = CONSTANTS["LORA_MAX_RANK"]
LIN_F32, LIN_BF16, LIN_I8, LIN_I8A8 = (CONSTANTS[f"LIN_{k}"] for k in ("F32", "BF16", "I8", "I8A8"))
LIN_I4, LIN_I4_MADD = CONSTANTS["LIN_I4"], CONSTANTS["LIN_I4_MADD"]  # gemm_i4.c's product with VNNI, without
LIN_I8B = CONSTANTS["LIN_I8B"]  # gemm_i8b.c's: int8 weights x int8 activations per block of 256 (VNNI)
ACT_SILU, ACT_GELU_TANH = CONSTANTS["ACT_SILU"], CONSTANTS["ACT_GELU_TANH"]
BAD_TOKEN, BAD_SLOT, BAD_POSITION, BAD_ROW, BAD_HEAD_ROW, BAD_TREE = (
    CONSTANTS[f"BAD_{k}"] for k in ("TOKEN", "SLOT", "POSITION", "ROW", "HEAD_ROW", "TREE")
)


def bind(lib: ctypes.CDLL) -> None:
    """Set every entry point's argtypes and restype on a loaded library (AttributeError where one is missing)."""
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype


def sizes(lib: ctypes.CDLL) -> dict[str, tuple[int, int]]:
    """Each struct -> (its size as the compiler laid it out, its mirror's ctypes size)."""
    out = (ctypes.c_int64 * len(STRUCTS))()
    lib.specgram_abi_sizes(out)
    return {name: (out[i], ctypes.sizeof(s)) for i, (name, s) in enumerate(STRUCTS.items())}
