"""The engine's GGUF reader against llama.cpp's converter: each file family_ggufs.py wrote, read by the engine, must
give its checkpoint folder's config, tokenizer and tensors back, and serve the folder's greedy ids.

    source scripts/env.sh && PYTHONPATH=$PWD/backend python scripts/compare/gguf_reader_check.py [CASE ...]

Per case of family_ggufs.py (default: every case whose files exist under build/gguf-families/) and file type:
- config: the keys a served model depends on (CONFIG_KEYS, the rotary parameters) and the rotary frequency tables
  of the two transformers models (the file's rebuilt from its metadata and rope tensors);
- tokenizer: the ids of each prompt, its special ids, and whether it has the chat template;
- tensors: every parameter of the model, the reader's (the converter's changes undone) against the reference
  folder's, exactly (Gemma's norms, stored as float32(1 + w), within half an ulp of 1);
- greedy ids of each prompt (12 tokens, draft lengths 0 and 3) served from the file and from the reference folder,
  both under `weights int8`.
The reference folder of an F32 file is the checkpoint folder; of a Q8_0 file, build/gguf-families/<case>/folder-q8_0:
the checkpoint with its quantized tensors replaced by the file's values, de-quantized and put back in order here
(family_ggufs.py's names and unpermute), independently of the engine's reader.
Writes build/gguf-families/reader.md (one line per case, type and check, each difference named) and exits non-zero
where a check fails. Runs in the project venv; the native kernels must load (AVX-512 or AVX2) for the greedy ids.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # family_ggufs
OUT = REPO / "build" / "gguf-families"
TYPES = ("f32", "q8_0")
PROMPTS = ["Hello there", "abcabc abcabc abc", "The quick brown fox jumps", "x"]
MAX_TOKENS = 12
DRAFTS = (0, 3)
CONFIG_KEYS = (
    "model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "tie_word_embeddings", "vocab_size", "rms_norm_eps", "max_position_embeddings",
    "layer_types", "sliding_window", "query_pre_attn_scalar", "no_rope_layers", "embedding_multiplier",
    "residual_multiplier", "attention_multiplier", "logits_scaling", "attention_bias", "hidden_act",
    "hidden_activation", "final_logit_softcapping", "attn_logit_softcapping", "original_max_position_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id",
)  # fmt: skip
ROPE_KEYS = ("rope_type", "rope_theta", "factor", "partial_rotary_factor", "original_max_position_embeddings",
             "long_factor", "short_factor", "low_freq_factor", "high_freq_factor")  # fmt: skip
# attention_factor: the file states phi3's longrope scaling, which a config may leave to its default; the rotary
# modules' attention_scaling is compared instead
SERVED_AS = {"mistral": "llama"}  # a Mistral is written, and served, as llama


def same(a, b) -> bool:
    """Equal, floats (and lists of them) to float32's precision: the metadata holds float32."""
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def rope_of(cfg) -> dict:
    """The rotary parameters that apply to full attention (gemma3's: rope_parameters["full_attention"])."""
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    return rp.get("full_attention", rp) if isinstance(rp.get("full_attention"), dict) else rp


def config_diffs(file: Path, folder: Path) -> list[str]:
    from specgram.model.source import open_source

    ours, theirs = open_source(file).skeleton(torch.float32), open_source(folder).skeleton(torch.float32)
    c_ours, c_theirs = ours.config, theirs.config
    diffs = []
    for key in CONFIG_KEYS:
        if not hasattr(c_theirs, key):
            continue
        want = getattr(c_theirs, key)
        want = SERVED_AS.get(want, want) if key == "model_type" else want
        got = getattr(c_ours, key, None)  # absent is None: a Mistral served as llama has no sliding_window
        if not same(got, want):
            diffs.append(f"config {key}: file {got!r}, folder {want!r}")
    r_ours, r_theirs = rope_of(c_ours), rope_of(c_theirs)
    # Llama 3's scaling comes as the rope_freqs divisors, applied to the rotary table (compared below), not as
    # parameters of the config
    keys = ("rope_theta",) if r_theirs.get("rope_type") == "llama3" else ROPE_KEYS
    for key in keys:
        if key in r_theirs or key in r_ours:
            if not same(r_ours.get(key), r_theirs.get(key)):
                diffs.append(f"rope_parameters {key}: file {r_ours.get(key)!r}, folder {r_theirs.get(key)!r}")
    local_o, local_t = (dict(c.rope_parameters or {}).get("sliding_attention") for c in (c_ours, c_theirs))
    if local_t is not None and not same((local_o or {}).get("rope_theta"), local_t.get("rope_theta")):
        diffs.append(f"rope_parameters.sliding_attention rope_theta: file {local_o}, folder {local_t}")
    scale_o, scale_t = (getattr(m.model.rotary_emb, "attention_scaling", None) for m in (ours, theirs))
    if not same(scale_o, scale_t):
        diffs.append(f"rotary attention_scaling: file {scale_o!r}, folder {scale_t!r}")
    tables = dict(theirs.model.rotary_emb.named_buffers())
    for name, t in ours.model.rotary_emb.named_buffers():
        if name not in tables:
            diffs.append(f"rotary buffer {name}: the folder's model has none")
        elif t.shape != tables[name].shape or not torch.allclose(t, tables[name], rtol=1e-6, atol=0):
            rel = ((t - tables[name]).abs() / tables[name].abs().clamp_min(1e-30)).max().item()
            diffs.append(f"rotary buffer {name}: max rel diff {rel:.2e}")
    return diffs


