"""Tiny GGUF files of a random qwen2 model, written on the fly with the gguf package (no downloads): the metadata a
GGUF reader needs (architecture, shapes, the byte-level tokenizer of tiny.py and its chat template) and tensors in
chosen block types. The gguf package quantizes Q8_0 and Q5_0 itself but not Q4_K, so Q4_K blocks are made here from
random codes, 6-bit sub-scales and fp16 super-scales (encode_q4_k: the block layout llama.cpp documents); the
package's own decoder is what the tests compare against."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .tiny import CHAT_TEMPLATE, SPECIALS, build_tokenizer

HIDDEN, LAYERS = 256, 2  # Q4_K rows are whole blocks of 256


def encode_q4_k(codes: np.ndarray, sc: np.ndarray, mn: np.ndarray, d: np.ndarray, dmin: np.ndarray) -> np.ndarray:
    """codes u8 [n, k] in [0, 15], sc / mn u8 [n, k / 32] in [0, 63], d / dmin fp16 [n, k / 256] -> the Q4_K
    bytes [n, k / 256 * 144]: per block d, dmin, 12 bytes of packed sub-scales and mins, 128 bytes of codes
    (each 32-byte chunk: one group in the low nibbles, the next in the high ones)."""
    n, k = codes.shape
    nb = k // 256
    sc, mn = sc.reshape(n * nb, 8), mn.reshape(n * nb, 8)
    scales = np.zeros((n * nb, 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    g = codes.reshape(n * nb, 4, 2, 32)
    qs = (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n * nb, 128)
    heads = np.concatenate([d.reshape(-1, 1), dmin.reshape(-1, 1)], axis=1).astype(np.float16).view(np.uint8)
    return np.concatenate([heads, scales, qs], axis=1).reshape(n, nb * 144)


def random_q4_k(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A random Q4_K tensor [n, k] (its raw bytes): groups spanning about +-0.05 to +-0.2, centred near zero as a
    trained model's are (each minimum near half the group's range, not exactly)."""
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    sc = rng.integers(16, 64, (n, k // 32), dtype=np.uint8)
    mn = np.clip(np.round(sc * 15 / 16) + rng.integers(-2, 3, sc.shape), 0, 63).astype(np.uint8)
    d = (rng.random((n, k // 256)) * 2e-4 + 1e-4).astype(np.float16)
    dmin = (d.astype(np.float32) * 8).astype(np.float16)  # m = dmin * mn, about 7.5 steps
    return encode_q4_k(codes, sc, mn, d, dmin)


def save_gguf(path: Path, seed: int = 0, types: dict[str, str] | None = None, head: str = "own") -> Path:
    """A qwen2 GGUF file at path (a .gguf name): 2 layers, hidden 256, 4 heads of 64, 2 KV heads, MLP 512.
    head: "own" (output.weight, random), "tied" (no output.weight: the head is the embedding, as llama.cpp writes a
    tied model) or "copy" (output.weight holds the embedding's stored bytes).
    types: block type per GGUF tensor kind ("attn_q", "attn_v", "ffn_down", "token_embd", "output", ...; a key
    "attn_v.1" names layer 1's alone); projections default to Q4_K, the embedding and the head to Q8_0, norms and
    biases are F32."""
    import gguf
    from gguf.quants import quantize

    types = types or {}
    rng = np.random.default_rng(seed)
    tok = build_tokenizer()
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    heads, kv_heads, head_dim, inter = 4, 2, 64, 2 * HIDDEN
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(LAYERS)
    w.add_context_length(1024)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab)
    w.add_token_types([3 if t in SPECIALS else 1 for t in vocab])  # 3: control, 1: normal
    w.add_token_scores([0.0] * len(vocab))  # no merges (single bytes): the reader derives none from these
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)

    stored = {}

    def tensor(name: str, kind: str, shape: tuple[int, ...], default: str) -> None:
        layer = name.split(".")[1] if name.startswith("blk.") else ""
        qtype = types.get(f"{kind}.{layer}", types.get(kind, default))
        if len(shape) == 1 or qtype == "F32":
            values = (rng.standard_normal(shape) * (0.1 if len(shape) == 2 else 0.2)).astype(np.float32)
            if kind.endswith("norm"):
                values += 1.0
            w.add_tensor(name, values)
        elif qtype == "Q4_K":
            stored[name] = (random_q4_k(*shape, rng), gguf.GGMLQuantizationType.Q4_K)
            w.add_tensor(name, *stored[name][:1], raw_dtype=stored[name][1])
        else:
            t = gguf.GGMLQuantizationType[qtype]
            values = (rng.standard_normal(shape) * 0.1).astype(np.float32)
            stored[name] = (quantize(values, t), t)
            w.add_tensor(name, stored[name][0], raw_dtype=t)

    vocab_n = len(vocab)
    tensor("token_embd.weight", "token_embd", (vocab_n, HIDDEN), "Q8_0")
    for i in range(LAYERS):
        b = f"blk.{i}"
        tensor(f"{b}.attn_norm.weight", "attn_norm", (HIDDEN,), "F32")
        for kind, rows in (
            ("attn_q", heads * head_dim),
            ("attn_k", kv_heads * head_dim),
            ("attn_v", kv_heads * head_dim),
        ):
            tensor(f"{b}.{kind}.weight", kind, (rows, HIDDEN), "Q4_K")
            tensor(f"{b}.{kind}.bias", kind, (rows,), "F32")
        tensor(f"{b}.attn_output.weight", "attn_output", (HIDDEN, heads * head_dim), "Q4_K")
        tensor(f"{b}.ffn_norm.weight", "ffn_norm", (HIDDEN,), "F32")
        tensor(f"{b}.ffn_gate.weight", "ffn_gate", (inter, HIDDEN), "Q4_K")
        tensor(f"{b}.ffn_up.weight", "ffn_up", (inter, HIDDEN), "Q4_K")
        tensor(f"{b}.ffn_down.weight", "ffn_down", (HIDDEN, inter), "Q4_K")
    tensor("output_norm.weight", "output_norm", (HIDDEN,), "F32")
    if head == "own":
        tensor("output.weight", "output", (vocab_n, HIDDEN), "Q8_0")
    elif head == "copy":
        data, kind = stored["token_embd.weight"]
        w.add_tensor("output.weight", data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def transformers_model(path: Path) -> torch.nn.Module:
    """transformers' own reading of the GGUF file: its model, de-quantized to float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def with_int4_activations(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every Linear's input rounded as int4's products round theirs (int8 per row and block of 256
    inputs, int4.quantize_activations) and the matmuls left in float32: a float reference for the served int4 form,
    whose products compute the same values exactly in integers (up to float32 sums in another order)."""
    from specgram.model import int4

    def rounded(_module, inputs):
        x = inputs[0]
        rows = x.reshape(-1, x.shape[-1]).float()
        xq, xs = int4.quantize_activations(rows)
        blocks = xs.shape[1]
        values = (xq.view(-1, blocks, int4.BLOCK).float() * xs[:, :, None]).view(len(rows), -1)[:, : x.shape[-1]]
        return (values.view(x.shape),)

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(rounded)
    return model


# What llama.cpp's converter (convert_hf_to_gguf.py) writes per family, emulated for tiny models: the architecture
# name, whether q and k rows are permuted (its LlamaModel and subclasses), and the norm offset (Gemma 3: 1 + w).
CONVERTED = {  # model_type -> (general.architecture, q/k permuted, norm offset)
    "llama": ("llama", True, 0.0),
    "mistral": ("llama", True, 0.0),
    "qwen2": ("qwen2", False, 0.0),
    "qwen3": ("qwen3", False, 0.0),
    "gemma3_text": ("gemma3", False, 1.0),
    "phi3": ("phi3", False, 0.0),
    "granite": ("granite", True, 0.0),
    "smollm3": ("smollm3", True, 0.0),
}


def permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The converter's LlamaModel.permute: each head's rows from rotate-half to interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """The converter's rope_freqs tensor for Llama 3's rope scaling: a divisor per frequency."""
    import math

    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def save_family_gguf(model, path: Path, types: dict[str, str] | None = None) -> Path:
    """A GGUF of a tiny transformers model of any served family, as llama.cpp's converter writes one (metadata,
    names, permuted q/k rows, offset norms, Llama 3's rope_freqs, Phi-3's longrope factors), with the byte-level
    tokenizer of tiny.py. types: block type per GGUF tensor kind ("attn_q", "ffn_up", ...); F32 by default."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    arch, permuted, offset = CONVERTED[cfg.model_type]
    types = types or {}
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = dict(cfg.rope_parameters)
    rope = rope.get("full_attention", rope)  # gemma3: the global layers' base
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    extra: dict[str, np.ndarray] = {}
    if rope.get("rope_type") == "llama3":
        extra["rope_freqs.weight"] = llama3_rope_factors(rope, head_dim)
    if cfg.model_type == "phi3":
        rotated = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(rotated)
        if rope.get("rope_type") == "longrope":
            original = cfg.original_max_position_embeddings
            w.add_rope_scaling_orig_ctx_len(original)
            import math

            scale = cfg.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(
                rope.get("attention_factor") or math.sqrt(1 + math.log(scale) / math.log(original))
            )
            extra["rope_factors_long.weight"] = np.array(rope["long_factor"], dtype=np.float32)
            extra["rope_factors_short.weight"] = np.array(rope["short_factor"], dtype=np.float32)
    if cfg.model_type == "gemma3_text":
        w.add_sliding_window(cfg.sliding_window)
    if cfg.model_type == "granite":
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    tok = build_tokenizer()
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab)
    w.add_token_types([3 if t in SPECIALS else 1 for t in vocab])
    w.add_token_scores([0.0] * len(vocab))  # no merges (single bytes)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)

    names = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch], cfg.num_hidden_layers)
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # a tied head: the converter writes no output tensor
        module, _, what = name.rpartition(".")
        mapped = names.get_name(module)
        assert mapped is not None, name
        t = p.detach().float()
        leaf = module.rpartition(".")[2]
        if permuted and leaf in ("q_proj", "k_proj"):
            t = permute(t, heads if leaf == "q_proj" else kv)
        if offset and "norm" in leaf:
            t = t + offset
        kind = mapped.rpartition(".")[2] if mapped.startswith("blk.") else mapped
        qtype = types.get(kind, "F32") if t.dim() == 2 else "F32"
        values = t.numpy().astype(np.float32)
        if qtype == "F32":
            w.add_tensor(f"{mapped}.{what}", values)
        else:
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(f"{mapped}.{what}", quantize(values, q), raw_dtype=q)
    for name, values in extra.items():
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
