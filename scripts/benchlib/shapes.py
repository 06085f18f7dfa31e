"""Random-weight models of public architectures' shapes, built in memory: no checkpoint to fetch or store.
What a forward costs depends on the shapes and the dtype, not on the weights' values.

    llama-3.2-1b   Llama-3.2-1B's config.json: hidden 2048, 16 layers, 32 / 8 heads (head dim 64), MLP 8192,
                   tied embeddings, rope theta 500000
    qwen2-1.5b     Qwen2-1.5B's config.json: hidden 1536, 28 layers, 12 / 2 heads (head dim 128), MLP 8960,
                   q/k/v biases, tied embeddings, rope theta 1000000
    qwen3-0.6b     Qwen3-0.6B's: hidden 1024, 28 layers, 16 / 8 heads of 128, MLP 3072, q/k norms
    gemma3-1b      Gemma 3 1B's: hidden 1152, 26 layers, 4 / 1 heads of 256, MLP 6912 (GELU-tanh), sliding
                   window 512 on five layers of six, local and global rotary bases, sandwich norms
    phi-4-mini-8l  Phi-4-mini's layers (hidden 3072, 24 / 8 heads, MLP 8192, fused q|k|v and gate|up, rotary
                   over 3/4 of each head), 8 of its 32
    smollm3-3b-12l SmolLM3-3B's layers (hidden 2048, 16 / 4 heads, MLP 11008, every 4th layer without rotary),
                   12 of its 36
    granite-3.3-2b-12l  Granite 3.3 2B's layers (hidden 2048, 32 / 8 heads, MLP 8192, embedding / residual /
                   attention / logit multipliers), 12 of its 40
The layer counts cut ("-8l", "-12l") keep a float32 model within this machine's memory; a forward's cost
against its memory bound is per layer much the same at any depth.

The vocabulary is the default model's tokenizer's (SmolLM2, 49152 entries), so the lm_head costs what it
costs with that tokenizer (the published vocabularies are 128256 and 151936: their lm_heads would be 2.6x and
3.1x larger). Weights are drawn as transformers initialises them (normal, std 0.02), seeded.
"""

from __future__ import annotations

VOCAB = 49152


def _shape(
    model_type: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    mlp: int,
    rope_theta: float,
    eps: float,
    **extra,
) -> tuple[str, dict]:
    """(model type, config fields) of one shape, its numbers in the module docstring's order; both publish
    positions."""
    fields = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=mlp,
        rope_theta=rope_theta,
        rms_norm_eps=eps,
        max_position_embeddings=131072,
    )
    return model_type, {**fields, **extra}


SHAPES = {
    "llama-3.2-1b": _shape("llama", 2048, 16, 32, 8, 8192, 500000.0, 1e-5, head_dim=64),
    "qwen2-1.5b": _shape("qwen2", 1536, 28, 12, 2, 8960, 1000000.0, 1e-6),
    "qwen3-0.6b": _shape("qwen3", 1024, 28, 16, 8, 3072, 1000000.0, 1e-6, head_dim=128),
    "gemma3-1b": _shape(
        "gemma3_text",
        1152,
        26,
        4,
        1,
        6912,
        1000000.0,
        1e-6,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=10000.0),
            full_attention=dict(rope_type="default", rope_theta=1000000.0),
        ),
    ),
    "phi-4-mini-8l": _shape("phi3", 3072, 8, 24, 8, 8192, 10000.0, 1e-5, partial_rotary_factor=0.75),
    "smollm3-3b-12l": _shape("smollm3", 2048, 12, 16, 4, 11008, 5000000.0, 1e-6, no_rope_layer_interval=4),
    "granite-3.3-2b-12l": _shape(
        "granite",
        2048,
        12,
        32,
        8,
        8192,
        10000000.0,
        1e-5,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.015625,
        logits_scaling=8.0,
    ),
}


def random_model(name: str, dtype="float32", seed: int = 0):
    """-> a transformers causal LM of shape `name` (SHAPES) with random weights, in eval mode, of `dtype`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, shape = SHAPES[name]
    cfg = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True, **shape
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
