"""Tiny random Llama-family checkpoints with a byte-level tokenizer, built on the fly (no downloads).

Byte-level with no merges: every UTF-8 byte is one token, so multi-byte characters span tokens (which the
detokenizer must handle). Weights use a large init so logits are peaked: greedy choices are then stable
across batch shapes instead of resting on near-ties.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
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


def build_model(
    model_type: str = "llama", seed: int = 0, num_layers: int = 2, hidden: int = 64, init: float = 0.3, **overrides
):
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
    return AutoModelForCausalLM.from_config(cfg).eval()


def save_checkpoint(path: Path, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    build_model(model_type, seed, **overrides).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path
