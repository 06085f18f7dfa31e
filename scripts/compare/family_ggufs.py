"""GGUF files of every served family, written by llama.cpp's own converter from small random checkpoints, and a check
of what each file holds against its checkpoint: ground truth for reading GGUF files.

    source scripts/env.sh && PYTHONPATH=$PWD/backend python scripts/compare/family_ggufs.py [CASE ...] [--force]

Per case (CASES; default all), under build/gguf-families/<case>/:
  folder/             the checkpoint: tests/unit/tiny.py's family config at a hidden size whose rows fill whole
                      quantization blocks, random weights, norms and biases, and a real tokenizer from models/
                      (the converter fingerprints the pre-tokenizer; the tiny byte-level test tokenizer is unknown;
                      Gemma's gets a tokenizer.model rebuilt from a GGUF of it: spm_from_gguf.py)
  view/<case>/        links to folder's files, with what the converter's transformers 4.57 cannot read rewritten
  <case>-f32.gguf, <case>-q8_0.gguf, convert-<type>.log
  report.md           the file's metadata keys and values, its tensors (name, shape, type), and every checkpoint
                      tensor compared with its GGUF tensor after the converter's transform (exact for F32, within
                      the block's rounding step for Q8_0)
and build/gguf-families/summary.md, one line per case and type. Exits non-zero where a check fails.
The converter runs in build/peers/llamacpp (scripts/compare/setup_converter.sh, run here when missing); this script
runs in the project venv (transformers 5 writes the checkpoints as the engine reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
OUT = REPO / "build" / "gguf-families"
PEER = REPO / "build" / "peers" / "llamacpp"
TYPES = ("f32", "q8_0")

# the tokenizers the converter recognizes (models/; fetched by scripts/fetch_model.py): vocab size and special ids
TOKENIZERS = {
    "smollm2": dict(src="SmolLM2-135M-Instruct", vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2),
    "qwen2": dict(
        src="Qwen2.5-Coder-0.5B-Instruct",
        vocab_size=151936,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    ),  # fmt: skip
    "gemma3": dict(src="gemma-3-270m", vocab_size=262144, bos_token_id=2, eos_token_id=1, pad_token_id=0),
}
# a tokenizer.model rebuilt from a GGUF of the same tokenizer (spm_from_gguf.py), where models/ has only the
# tokenizer.json: the converter reads Gemma's sentencepiece vocabulary right only from a tokenizer.model
SPM_FROM = {"gemma3": "gguf/gemma-3-270m-q4_k_m.gguf"}
WIDE = dict(hidden=256, intermediate_size=512)  # rows of whole 256-value blocks (Q8_0's are 32; K-quants' 256)

# case -> (FAMILY_CONFIGS name, overrides of its config (num_layers: 4 unless given), tokenizer)
CASES = {
    "llama": ("llama", dict(WIDE, tie_word_embeddings=True), "smollm2"),  # Llama 3 rope scaling, tied head
    "qwen2": ("qwen2", dict(WIDE), "qwen2"),
    "qwen3": ("qwen3", dict(WIDE), "qwen2"),  # head_dim 24: not hidden / heads
    "qwen3_bias": ("qwen3_bias", dict(hidden=512, intermediate_size=1024, head_dim=64), "smollm2"),
    "mistral": ("mistral", dict(WIDE, sliding_window=None), "smollm2"),  # no sliding window
    "granite": ("granite", dict(WIDE), "smollm2"),
    # llama.cpp's layout, which the file cannot state: every 6th layer global, scores scaled by head_dim ** -0.5
    "gemma3": (
        "gemma3_text",
        dict(WIDE, num_layers=6, layer_types=["sliding_attention"] * 5 + ["full_attention"], query_pre_attn_scalar=24),
        "gemma3",
    ),
    # Phi-4-mini's shape: 16 heads keep head_dim 16, so LONGROPE's 6 factors still cover its 12 rotary dimensions
    "phi3": ("phi4_mini", dict(WIDE, num_attention_heads=16, num_key_value_heads=4), "smollm2"),
    "smollm3": ("smollm3", dict(WIDE), "smollm2"),  # every 4th layer without rotary, tied head
}

# llama.cpp's converter classes whose modify_tensors permutes q and k rows (LlamaModel.undo_permute, conversion/
# llama.py): LlamaForCausalLM, MistralForCausalLM, GraniteForCausalLM (GraniteModel), SmolLM3ForCausalLM
PERMUTED = {"llama", "mistral", "granite", "smollm3"}
NORM_PLUS_ONE = {"gemma3_text"}  # Gemma3Model.norm_shift: every *norm.weight + 1


# ------------------------------------------------------------------ the checkpoint and the converter's view of it


def build_folder(case: str, path: Path) -> None:
    """The random checkpoint of a case, with its real tokenizer's files and special ids."""
    from tiny import FAMILY_CONFIGS, build_model

    family, overrides, tok = CASES[case]
    t = TOKENIZERS[tok]
    ids = {k: v for k, v in t.items() if k != "src"}
    kw = {**FAMILY_CONFIGS[family], **overrides, **ids}
    layers = kw.pop("num_layers", 4)  # tiny.build_family's 4 unless the case says otherwise
    model = build_model(kw.pop("model_type", family), seed=0, num_layers=layers, random_norms=True, **kw)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = REPO / "models" / t["src"] / f
        if src.is_file():
            shutil.copy(src, path / f)
    if tok in SPM_FROM:
        script, src = REPO / "scripts" / "compare" / "spm_from_gguf.py", REPO / "models" / SPM_FROM[tok]
        command = [str(PEER / "bin" / "python"), str(script), str(src), str(path / "tokenizer.model")]
        subprocess.run(command, check=True, env=dict(os.environ, PYTHONPATH=""))


