"""Write a random-weight GGUF file of a real model's shape in Q4_K_M's block types: what loading a GGUF of that size
costs (memory, time), not what the model would say.

    python scripts/random_gguf.py --shape llama-3.2-3b --out build/random/llama-3.2-3b-q4_k_m.gguf
    python scripts/bench.py memory --model build/random/llama-3.2-3b-q4_k_m.gguf

Shapes (from the published config.json files):
    llama-3.2-3b   hidden 3072, 28 layers, 24 / 8 heads of 128, MLP 8192, tied head, rope theta 500000
    qwen2.5-1.5b   hidden 1536, 28 layers, 12 / 2 heads of 128, MLP 8960, tied head, q/k/v biases

Block types as llama.cpp's quantizer picks them for Q4_K_M: Q4_K for every projection, Q6_K for attn_v and
ffn_down in the layers that get more bits (the first and last eighth, every third between) and for the head (the
embedding, where the head is tied to it); norms and biases F32. The blocks are random bytes with their fp16 scales
set small (a valid file, random values). The tokenizer, and so the vocabulary size, is copied from --tokenizer (a
GGUF file; default the Qwen2.5-Coder 0.5B file that scripts/fetch_model.py keeps: 151,936 entries).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHAPES = {
    "llama-3.2-3b": dict(arch="llama", hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128, mlp=8192,
                         theta=500000.0, eps=1e-5, biases=False),
    "qwen2.5-1.5b": dict(arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128, mlp=8960,
                         theta=1000000.0, eps=1e-6, biases=True),
}  # fmt: skip
# bytes per block of 256 and where each block's fp16 scales lie in it (gguf's layouts)
BLOCK = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}
TOKENIZER_KEYS = ("tokenizer.", "general.quantization_version")


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v and ffn_down get Q6_K in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def random_blocks(rows: int, cols: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols / 256 * block bytes] uint8: random codes, each block's fp16 scales set to about 1e-3."""
    size, scales = BLOCK[kind]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1e-3).tobytes(), dtype=np.uint8)
    for at in scales:
        blocks[:, :, at : at + 2] = scale
    return blocks.reshape(rows, -1)


def write(shape: str, out: Path, tokenizer: Path, seed: int) -> None:
    import gguf

    from specgram.model.gguf_format import read_header

    s = SHAPES[shape]
    tok = read_header(tokenizer, ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"))
    vocab = len(tok.metadata["tokenizer.ggml.tokens"])
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), s["arch"])
    w.add_block_count(s["layers"])
    w.add_context_length(32768)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["mlp"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for key, value in tok.metadata.items():
        if key.startswith(TOKENIZER_KEYS):
            if isinstance(value, (list, tuple)):
                w.add_array(key, list(value))
            elif isinstance(value, bool):
                w.add_bool(key, value)
            elif isinstance(value, int):
                w.add_uint32(key, value)
            elif isinstance(value, float):
                w.add_float32(key, value)
            else:
                w.add_string(key, value)
    rng = np.random.default_rng(seed)
    t = gguf.GGMLQuantizationType

    def matrix(name: str, rows: int, cols: int, kind: str) -> None:
        w.add_tensor(name, random_blocks(rows, cols, kind, rng), raw_dtype=t[kind])

    def vector(name: str, n: int, value: float) -> None:
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    hid, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    matrix("token_embd.weight", vocab, hid, "Q6_K")  # tied: the head's type
    for i in range(s["layers"]):
        b, wide = f"blk.{i}", "Q6_K" if more_bits(i, s["layers"]) else "Q4_K"
        vector(f"{b}.attn_norm.weight", hid, 1.0)
        for kind, rows, qt in (("attn_q", q, "Q4_K"), ("attn_k", kv, "Q4_K"), ("attn_v", kv, wide)):
            matrix(f"{b}.{kind}.weight", rows, hid, qt)
            if s["biases"]:
                vector(f"{b}.{kind}.bias", rows, 0.0)
        matrix(f"{b}.attn_output.weight", hid, q, "Q4_K")
        vector(f"{b}.ffn_norm.weight", hid, 1.0)
        matrix(f"{b}.ffn_gate.weight", s["mlp"], hid, "Q4_K")
        matrix(f"{b}.ffn_up.weight", s["mlp"], hid, "Q4_K")
        matrix(f"{b}.ffn_down.weight", hid, s["mlp"], wide)
    vector("output_norm.weight", hid, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"[random-gguf] wrote {out}: {out.stat().st_size / 2**30:.2f} GiB, vocabulary {vocab}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-3b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default=str(REPO / "models" / "gguf" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.shape, Path(args.out), Path(args.tokenizer), args.seed)


if __name__ == "__main__":
    main()