def tokenizer_diffs(file: Path, folder: Path) -> list[str]:
    from transformers import AutoTokenizer

    from specgram.model.gguf_checkpoint import checkpoint

    ours, theirs = checkpoint(file).tokenizer(), AutoTokenizer.from_pretrained(folder)
    diffs = []
    for p in PROMPTS:
        a, b = ours(p)["input_ids"], theirs(p)["input_ids"]
        if a != b:
            diffs.append(f"tokenizer ids of {p!r}: file {a}, folder {b}")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(ours, key) != getattr(theirs, key):
            diffs.append(f"tokenizer {key}: file {getattr(ours, key)!r}, folder {getattr(theirs, key)!r}")
    if bool(ours.chat_template) != bool(theirs.chat_template) or (ours.chat_template or "") != (
        theirs.chat_template or ""
    ):
        diffs.append("tokenizer chat_template differs")
    return diffs


def reference(case: str, file: Path, folder: Path) -> Path:
    """The folder a file must serve like: the checkpoint folder itself for an F32 file; for a quantized one, a copy
    whose quantized tensors are the file's values, de-quantized by the gguf package and put back in transformers'
    order here (family_ggufs.py's names and unpermute: independent of the engine's reader), the others the
    folder's."""
    if file.name.endswith("-f32.gguf"):
        return folder
    import shutil

    from family_ggufs import CASES, PERMUTED, gguf_name, unpermute
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import load_file, save_file

    out = folder.parent / f"folder-{file.stem.rsplit('-', 1)[1]}"
    if (out / "model.safetensors").is_file() and (out / "model.safetensors").stat().st_mtime > file.stat().st_mtime:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    family = {"qwen3_bias": "qwen3", "phi4_mini": "phi3"}.get(CASES[case][0], CASES[case][0])
    cfg = json.loads((folder / "config.json").read_text())
    tensors = {t.name: t for t in GGUFReader(str(file)).tensors}
    values = {}
    for hf, w in load_file(str(folder / "model.safetensors")).items():
        t = tensors[gguf_name(hf, family)]
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            values[hf] = w
            continue
        v = torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32)).reshape(w.shape)
        if family in PERMUTED and hf.endswith(("q_proj.weight", "k_proj.weight")):
            v = unpermute(v, cfg["num_attention_heads" if "q_proj" in hf else "num_key_value_heads"])
        values[hf] = v.to(w.dtype).contiguous()
    save_file(values, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    return out


def tensor_diffs(file: Path, folder: Path) -> tuple[list[str], int]:
    """-> (differences, parameters compared)."""
    from specgram.model.checkpoint import TensorFiles
    from specgram.model.gguf_checkpoint import checkpoint
    from specgram.model.source import open_source

    model = open_source(file).skeleton(torch.float32)
    params = {name: p.shape for name, p in model.named_parameters()}
    files = checkpoint(file).tensors(model.config.num_hidden_layers)
    files.expect(params)
    folder_files = TensorFiles(folder)
    diffs = [f"tensor {n}: the reader finds no GGUF tensor" for n in sorted(set(params) - set(files.meta))]
    for name in sorted(files.meta):
        got = files.get(name)
        if name not in folder_files:  # a tied head: the folder has no lm_head.weight
            diffs.append(f"tensor {name}: in the file's model, not in the folder")
            continue
        want = folder_files.get(name).float()
        if got.shape != want.shape:
            diffs.append(f"tensor {name}: shape file {list(got.shape)}, folder {list(want.shape)}")
            continue
        kind = files.block_type(name)
        diff = (got - want).abs()
        # exact, but for Gemma's norms: float32(1 + w) - 1 is w to within half an ulp of 1
        if not bool((diff <= (6e-8 if "norm" in name else 0)).all()):
            diffs.append(f"tensor {name} ({kind}): max abs diff {diff.max().item():.3g}")
    return diffs, len(files.meta)


@functools.lru_cache(maxsize=2)
def greedy(path: Path) -> dict[int, list[list[int]]]:
    """Each prompt's greedy ids per draft length, served under `weights int8`."""
    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine
    from specgram.engine.generate import generate
    from specgram.request import SamplingParams

    config = EngineConfig(checkpoint=str(path), device="cpu", max_slots=4, max_seq_len=256, weights="int8")
    out = {}
    with closing(Engine.from_config(config)) as e:
        for k in DRAFTS:
            params = SamplingParams(max_tokens=MAX_TOKENS, num_draft_tokens=k, ignore_eos=True)
            reqs = [e.make_request(params, text=p) for p in PROMPTS]
            done = {g.request.request_id: g.outputs for g in generate(e, reqs).generations}
            out[k] = [[t for o in done[r.request_id] for t in o.token_ids] for r in reqs]
    return out


def greedy_diffs(theirs: dict, ours: dict) -> list[str]:
    diffs = []
    for k in DRAFTS:
        for p, a, b in zip(PROMPTS, ours[k], theirs[k], strict=True):
            if a != b:
                first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                diffs.append(f"greedy ids of {p!r} at draft length {k}: first differ at {first}: file {a}, folder {b}")
    return diffs


def cases(names: list[str]) -> list[str]:
    if names:
        return names
    return sorted(p.name for p in OUT.iterdir() if (p / "folder" / "config.json").is_file())


def merged(rows: list[str], path: Path) -> list[str]:
    """This run's rows with the kept rows of the cases it did not run, by case."""
    case = lambda r: r.split("|")[1].split()[0]  # noqa: E731
    done = {case(r) for r in rows[2:]}
    old = [r for r in path.read_text().splitlines()[2:] if r.startswith("| ")] if path.is_file() else []
    return rows[:2] + sorted([r for r in old if case(r) not in done] + rows[2:], key=case)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="family_ggufs.py's cases (default: those built)")
    ap.add_argument("--no-serve", action="store_true", help="skip the greedy ids (config, tokenizer, tensors only)")
    args = ap.parse_args()
    lines, failed = ["| case | type | check | result |", "|---|---|---|---|"], False
    for case in cases(args.cases):
        folder = OUT / case / "folder"
        family = json.loads((folder / "config.json").read_text())["model_type"]
        for t in TYPES:
            file = OUT / case / f"{case}-{t}.gguf"
            if not file.is_file():
                continue
            ref = reference(case, file, folder)
            checks = {}
            for what, fn in (("config", config_diffs), ("tokenizer", tokenizer_diffs)):
                try:
                    checks[what] = fn(file, folder)
                except Exception as e:  # a reader that refuses the file: its words are the finding
                    checks[what] = [f"{what} raised {type(e).__name__}: {e}"]
            try:
                diffs, n = tensor_diffs(file, ref)
                checks[f"tensors ({n})"] = diffs
            except Exception as e:
                checks["tensors"] = [f"raised {type(e).__name__}: {e}"]
            if not args.no_serve:
                try:
                    checks["greedy ids, int8"] = greedy_diffs(greedy(ref), greedy(file))
                except Exception as e:
                    checks["greedy ids, int8"] = [f"raised {type(e).__name__}: {e}"]
            for what, diffs in checks.items():
                failed |= bool(diffs)
                cell = [d.replace("|", "&#124;").replace("\n", "\\n") for d in diffs]  # one table row
                result = "ok" if not diffs else "<br>".join(cell)
                lines.append(f"| {case} ({family}) | {t} | {what} | {result} |")
                print(f"[{case} {t}] {what}: {'ok' if not diffs else 'FAIL'}", flush=True)
                for d in diffs:
                    print(f"    {d}", flush=True)
    (OUT / "reader.md").write_text("\n".join(merged(lines, OUT / "reader.md")) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
