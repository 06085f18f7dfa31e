"""LoRA adapters: PEFT folders read into low-rank updates of a model's projections, which both forwards apply per
token, each token under its own request's adapter (or none).

A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) holds, for some of the projections, A [r, in]
and B [out, r]: the projection's output becomes W x + (B (A x)) * scale, scale = lora_alpha / r (lora_alpha /
sqrt(r) with use_rslora). Here every update is placed on one of the four products each layer runs (the native
forward fuses q|k|v and gate|up): q_proj's update goes to the q columns of the q|k|v product, and so on.

Who uses which: `Adapters` is the loaded set (index = the adapter's id in a request and in the tables); the runner
keeps each KV slot's adapter (its request's) and maps a forward's tokens to theirs by slot. The native forward
reads `native_table` (kernels/lora.c, specgram.h's specgram_lora); the PyTorch forward adds each update in a
forward hook on its projection module (`TorchHooks`).
"""

from __future__ import annotations

import ctypes
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ModelLoadError
from .families import head_dim
from .kernels import abi

MAX_RANK = abi.LORA_MAX_RANK  # the kernels' per-row scratch
# a PEFT key's projection: (layer, "self_attn" | "mlp", module name, "A" | "B")
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
PRODUCTS = {  # module -> (product: 0 q|k|v, 1 o, 2 gate|up, 3 down; which part of the fused product)
    "q_proj": (0, 0), "k_proj": (0, 1), "v_proj": (0, 2), "qkv_proj": (0, 0),
    "o_proj": (1, 0),
    "gate_proj": (2, 0), "up_proj": (2, 1), "gate_up_proj": (2, 0),
    "down_proj": (3, 0),
}  # fmt: skip


@dataclass
class Part:
    layer: int
    product: int  # PRODUCTS' number
    col: int  # the first output column of the product that it updates
    module: str  # the transformers module it updates, "<layer>.self_attn.q_proj"
    a: torch.Tensor  # [r, in] float32
    bt: torch.Tensor  # B [out, r] transposed: [r, out] float32 (the native kernels' layout; lora.c)
    scale: float


@dataclass
class Adapter:
    name: str
    path: str
    rank: int  # the largest of its parts'
    parts: list[Part] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(p.a.numel() * 4 + p.bt.numel() * 4 for p in self.parts)


def read_multi_lora(path: str) -> dict[str, str]:
    """multi_lora.json ({"<name>": "<PEFT adapter folder>"}, relative to the file's folder or absolute) -> name ->
    absolute folder. ModelLoadError where it cannot be read or is not such an object."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not read the LoRA list {path!r}: {e}") from e
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ModelLoadError(f'{path!r} must be a JSON object {{"<adapter name>": "<PEFT folder>"}}')
    return {name: str((p.parent / folder).resolve()) for name, folder in raw.items()}


def _columns(cfg, product: int, part: int) -> int:
    """The first column of a module's output in its product (q|k|v: q, then k, then v; gate|up: gate, then up)."""
    D = head_dim(cfg)
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    if product == 0:
        return (0, H * D, (H + Hkv) * D)[part]
    return part * cfg.intermediate_size if product == 2 else 0


