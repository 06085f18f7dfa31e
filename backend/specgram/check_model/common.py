"""What the checks share: the report's Row, the prompts and the tolerances."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

import torch

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three facts about the Moon:\n1."]
TOKENS = 16  # generated per prompt in the id checks
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "ok", "n"],
    "additionalProperties": False,
}
# logits' max abs diff, relative to their largest magnitude, by the dtype a forward computes in (the reference:
# transformers in float32; the native forward computes in float32 whatever its weights' dtype)
TOL = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}
SERVED_DEFAULTS = dict(  # model_repository/llm/config.pbtxt's engine parameters that differ from EngineConfig's
    device="auto", drafter="auto", draft_quantization="auto", prefix_cache="auto",
    default_num_draft_tokens="auto", default_num_draft_tokens_guided="auto",
)  # fmt: skip


@dataclass
class Row:
    check: str
    what: str
    ok: bool | None  # None: reported, not judged
    detail: str
    hint: str = ""


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def checkpoint_bytes(path: str) -> int:
    """The weight files' bytes (safetensors, else PyTorch .bin; a GGUF checkpoint's file)."""
    from ..model.source import open_source

    return open_source(path).nbytes if path else 0


def first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