def build_view(case: str, folder: Path, view: Path) -> list[str]:
    """Links to the folder's files, with tokenizer_config.json rewritten where transformers 4.57 (the converter's)
    does not know the class transformers 5 wrote -> the fixes made, in words."""
    fixes = []
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for f in folder.iterdir():
        (view / f.name).symlink_to(f.resolve())
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cls = cfg.get("tokenizer_class")
    # phi3's set_vocab takes the BPE path only for GPT2Tokenizer (Phi-4-mini's class); anything else needs a
    # sentencepiece tokenizer.model
    want = "GPT2Tokenizer" if CASES[case][0].startswith("phi") else "PreTrainedTokenizerFast"
    if cls == "TokenizersBackend" or (want == "GPT2Tokenizer" and cls != want):
        cfg["tokenizer_class"] = want
        (view / "tokenizer_config.json").unlink()
        (view / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
        fixes.append(f"tokenizer_config.json: tokenizer_class {cls} -> {want}")
    return fixes


def converter() -> Path:
    script = REPO / "scripts" / "compare" / "setup_converter.sh"
    return Path(subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True).stdout.split()[-1])


def convert(conv: Path, view: Path, out: Path, outtype: str, log: Path) -> None:
    """llama.cpp's converter on the view; written under a temporary name so an interrupted run leaves no file."""
    part = out.with_suffix(".part")
    env = dict(os.environ, PYTHONPATH="")  # the converter's own packages (gguf-py), not the project's
    with open(log, "w") as f:
        subprocess.run(
            [str(PEER / "bin" / "python"), str(conv), str(view), "--outtype", outtype, "--outfile", str(part)],
            check=True, stdout=f, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    part.rename(out)


# ------------------------------------------------------------------ the check


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute: within each head, rows [x0..x(d/2-1), y0..] (transformers' rotate_half
    halves) -> interleaved pairs [x0, y0, x1, y1, ...] (GGML's rope on adjacent pairs). Rows [n_head * d] or a
    bias [n_head * d]."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of permute: a GGUF's q or k rows back to transformers' order."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {  # transformers' name within a layer (or the model) -> the GGUF tensor's
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
GEMMA3_NAMES = {  # gemma3's sandwich norms
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf: str, family: str) -> str:
    stem, kind = hf.rsplit(".", 1)
    if stem in TOP_NAMES:
        return f"{TOP_NAMES[stem]}.{kind}"
    _, _, i, rest = stem.split(".", 3)  # model.layers.<i>.<rest>
    names = {**GGUF_NAMES, **GEMMA3_NAMES} if family in NORM_PLUS_ONE else GGUF_NAMES
    return f"blk.{i}.{names[rest]}.{kind}"


def expected(hf: str, w: torch.Tensor, cfg: dict, family: str) -> torch.Tensor:
    """What the converter should have written for the checkpoint tensor `hf` (float32)."""
    if family in PERMUTED and hf.endswith(("q_proj.weight", "q_proj.bias")):
        w = permute(w, cfg["num_attention_heads"])
    if family in PERMUTED and hf.endswith(("k_proj.weight", "k_proj.bias")):
        w = permute(w, cfg["num_key_value_heads"])
    if family in NORM_PLUS_ONE and hf.endswith("norm.weight"):
        w = w + 1
    return w


def field_value(field):
    v = field.contents()
    if isinstance(v, list) and len(v) > 8:
        head = ", ".join(repr(x)[:40] for x in v[:4])
        return f"[{len(v)} items: {head}, …]"
    if isinstance(v, str) and len(v) > 120:
        return repr(v[:100]) + f"… ({len(v)} chars)"
    return repr(v)


def rope_checks(reader_tensors: dict, folder: Path, cfg: dict) -> list[tuple[str, str, bool]]:
    """The generated tensors against transformers' own rotary: rope_freqs (llama3: GGML divides each frequency by
    its factor, so factor = default inv_freq / llama3 inv_freq) and phi3's longrope factors."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    out = []
    if "rope_freqs.weight" in reader_tensors:
        conf = AutoConfig.from_pretrained(folder)
        scaled = LlamaRotaryEmbedding(conf).inv_freq.float()
        base = conf.rope_parameters["rope_theta"]
        dim = getattr(conf, "head_dim", None) or conf.hidden_size // conf.num_attention_heads
        plain = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        want = (plain / scaled).numpy()
        got = reader_tensors["rope_freqs.weight"]
        ok = got.shape == want.shape and np.allclose(got, want, rtol=1e-5)
        out.append(("rope_freqs.weight", f"vs transformers' llama3 inv_freq ratio: max rel {rel(got, want)}", ok))
    rp = cfg.get("rope_parameters") or {}
    for key, name in (("long_factor", "rope_factors_long.weight"), ("short_factor", "rope_factors_short.weight")):
        if key in rp:
            got = reader_tensors.get(name)
            ok = got is not None and np.array_equal(got, np.asarray(rp[key], np.float32))
            out.append((name, f"== rope_parameters.{key} {rp[key]}", ok))
    return out


GENERATED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


ARCHS = {"mistral": "llama", "gemma3_text": "gemma3"}  # general.architecture where it is not the model_type


def expected_metadata(cfg: dict, family: str) -> dict:
    """The metadata a reader takes the config from, as the checkpoint's config.json gives it (None: absent)."""
    arch = ARCHS.get(family, family)
    rp = cfg.get("rope_parameters") or {}
    full, local = rp.get("full_attention", rp), rp.get("sliding_attention", {})
    want = {
        "general.architecture": arch,
        f"{arch}.block_count": cfg["num_hidden_layers"],
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": cfg["num_attention_heads"],
        f"{arch}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{arch}.attention.layer_norm_rms_epsilon": float(np.float32(cfg["rms_norm_eps"])),
        f"{arch}.rope.freq_base": float(full["rope_theta"]),
    }
    if "head_dim" in cfg and family not in ("granite", "phi3"):
        want[f"{arch}.attention.key_length"] = want[f"{arch}.attention.value_length"] = cfg["head_dim"]
    if family == "granite":
        for key, name in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                          ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):  # fmt: skip
            want[f"{arch}.{key}"] = float(np.float32(cfg[name]))
    if family == "gemma3_text":
        want[f"{arch}.attention.sliding_window"] = cfg["sliding_window"]
        want[f"{arch}.rope.freq_base_swa"] = float(local["rope_theta"])
        want[f"{arch}.attention.sliding_window_pattern"] = None  # layer_types are not written
    if family == "phi3":
        prf = float(rp.get("partial_rotary_factor", 1.0))
        want[f"{arch}.rope.dimension_count"] = int(prf * cfg["hidden_size"]) // cfg["num_attention_heads"]
        orig = cfg.get("original_max_position_embeddings", rp.get("original_max_position_embeddings"))
        want[f"{arch}.rope.scaling.original_context_length"] = orig
    if family == "mistral":
        want[f"{arch}.attention.sliding_window"] = cfg.get("sliding_window")  # None: none written
    if family == "smollm3":
        want[f"{arch}.attention.no_rope_layers"] = None  # no key for them: llama.cpp skips rope on every 4th layer
    return want


def metadata_checks(reader, cfg: dict, family: str) -> tuple[list[str], bool]:
    lines = ["| key | config says | file has | result |", "|---|---|---|---|"]
    ok_all = True
    for key, want in expected_metadata(cfg, family).items():
        field = reader.fields.get(key)
        got = None if field is None else field.contents()
        ok = got == want if not isinstance(want, float) else got is not None and abs(got - want) <= 1e-6 * abs(want)
        ok_all &= ok
        lines.append(f"| `{key}` | {want!r} | {got!r} | {'ok' if ok else 'FAIL'} |")
    n_tokens = len(reader.fields["tokenizer.ggml.tokens"].contents())
    ok = n_tokens == cfg["vocab_size"]
    ok_all &= ok
    lines.append(
        f"| len(`tokenizer.ggml.tokens`) | vocab_size {cfg['vocab_size']} | {n_tokens} | {'ok' if ok else 'FAIL'} |"
    )
    return lines, ok_all


def rel(a, b) -> str:
    return f"{float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))):.2e}"


def q8_bound(want: np.ndarray) -> np.ndarray:
    """Q8_0's rounding bound per value: half its block's step (blocks of 32 along the row, step d = max|w| / 127),
    plus the step's own rounding to fp16 (a relative 2^-11) times a code of up to 127."""
    blocks = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True)
    bound = blocks / 127 * (0.5 + 127 * 2.0**-11) * (1 + 1e-6) + 1e-12
    return np.broadcast_to(bound, (blocks.shape[0], 32)).reshape(want.shape)


def check(case: str, gguf_path: Path, folder: Path) -> tuple[str, bool]:
    """report.md's section for one file -> (markdown, all checks passed)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import load_file

    family = CASES[case][0]
    family = {"qwen3_bias": "qwen3", "phi4_mini": "phi3"}.get(family, family)
    cfg = json.loads((folder / "config.json").read_text())
    reader = GGUFReader(str(gguf_path))
    lines = [f"## {gguf_path.name}", "", "### metadata", "", "| key | type | value |", "|---|---|---|"]
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        types = "/".join(t.name for t in field.types)
        value = field_value(field).replace("|", "&#124;")
        lines.append(f"| `{name}` | {types} | {value} |")
    meta, ok_all = metadata_checks(reader, cfg, family)
    lines += ["", "### metadata against the checkpoint's config", "", *meta]
    lines += ["", "### tensors (GGML order: ne0 first)", "", "| name | shape | type |", "|---|---|---|"]
    values = {}
    for t in reader.tensors:
        lines.append(f"| `{t.name}` | {list(map(int, t.shape))} | {t.tensor_type.name} |")
        values[t.name] = (dequantize(t.data, t.tensor_type), t.tensor_type.name)
    lines += ["", "### checkpoint tensors against the file", ""]
    lines += [
        "| checkpoint tensor | GGUF tensor | transform | type | max abs diff | result |",
        "|---|---|---|---|---|---|",
    ]
    seen = set()
    for hf, w in sorted(load_file(str(folder / "model.safetensors")).items()):
        name = gguf_name(hf, family)
        seen.add(name)
        want = expected(hf, w.float(), cfg, family).numpy()
        transform = []
        if family in PERMUTED and ("q_proj" in hf or "k_proj" in hf):
            transform.append("rows permuted (rotate-half -> pairs)")
        if family in NORM_PLUS_ONE and hf.endswith("norm.weight"):
            transform.append("+1")
        if name not in values:
            lines.append(f"| `{hf}` | `{name}` | – | – | – | MISSING |")
            ok_all = False
            continue
        got, qtype = values[name]
        got = got.reshape(want.shape) if got.size == want.size else got
        if got.shape != want.shape:
            lines.append(f"| `{hf}` | `{name}` | – | {qtype} | shape {got.shape} vs {want.shape} | FAIL |")
            ok_all = False
            continue
        diff = np.abs(got - want)
        ok = bool(np.all(diff == 0)) if qtype == "F32" else bool(np.all(diff <= q8_bound(want)))
        ok_all &= ok
        lines.append(
            f"| `{hf}` | `{name}` | {', '.join(transform) or 'none'} | {qtype} | {diff.max():.3g} | "
            f"{'ok' if ok else 'FAIL'} |"
        )
    extra = sorted(set(values) - seen)
    lines += ["", f"GGUF tensors with no checkpoint tensor: {', '.join(f'`{n}`' for n in extra) or 'none'}", ""]
    for name, what, ok in rope_checks({n: v for n, (v, _) in values.items()}, folder, cfg):
        ok_all &= ok
        lines.append(f"- `{name}` {what}: {'ok' if ok else 'FAIL'}")
    unchecked = [
        n for n in extra if n not in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
    ]
    if unchecked:
        lines.append(f"- unchecked extra tensors: {unchecked}")
    lines.append("")
    return "\n".join(lines), ok_all


def merged(rows: list[str], path: Path) -> list[str]:
    """This run's summary rows with the kept rows of the cases it did not run (a run of some cases keeps the
    others' lines), in CASES' order."""
    done = {r.split("|")[1].strip() for r in rows[2:]}
    old = path.read_text().splitlines()[2:] if path.is_file() else []
    keep = [r for r in old if r.split("|")[1].strip() not in done] + rows[2:]
    order = list(CASES)
    keep.sort(key=lambda r: order.index(c) if (c := r.split("|")[1].strip()) in order else len(order))
    return rows[:2] + keep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default all)")
    ap.add_argument("--force", action="store_true", help="rebuild the folders and files that exist")
    args = ap.parse_args()
    unknown = set(args.cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}: choose among {list(CASES)}")
    conv = converter()
    summary, failed = ["| case | type | fixes | checks |", "|---|---|---|---|"], False
    for case in args.cases or CASES:
        root = OUT / case
        folder, view = root / "folder", root / "view" / case  # the converter names the model after its folder
        if args.force or not (folder / "model.safetensors").is_file():
            shutil.rmtree(root, ignore_errors=True)
            build_folder(case, folder)
        fixes = build_view(case, folder, view)
        report = [f"# {case}", "", f"fixes for the converter: {'; '.join(fixes) or 'none'}", ""]
        for t in TYPES:
            out = root / f"{case}-{t}.gguf"
            if args.force or not out.is_file():
                print(f"[{case}] converting to {t}", flush=True)
                convert(conv, view, out, t, root / f"convert-{t}.log")
            text, ok = check(case, out, folder)
            report.append(text)
            failed |= not ok
            summary.append(f"| {case} | {t} | {'; '.join(fixes) or '–'} | {'ok' if ok else 'FAIL'} |")
            print(f"[{case}] {out.name}: {'ok' if ok else 'FAIL'}", flush=True)
        (root / "report.md").write_text("\n".join(report))
    print("\n".join(summary))
    (OUT / "summary.md").write_text("\n".join(merged(summary, OUT / "summary.md")) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