def read_adapter(name: str, path: str, model: torch.nn.Module, max_rank: int) -> Adapter:
    """A PEFT LoRA folder for `model` -> its Adapter; ModelLoadError naming the adapter and what does not fit (not
    LoRA, DoRA, a module other than the layers' projections, a shape that is not the model's, a rank above
    max_rank)."""
    from safetensors.torch import load_file

    where = f"LoRA adapter {name!r} ({path})"
    try:
        config = json.loads((Path(path) / "adapter_config.json").read_text())
        weights = load_file(str(Path(path) / "adapter_model.safetensors"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{where}: could not read adapter_config.json and adapter_model.safetensors: {e}") from e
    if config.get("peft_type", "LORA") != "LORA":
        raise ModelLoadError(f"{where}: peft_type {config.get('peft_type')!r} (only LORA adapters are served)")
    for key, ok in (("use_dora", False), ("fan_in_fan_out", False)):
        if bool(config.get(key, False)) != ok:
            raise ModelLoadError(f"{where}: {key} is set, which is not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ModelLoadError(f"{where}: rank_pattern / alpha_pattern are not supported (one r and lora_alpha)")
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    layers = model.model.layers
    pairs: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for key, w in weights.items():
        m = _KEY.search(key)
        if m is None or m[3] not in PRODUCTS:
            raise ModelLoadError(f"{where}: {key!r} is not a LoRA update of a layer's attention or MLP projection")
        pairs.setdefault((int(m[1]), m[2], m[3]), {})[m[4]] = w.float().contiguous()
    adapter = Adapter(name, path, 0)
    for (layer, block, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"} or layer >= len(layers):
            raise ModelLoadError(f"{where}: layer {layer}'s {module} needs lora_A and lora_B of a model layer")
        target = getattr(getattr(layers[layer], block), module, None)
        a, b = ab["A"], ab["B"]
        r = a.shape[0]
        if target is None or a.shape != (r, target.in_features) or b.shape != (target.out_features, r):
            raise ModelLoadError(
                f"{where}: layer {layer}'s {module} A {tuple(a.shape)} / B {tuple(b.shape)} do not fit this model"
                + ("" if target is None else f" ({target.in_features} in, {target.out_features} out)")
            )
        if r > max_rank:
            raise ModelLoadError(f"{where}: rank {r} is above max_lora_rank {max_rank}")
        product, part = PRODUCTS[module]
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        col = _columns(model.config, product, part)
        adapter.parts.append(Part(layer, product, col, f"{layer}.{block}.{module}", a, b.T.contiguous(), scale))
        adapter.rank = max(adapter.rank, r)
    if not adapter.parts:
        raise ModelLoadError(f"{where}: no LoRA weights")
    return adapter


class Adapters:
    """The loaded adapters, by name and by index (0, 1, ...: a request's adapter id; -1: none)."""

    def __init__(self, adapters: list[Adapter]):
        self.all = adapters
        self.index = {a.name: i for i, a in enumerate(adapters)}

    def native_table(self, layers: int) -> tuple[abi.Lora, list]:
        """-> the specgram_lora struct the kernels read, and what it points into (keep both alive)."""
        parts, first = [], [0]
        for adapter in self.all:
            by_slot: dict[tuple[int, int], list[Part]] = {}
            for p in adapter.parts:
                by_slot.setdefault((p.layer, p.product), []).append(p)
            for layer in range(layers):
                for product in range(4):
                    parts += by_slot.get((layer, product), [])
                    first.append(len(parts))
        structs = (abi.LoraPart * max(1, len(parts)))()
        for i, p in enumerate(parts):
            structs[i] = abi.LoraPart(
                p.a.data_ptr(), p.bt.data_ptr(), p.a.shape[0], p.a.shape[1], p.col, p.bt.shape[1], p.scale
            )
        firsts = (ctypes.c_int64 * len(first))(*first)
        return abi.Lora(structs, ctypes.addressof(firsts), len(self.all)), [structs, firsts, parts]


class TorchHooks:
    """The PyTorch forward's LoRA: a forward hook on every projection some adapter updates adds, to each batch
    row whose adapter updates it, (B (A x)) * scale. `rows` is set per forward: [B] the rows' adapters (-1 none)."""

    def __init__(self, model: torch.nn.Module, adapters: Adapters):
        self.rows: torch.Tensor | None = None
        self.handles = []
        by_module: dict[str, list[tuple[int, Part]]] = {}
        for i, adapter in enumerate(adapters.all):
            for p in adapter.parts:
                by_module.setdefault(p.module, []).append((i, p))
        device = next(model.parameters()).device
        for name, updates in by_module.items():
            layer, block, module = name.split(".")
            target = getattr(getattr(model.model.layers[int(layer)], block), module)
            moved = [(i, p.a.to(device), p.bt.to(device), p.scale) for i, p in updates]
            self.handles.append(target.register_forward_hook(self._hook(moved)))

    def _hook(self, updates):
        def add(module, inputs, output):
            rows = self.rows
            if rows is None:
                return output
            x = inputs[0]  # [B, T, in]
            for i, a, bt, scale in updates:
                sel = (rows == i).nonzero().flatten()
                if len(sel):
                    xs = x[sel].to(a.dtype)
                    output[sel] += ((xs @ a.T) @ bt * scale).to(output.dtype)
            return output

        return add
