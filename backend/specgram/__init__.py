"""specgram: a continuous-batching LLM engine built for draft/target speculative decoding under grammars.

The engine never imports Triton; model_repository/llm/1/model.py is a thin adapter over it.
The names below load on first use, so that `specgram.contract` (the client contract) imports without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EngineConfig": "config",
    "EngineError": "errors",
    "InvalidRequest": "errors",
    "ModelLoadError": "errors",
    "RequestOutput": "request",
    "SamplingParams": "request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'specgram' has no attribute {name!r}")
