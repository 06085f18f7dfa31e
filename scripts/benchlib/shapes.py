"""Random-weight models of public architectures' shapes, built in memory: no checkpoint to fetch or store.
What a forward costs depends on the shapes and the dtype, not on the weights' values.

    llama-3.2-1b   Llama-3.2-1B's config.json: hidden 2048, 16 layers, 32 / 8 heads (head dim 64), MLP 8192,
                   tied embeddings, rope theta 500000
    qwen2-1.5b     Qwen2-1.5B's config.json: hidden 1536, 28 layers, 12 / 2 heads (head dim 128), MLP 8960,
                   q/k/v biases, tied embeddings, rope theta 1000000

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
}


def random_model(name: str, dtype="float32", seed: int = 0):
    """-> a transformers causal LM of shape `name` (SHAPES) with random weights, in eval mode, of `dtype`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, shape = SHAPES[name]
    cfg = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, **shape
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
