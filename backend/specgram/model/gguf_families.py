"""What llama.cpp's converter does to each family, and its undoing: a GGUF header -> the transformers config of the
model it was converted from, and which tensors it changed.

A GGUF carries what llama.cpp's runtime needs, which is less than a transformers config and sometimes different:
- Names: transformers' module names -> llama.cpp's (`blk.N.attn_q`, ...): the gguf package's own name map.
- q and k rows: the converter's LlamaModel (llama, mistral, granite, smollm3) reorders each head's rows from
  transformers' rotate-half layout to llama.cpp's interleaved pairs; `unpermute` puts them back.
- Norm weights: Gemma 3's are stored as 1 + w (llama.cpp's RMSNorm scales by the weight alone); `norm_offset`.
- What the format does not carry is llama.cpp's own rule, taken here as llama.cpp's runtime takes it: Gemma 3's
  local rotary base (10000) and layer pattern (every 6th layer global), its score scale (1 / sqrt(head_dim),
  hidden / heads for the 62-layer 27B), SmolLM3's rotary-free layers (every 4th), a Mistral's sliding window
  (none). Llama 3's rope scaling comes as a tensor of per-frequency divisors (`rope_freqs`), not as parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gguf_format import GGUFError, GGUFHeader


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' model_type of the config rebuilt
    unpermute: bool = False  # q and k rows reordered by the converter (LlamaModel and its subclasses)
    norm_offset: float = 0.0  # added to every norm weight by the converter


FAMILIES = {  # general.architecture -> Family
    "llama": Family("llama", unpermute=True),  # also Mistral's (the converter writes them as llama)
    "qwen2": Family("qwen2"),
    "qwen3": Family("qwen3"),
    "gemma3": Family("gemma3_text", norm_offset=1.0),
    "phi3": Family("phi3"),
    "granite": Family("granite", unpermute=True),
    "smollm3": Family("smollm3", unpermute=True),
}
GEMMA3_LOCAL_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3
GEMMA3_PATTERN = 6  # every 6th layer attends globally (llama.cpp's swa pattern for gemma3)
SMOLLM3_NO_ROPE_STEP = 4  # every 4th layer without rotary (llama.cpp's n_no_rope_layer_step)


def family(h: GGUFHeader) -> Family:
    f = FAMILIES.get(h.arch)
    if f is None:
        raise GGUFError(
            f"{h.path}: GGUF architecture {h.arch!r} is not served; GGUF files of these are: {', '.join(FAMILIES)}"
        )
    return f


def _one(h: GGUFHeader, key: str, default=None):
    """A per-model value that llama.cpp may write per layer (head_count_kv): one value, or GGUFError."""
    v = h.get(key, default)
    if isinstance(v, list):
        if len(set(v)) != 1:
            raise GGUFError(f"{h.path}: {h.arch}.{key} differs between layers ({sorted(set(v))}): not served")
        v = v[0]
    return v


def _required(h: GGUFHeader, key: str):
    v = _one(h, key)
    if v is None:
        raise GGUFError(f"{h.path}: the file has no {h.arch}.{key}, which a {h.arch} model needs")
    return v


def config_dict(h: GGUFHeader) -> dict:
    """The transformers config (as from_dict takes it) of the model the file was converted from."""
    f = family(h)
    heads = _required(h, "attention.head_count")
    hidden = _required(h, "embedding_length")
    tokens = h.metadata.get("tokenizer.ggml.tokens")
    vocab = h.get("vocab_size") or (len(tokens) if isinstance(tokens, list) else tokens)
    if not vocab and "token_embd.weight" in h.tensors:
        vocab = h.tensors["token_embd.weight"].shape[0]
    head_dim = _one(h, "attention.key_length") or hidden // heads
    cfg = dict(
        model_type=f.model_type,
        hidden_size=hidden,
        num_hidden_layers=_required(h, "block_count"),
        intermediate_size=_required(h, "feed_forward_length"),
        num_attention_heads=heads,
        num_key_value_heads=_one(h, "attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=_one(h, "attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=_one(h, "context_length", 4096),
        vocab_size=int(vocab),
        tie_word_embeddings="output.weight" not in h.tensors,
        bos_token_id=h.metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=h.metadata.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=h.metadata.get("tokenizer.ggml.padding_token_id"),
        rope_parameters=dict(rope_type="default", rope_theta=float(_one(h, "rope.freq_base", 10000.0))),
    )
    biased = "blk.0.attn_q.bias" in h.tensors
    if f.model_type in ("qwen3", "llama", "granite", "smollm3"):
        cfg["attention_bias"] = biased
    scaling = _rope_scaling(h)
    if scaling:
        cfg["rope_parameters"].update(scaling)
    extra = {"gemma3_text": _gemma3, "phi3": _phi3, "granite": _granite, "smollm3": _smollm3}.get(f.model_type)
    if extra is not None:
        extra(h, cfg)
    return cfg


def _rope_scaling(h: GGUFHeader) -> dict:
    """Linear and YaRN scaling as the metadata states them (Llama 3's comes as the rope_freqs tensor instead)."""
    kind = h.get("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if kind not in ("linear", "yarn"):
        raise GGUFError(f"{h.path}: rope scaling {kind!r} ({h.arch}.rope.scaling.type) is not served")
    out = dict(rope_type=kind, factor=float(h.get("rope.scaling.factor", 1.0)))
    if kind == "yarn":
        out["original_max_position_embeddings"] = int(h.get("rope.scaling.original_context_length"))
    return out


def _gemma3(h: GGUFHeader, cfg: dict) -> None:
    n, head_dim = cfg["num_hidden_layers"], cfg["head_dim"]
    cfg["layer_types"] = ["full_attention" if (i + 1) % GEMMA3_PATTERN == 0 else "sliding_attention" for i in range(n)]
    cfg["sliding_window"] = _one(h, "attention.sliding_window")
    global_rope = cfg.pop("rope_parameters")
    cfg["rope_parameters"] = dict(
        full_attention=global_rope, sliding_attention=dict(rope_type="default", rope_theta=GEMMA3_LOCAL_BASE)
    )
    big = n == 62  # Gemma 3 27B: llama.cpp scales its scores by hidden / heads
    cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else head_dim
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    cfg["final_logit_softcapping"] = h.get("final_logit_softcapping")
    cfg["attn_logit_softcapping"] = h.get("attn_logit_softcapping")


def _phi3(h: GGUFHeader, cfg: dict) -> None:
    rotated = _one(h, "rope.dimension_count", cfg["head_dim"])
    rope = cfg["rope_parameters"]
    if rotated != cfg["head_dim"]:
        rope["partial_rotary_factor"] = rotated / cfg["head_dim"]
    if "rope_factors_long.weight" in h.tensors:  # longrope: its factors are tensors of the file
        original = h.get("rope.scaling.original_context_length")
        rope.update(rope_type="longrope", original_max_position_embeddings=int(original))
        cfg["original_max_position_embeddings"] = int(original)
        attn = h.get("rope.scaling.attn_factor")
        if attn is not None:
            rope["attention_factor"] = float(attn)
    cfg["hidden_act"] = "silu"


def _granite(h: GGUFHeader, cfg: dict) -> None:
    cfg["embedding_multiplier"] = float(h.get("embedding_scale", 1.0))
    cfg["residual_multiplier"] = float(h.get("residual_scale", 1.0))
    cfg["attention_multiplier"] = float(h.get("attention.scale", cfg["head_dim"] ** -0.5))
    cfg["logits_scaling"] = float(h.get("logit_scale", 1.0))


def _smollm3(h: GGUFHeader, cfg: dict) -> None:
    n = cfg["num_hidden_layers"]
    cfg["no_rope_layers"] = [int((i + 1) % SMOLLM3_NO_ROPE_STEP != 0) for i in range(n)]
    cfg["no_rope_layer_interval"] = SMOLLM3_NO_ROPE_STEP


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The file's row of each transformers row of a q or k projection (a long tensor [rows]): the converter's
    permute(w, heads) wrote, within each head's rows [2, half], the pairs interleaved ([half, 2])."""
    half = rows // heads // 2
    written = torch.arange(rows).reshape(heads, 2, half).transpose(1, 2).reshape(-1)  # file row j <- this row
    return torch.argsort(written)
