"""The structs that specgram_decoder_forward (forward.c) reads, as ctypes mirrors: same fields, same order, same C
types, so ctypes lays them out as the compiler does. A model's are built once at load (native.py) and hold raw
addresses of its packed weights: the tensors they point into must outlive them (the NativeForward keeps both)."""
from __future__ import annotations

import ctypes

# specgram_linear.kind
LIN_F32, LIN_BF16, LIN_I8, LIN_I8A8 = 0, 1, 2, 3

_P = ctypes.c_void_p


class Linear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("digits", ctypes.c_int32), ("K", ctypes.c_int64), ("N", ctypes.c_int64),
                ("w", _P), ("scale", _P), ("colsum", _P), ("bias", _P)]


class Layer(ctypes.Structure):
    _fields_ = [("qkv", Linear), ("o", Linear), ("gate_up", Linear), ("down", Linear), ("w_post", _P),
                ("w_next", _P), ("eps_post", ctypes.c_float), ("eps_next", ctypes.c_float)]


class Decoder(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_int64), ("E", ctypes.c_int64), ("H", ctypes.c_int64), ("Hkv", ctypes.c_int64),
                ("D", ctypes.c_int64), ("I", ctypes.c_int64), ("w_in", _P), ("eps_in", ctypes.c_float),
                ("scaling", ctypes.c_float), ("layer", ctypes.POINTER(Layer)), ("embed", _P), ("vocab", ctypes.c_int64),
                ("embed_bf16", ctypes.c_int32)]


# specgram_decoder_forward's return codes: what is wrong with the batch (nothing has been written)
BAD_TOKEN, BAD_SLOT, BAD_POSITION, BAD_ROW, BAD_HEAD_ROW = 1, 2, 3, 4, 5
