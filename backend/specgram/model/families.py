"""Model families as data: what a decoder checkpoint differs in, read once from its HF config into an Arch.

The PyTorch forward runs transformers' own modules for every family (torch_forward.py: embeddings, decoder
layers, norms and rotary as the family defines them, with our KV cache and attention plugged in); what our code
does beside them is in the Arch (the head's scale and soft cap, each layer's sliding window). The native CPU
forward covers the Archs `native_gap` accepts.

Adding a family: its reader in FAMILIES (HF config -> Arch) and its tiny config in tests/unit/tiny.py's
FAMILY_CONFIGS; the family tests then compare it with transformers' own model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelLoadError

DOCS = "docs/models.md"
NATIVE_ACTS = ("silu", "gelu_tanh")  # the native MLP's activations (kernels/norm.c)


@dataclass(frozen=True)
class Arch:
    family: str  # the checkpoint's model_type
    head_dim: int  # each attention head's size (head_dim(cfg))
    act: str = "silu"  # the MLP's activation: "silu" or "gelu_tanh" (gemma's)
    norm_offset: float = 0.0  # each RMSNorm scales by (offset + weight): 1 for gemma
    qk_norm: bool = False  # an RMSNorm over each head of q and k before rotary (qwen3, gemma3)
    sandwich_norms: bool = False  # norms on the attention and MLP outputs before the residual add (gemma3)
    rope_layers: tuple[bool, ...] = ()  # per layer: whether rotary is applied (smollm3 skips every 4th)
    rotary_fraction: float = 1.0  # the share of each head that rotates (phi-4-mini: 0.75)
    rope_types: tuple[str | None, ...] = (None,)  # the rotary tables: each one's layer type (gemma3: a local and
    # a global base, in transformers' order); None: the model's one table
    layer_tables: tuple[int, ...] = ()  # per layer: the index of its rotary table
    windows: tuple[int | None, ...] = ()  # per layer: its sliding window, or None (full attention)
    embed_scale: float = 1.0  # the embedding rows times this (gemma: sqrt(hidden); granite: its multiplier)
    residual_scale: float = 1.0  # each branch's output times this before the residual add (granite)
    attn_scale: float | None = None  # the score scale where it is not head_dim ** -0.5 (granite, gemma3)
    logits_divisor: float = 1.0  # the head's logits divided by this (granite's logits_scaling)
    logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (gemma's final_logit_softcapping)
    attn_softcap: float | None = None  # the same on attention scores (gemma2-style attn_logit_softcapping)
    fused_projections: bool = False  # qkv_proj and gate_up_proj in the checkpoint (phi3)

    @property
    def window(self) -> int | None:
        """The sliding window of the layers that have one (None: no layer has); ValueError where they differ."""
        sizes = set(self.windows) - {None}
        if len(sizes) > 1:
            raise ValueError(f"{self.family}: layers differ in their sliding window")
        return sizes.pop() if sizes else None


def head_dim(cfg) -> int:
    """Each attention head's size: the config's head_dim where it names one (qwen3, gemma3), else hidden / heads."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def matmul_params(cfg) -> int:
    """The weights of one forward's matmuls (q, k, v, o, gate, up, down of every layer, and the lm_head): what a
    decode step streams, for a config of these families."""
    E, D = cfg.hidden_size, head_dim(cfg)
    attn = E * D * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    return cfg.num_hidden_layers * (attn + 3 * E * cfg.intermediate_size) + cfg.vocab_size * E


def _windows(cfg, n: int) -> tuple[int | None, ...]:
    """Each layer's sliding window: from layer_types where the config has them, else the one sliding_window."""
    window = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False:
        window = None
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (window,) * n


def _base(cfg, **kw) -> Arch:
    n = cfg.num_hidden_layers
    fields = dict(
        family=cfg.model_type,
        head_dim=head_dim(cfg),
        windows=_windows(cfg, n),
        rope_layers=(True,) * n,
        layer_tables=(0,) * n,
    )
    fields.update(kw)
    return Arch(**fields)


def _llama(cfg) -> Arch:
    return _base(cfg, act=cfg.hidden_act)


def _qwen3(cfg) -> Arch:
    return _base(cfg, act=cfg.hidden_act, qk_norm=True)


def _gemma3(cfg) -> Arch:
    types = tuple(sorted(set(cfg.layer_types)))  # transformers' order of its rotary tables
    return _base(
        cfg,
        act={"gelu_pytorch_tanh": "gelu_tanh"}.get(cfg.hidden_activation, cfg.hidden_activation),
        norm_offset=1.0,
        qk_norm=True,
        sandwich_norms=True,
        rope_types=types,
        layer_tables=tuple(types.index(t) for t in cfg.layer_types),
        embed_scale=math.sqrt(cfg.hidden_size),
        attn_scale=cfg.query_pre_attn_scalar**-0.5,
        logit_softcap=cfg.final_logit_softcapping,
        attn_softcap=cfg.attn_logit_softcapping,
    )


def _phi3(cfg) -> Arch:
    return _base(
        cfg,
        act=cfg.hidden_act,
        rotary_fraction=float((getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)),
        fused_projections=True,
    )


def _smollm3(cfg) -> Arch:
    return _base(cfg, act=cfg.hidden_act, rope_layers=tuple(bool(x) for x in cfg.no_rope_layers))


def _granite(cfg) -> Arch:
    return _base(
        cfg,
        act=cfg.hidden_act,
        embed_scale=float(cfg.embedding_multiplier),
        residual_scale=float(cfg.residual_multiplier),
        attn_scale=float(cfg.attention_multiplier),
        logits_divisor=float(cfg.logits_scaling),
    )


# model_type -> reader. gemma3_text: Gemma 3's text decoder (its 270M and 1B checkpoints are text-only)
FAMILIES = {
    "llama": _llama,
    "qwen2": _llama,
    "mistral": _llama,
    "qwen3": _qwen3,
    "gemma3_text": _gemma3,
    "phi3": _phi3,
    "smollm3": _smollm3,
    "granite": _granite,
}


def describe(cfg) -> Arch:
    """The Arch of a checkpoint's HF config; ModelLoadError naming the families for another model_type."""
    reader = FAMILIES.get(getattr(cfg, "model_type", None))
    if reader is None:
        raise ModelLoadError(
            f"model_type {getattr(cfg, 'model_type', None)!r} is not supported; this engine runs the decoder "
            f"families {', '.join(FAMILIES)} (see {DOCS})"
        )
    return reader(cfg)


def native_gap(arch: Arch) -> str | None:
    """None where the native CPU forward computes this Arch, else the first thing it lacks."""
    gaps = (
        (arch.act not in NATIVE_ACTS, f"activation {arch.act!r}"),
        (len(set(arch.windows) - {None}) > 1, "sliding windows of several sizes"),
        (arch.attn_softcap is not None, "attention soft-capping"),
        (arch.logit_softcap is not None, "a soft-capped head"),
    )
    return next((why for gap, why in gaps if gap), None)
