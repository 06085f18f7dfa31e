"""Which forward runs a model: ForwardChoice, the record a ModelRunner is built from, and `choose`, the one place
that decides it and says why a setting cannot hold.

Two forwards compute the same function (runner.py): the native CPU forward (our kernels: weights streamed at the
memory bound, bitwise batch-invariant, the only one that runs int8 weights or a bfloat16 KV cache) and
PyTorch's (transformers' modules: any device, the CUDA-graph path). `linear` "auto" takes the native one where
it runs: a CPU whose kernels build (x86-64 with AVX-512, or AVX2 + FMA, and gcc), a float32 or bfloat16 model
whose architecture it covers (`native_gap`), plain float nn.Linear projections (not a dynamic-quantized copy),
and no static width (the CUDA-graph path is PyTorch's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KV_DTYPES, LINEAR_KINDS
from ..errors import ModelLoadError
from . import families, int4, kernels
from .families import describe
from .gguf_checkpoint import STORED
from .int8 import ACTIVATIONS, BLOCKS, DYNAMIC, RUNNER_WEIGHTS

NATIVE_DTYPES = (torch.float32, torch.bfloat16)  # weights the native products read as they are


@dataclass(frozen=True)
class ForwardChoice:
    kind: str  # "native" | "torch"
    lib: object = None  # the kernel library (kernels.load()) when native
    weights: str = "auto"  # RUNNER_WEIGHTS: "auto" (the model's dtype) or an int8 form (int8.py; native only)
    kv_dtype: str = "auto"  # KV_DTYPES: "auto" (the activations' dtype) or "bfloat16" (native only)
    static_width: int = 0  # > 0: the static / CUDA-graph path for forwards of up to this many tokens a row


def native_gap(cfg, dtype: torch.dtype) -> str | None:
    """None if the native forward covers a model of this HF config loaded in `dtype`, else what it lacks."""
    arch = describe(cfg)
    gap = families.native_gap(arch)
    if gap is not None:
        return gap
    if dtype not in NATIVE_DTYPES:
        return f"dtype {dtype} (float32 or bfloat16 weights are read)"
    return None


def served_form(setting: str, lib, target: bool = True) -> str:
    """The runner weights that a `weights` (target) or `draft_quantization` (target=False) setting (int8, int4)
    means on library `lib`."""
    return int8_form(lib, target) if setting == "int8" else setting


def int8_form(lib, target: bool = True) -> str:
    """The runner weights that int8 means on kernel library `lib`. Where the CPU has VNNI: a target's int8 weights
    take their activations in int8 per block of 256 inputs (int8-blocks: one integer product per 4 inputs, so that
    a verify of many rows stays near a decode's cost), a draft copy's in int16 per row (int8-dynamic: as accurate as
    fp32 activations, for drafts that follow the target closely; a copy's forwards are one row per request). Without
    VNNI: fp32 activations (int8.py)."""
    if lib is None or not kernels.has_vnni(lib):
        return "int8"
    return BLOCKS if target else DYNAMIC


def choose(
    cfg,
    device: torch.device,
    dtype: torch.dtype,
    linear: str = "auto",
    weights: str = "auto",
    kv_dtype: str = "auto",
    static_width: int = 0,
    plain: bool = True,
) -> ForwardChoice:
    """The forward for a model of HF config `cfg` on `device` in `dtype` under these settings (plain: its
    projections are float nn.Linear modules). ModelLoadError, naming the setting, where one cannot hold."""
    if linear not in LINEAR_KINDS:
        raise ModelLoadError(f"linear must be one of {', '.join(LINEAR_KINDS)}, got {linear!r}")
    forms = dict.fromkeys((*RUNNER_WEIGHTS, *int4.FORMS, STORED))
    if weights not in forms:
        raise ModelLoadError(f"weights must be one of {', '.join(forms)}, got {weights!r}")
    if kv_dtype not in KV_DTYPES:
        raise ModelLoadError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    kind, lib, why = _native(cfg, device, dtype, linear, static_width, plain)
    if kind != "native":
        if linear == "native":
            raise ModelLoadError(f"the native CPU forward does not run here: {why} (use linear auto or torch)")
        for name, value in (("weights", weights), ("kv_cache_dtype", kv_dtype)):
            if value != "auto":
                raise ModelLoadError(
                    f"{name} {value} runs on the native CPU forward only (device cpu, linear auto or "
                    f"native, cuda_graphs off, a float32 or bfloat16 checkpoint it covers), which "
                    f"does not run here: {why}"
                )
    if weights in ACTIVATIONS and not kernels.has_vnni(lib):
        raise ModelLoadError(
            f"weights {weights} needs VNNI ({kernels.VNNI_FLAGS[lib.isa]} for the {lib.isa} "
            f"kernels), which this CPU lacks or {kernels.VNNI_ENV}=0 turns off"
        )
    return ForwardChoice(kind, lib, weights, kv_dtype, static_width)


def _native(cfg, device, dtype, linear, static_width, plain) -> tuple[str, object, str]:
    """-> ("native", lib, "") where the native forward may run, else ("torch", None, why not)."""
    if linear == "torch":
        return "torch", None, "linear is torch"
    if device.type != "cpu":
        return "torch", None, f"device {device}"
    if static_width:
        return "torch", None, "cuda_graphs is on (its static path is PyTorch's)"
    if not plain:
        return "torch", None, "the projections are not float nn.Linear modules"
    gap = native_gap(cfg, dtype)
    if gap is not None:
        return "torch", None, f"the native forward does not cover this model ({gap})"
    lib = kernels.load()
    if lib is None:
        return "torch", None, "its kernels are not available (needs AVX-512 or AVX2 + FMA, and a C compiler)"
    return "native", lib, ""


def choose_for(
    model: torch.nn.Module, linear: str = "auto", weights: str = "auto", kv_dtype: str = "auto", static_width: int = 0
) -> ForwardChoice:
    """choose() for a loaded transformers model (its config, device, dtype and projection modules)."""
    param = next(model.parameters())
    plain = all(type(m) is torch.nn.Linear for m in projections(model))
    return choose(model.config, param.device, param.dtype, linear, weights, kv_dtype, static_width, plain)


def projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' weight matmuls of one forward, in order (the lm_head last); q|k|v and gate|up are one
    module each where the checkpoint fuses them (phi3)."""
    out, fused = [], describe(model.config).fused_projections
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        qkv = [a.qkv_proj] if fused else [a.q_proj, a.k_proj, a.v_proj]
        gate_up = [mlp.gate_up_proj] if fused else [mlp.gate_proj, mlp.up_proj]
        out += [*qkv, a.o_proj, *gate_up, mlp.down_proj]
    return out + [model.lm_head]
