"""Write a random-weight checkpoint of a real model's shapes, shard by shard: what loading and decoding cost at that
size (memory, time, the memory bound), not what the model would say (random weights accept no drafts).

    python scripts/random_checkpoint.py --shape qwen2.5-7b --out build/random/qwen2.5-7b
    python scripts/bench.py memory --model build/random/qwen2.5-7b --weights int8 --decode 16

Shapes (from the published config.json files):
    qwen2.5-7b     hidden 3584, 28 layers, 28 / 4 heads of 128, MLP 18944, vocabulary 152064, untied head,
                   q/k/v biases, rope theta 1000000: 7.62B parameters, 15.2 GB in bfloat16
    llama-3.1-8b   hidden 4096, 32 layers, 32 / 8 heads of 128, MLP 14336, vocabulary 128256, untied head,
                   llama3 rope scaling: 8.03B parameters, 16.1 GB in bfloat16

The weights are bfloat16, drawn normal with std 0.02 (norm weights 1, biases 0), seeded; one shard of about
--shard-gb at a time is in memory. The tokenizer is copied from --tokenizer (default: the default model's; its
ids are a subset of the vocabulary).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAPES = {
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False,
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
        tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
    # Llama 3.2 3B's shapes with the Qwen2.5 tokenizer's 151,936 entries (random_gguf.py's llama-3.2-3b): a
    # checkpoint for llama.cpp's converter and quantizer to turn into the Q4_K_M file people bring
    "llama-3.2-3b": dict(
        model_type="llama", hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
        head_dim=128, intermediate_size=8192, vocab_size=151936, rms_norm_eps=1e-5, max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def write(shape: str, out: Path, tokenizer: Path, shard_gb: float, seed: int) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(SHAPES[shape])
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields, bos_token_id=1, eos_token_id=2)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    params = list(model.named_parameters())
    limit = int(shard_gb * 2**30)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, p in params:
        if size and size + p.numel() * 2 > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, tuple(p.shape)))
        size += p.numel() * 2
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            elif name.endswith(".bias"):
                tensors[name] = torch.zeros(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
            weight_map[name] = file
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        print(f"[random-checkpoint] {file}: {len(shard)} tensors", flush=True)
        del tensors
    total = sum(p.numel() for _, p in params) * 2
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    cfg.architectures = [type(model).__name__]
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(out)
    for f in TOKENIZER_FILES:
        if (tokenizer / f).exists():
            shutil.copy(tokenizer / f, out / f)
    print(f"[random-checkpoint] wrote {out}: {total / 1e9:.1f} GB, {total // 2 / 1e9:.2f}B parameters", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.shape, Path(args.out), Path(args.tokenizer), args.shard_gb, args.seed)


if __name__ == "__main__":
    main()
