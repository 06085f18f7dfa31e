"""Tiny random Llama-family checkpoints with a byte-level tokenizer, built on the fly (no downloads).

Byte-level with no merges: every UTF-8 byte is one token, so multi-byte characters span tokens (which the
detokenizer must handle). Weights use a large init so logits are peaked: greedy choices are then stable
across batch shapes instead of resting on near-ties.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specgram.model.reference import logits as transformers_logits  # noqa: F401  (as a server computes)

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (  # a thinking model's switch: enable_thinking false opens the answer with an empty think block
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def randomize_norms_and_biases(model, seed: int, spread: float = 0.2) -> None:
    """Every norm weight drawn around its neutral value (1, or 0 for a norm that scales by 1 + w: Gemma's) and
    every bias drawn around 0, in place: identity norms and zero biases would hide a dropped or swapped norm
    weight, q/k norm or bias from every comparison. Neutral values are read from the freshly built model."""
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or (name.endswith(".weight") and "norm" in name.rsplit(".", 2)[-2]):
                p.add_(torch.randn(p.shape, generator=g) * spread)


def build_model(
    model_type: str = "llama",
    seed: int = 0,
    num_layers: int = 2,
    hidden: int = 64,
    init: float = 0.3,
    random_norms: bool = False,
    **overrides,
):
    """random_norms: randomize_norms_and_biases (the family models; the engine tests' models keep identity norms
    and zero biases, whose repetitive output their premises rest on: a stop string that recurs, EOS as the
    argmax at several positions)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = len(SPECIALS) + 256
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=init,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    if random_norms:
        randomize_norms_and_biases(model, seed)
    return model


def save_checkpoint(path: Path, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    build_model(model_type, seed, **overrides).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


LONGROPE = dict(  # Phi-4-mini's rope at tiny scale: partial rotary (12 of 16 dimensions), short and long factors
    rope_type="longrope",
    rope_theta=10000.0,
    partial_rotary_factor=0.75,
    short_factor=[1.0 + i / 10 for i in range(6)],
    long_factor=[2.0 + i for i in range(6)],
)

# Each family's distinguishing features at tiny scale (4 layers, hidden 64, 4 heads of 16, 2 KV heads unless
# said): what its real checkpoints' configs set, so the family tests exercise what differs.
FAMILY_CONFIGS = {
    "llama": dict(  # Llama 3.x rope scaling
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
    ),  # fmt: skip
    "qwen2": dict(rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),  # q/k/v biases
    "mistral": dict(sliding_window=8),
    "qwen3": dict(head_dim=24),  # q/k norms; a head_dim that is not hidden / heads
    "qwen3_bias": dict(model_type="qwen3", head_dim=24, attention_bias=True),  # biases on q, k, v and o
    "gemma3_text": dict(
        head_dim=24,
        query_pre_attn_scalar=32,  # the score scale is not head_dim ** -0.5
        sliding_window=8,
        tie_word_embeddings=True,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=10000.0),
            full_attention=dict(rope_type="default", rope_theta=1000000.0),
        ),
    ),  # fmt: skip
    "phi3": dict(),  # fused qkv_proj and gate_up_proj (Phi-3)
    "phi4_mini": dict(  # Phi-4-mini: phi3 with partial rotary and longrope (served with a max_seq_len within
        # its original context, it takes the short factor throughout; past it, the long one: model/rotary.py)
        model_type="phi3",
        tie_word_embeddings=True,
        original_max_position_embeddings=512,
        max_position_embeddings=4096,
        rope_parameters=dict(LONGROPE),  # a copy: transformers adds to it
    ),
    "phi4_long": dict(  # longrope with an original context the test prompts cross (the long factor throughout)
        model_type="phi3",
        original_max_position_embeddings=32,
        max_position_embeddings=4096,
        # transformers' default attention factor here (1.5) sharpens the tiny model's attention enough that
        # float32 summation order alone moves a logit past the family tests' tolerance
        rope_parameters=dict(LONGROPE, attention_factor=1.0),
    ),
    "smollm3": dict(no_rope_layers=[1, 1, 1, 0], tie_word_embeddings=True),  # every 4th layer without rotary
    "granite": dict(
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625, logits_scaling=8.0
    ),  # fmt: skip
}


def build_family(name: str, seed: int = 0, **overrides):
    """A tiny random model of a family of FAMILY_CONFIGS (4 layers, float32), its norm weights and biases random."""
    kw = {**FAMILY_CONFIGS[name], **overrides}
    return build_model(kw.pop("model_type", name), seed, num_layers=4, random_norms=True, **kw)


def save_family(path: Path, name: str, seed: int = 0, **overrides) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    build_family(name, seed, **overrides).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def save_lora(model, path: Path, r: int, seed: int, modules="all-linear", rslora: bool = False):
    """A random PEFT LoRA adapter of `model` (A and B both random: every update changes the output), saved at
    `path` -> the PeftModel (on a copy: `model` stays the base)."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=modules, init_lora_weights=False, use_rslora=rslora)
    peft = get_peft_model(copy.deepcopy(model), cfg).eval()
    peft.save_pretrained(str(path))
    return peft


def save_family_with_loras(root: Path, name: str, seed: int, loras: dict[str, dict]):
    """A tiny checkpoint of family `name` at root/ckpt and one random adapter per entry of `loras` (name ->
    save_lora's r, seed and modules) at root/adapters/<name>, listed in root/multi_lora.json (relative folders)
    -> (checkpoint path, its transformers model, {adapter name: PeftModel}, the multi_lora.json path)."""
    path = save_family(root / "ckpt", name, seed=seed)
    model = build_family(name, seed=seed)
    pefts = {n: save_lora(model, root / "adapters" / n, **kw) for n, kw in loras.items()}
    listing = root / "multi_lora.json"
    listing.write_text(json.dumps({n: f"adapters/{n}" for n in loras}))
    return path, model, pefts, listing
