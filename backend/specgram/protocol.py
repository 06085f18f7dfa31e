"""The client contract, independent of Triton: turn a request's inputs into engine terms.

Sources, highest precedence first: input tensors, the `sampling_parameters` JSON object (as vllm_backend and
genai-perf `--backend vllm` send it), then request parameters (how HTTP generate passes extra JSON keys).
Every type or value problem raises InvalidRequest naming the field.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest
from .prompt import parse_messages
from .request import SamplingParams


def _number(v: Any) -> Any:
    """Numbers may arrive as JSON strings (genai-perf sends sampling_parameters {"max_tokens": "32"}, and
    vllm_backend accepts that); anything that does not parse stays as it is and fails the type check."""
    if isinstance(v, str):
        try:
            return float(v) if any(c in v for c in ".eE") or v.strip().lower() in ("nan", "inf", "-inf") else int(v)
        except ValueError:
            return v
    return v


def _int(name: str, v: Any) -> int:
    v = _number(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise InvalidRequest(f"{name} must be an integer, got {v!r}")
    return int(v)


def _float(name: str, v: Any) -> float:
    v = _number(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidRequest(f"{name} must be a finite number, got {v!r}")
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise InvalidRequest(f"{name} must be a boolean, got {v!r}")


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidRequest(f"{name} must be a string, got {v!r}")
    return v


def _stop(name: str, v: Any) -> list[str]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise InvalidRequest(f"{name} must be a string or a list of strings, got {v!r}")
    return list(items)


def _messages(name: str, v: Any) -> list[dict]:
    return parse_messages(v if isinstance(v, str) else json.dumps(v))


# field -> converter; every optional input of the model, and every key sampling_parameters may carry
FIELDS = {
    "max_tokens": _int, "temperature": _float, "top_p": _float, "top_k": _int, "seed": _int, "stop": _stop,
    "num_draft_tokens": _int, "guided_decoding_guide_type": _str, "guided_decoding_guide": _str,
    "ignore_eos": _bool, "stream": _bool, "exclude_input_in_output": _bool, "apply_chat_template": _bool,
    "messages": _messages, "drafter": _str,
}
_TO_PARAMS = {"guided_decoding_guide_type": "guide_type", "guided_decoding_guide": "guide"}
_PARAM_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "num_draft_tokens",
                 "guided_decoding_guide_type", "guided_decoding_guide", "ignore_eos", "drafter")


@dataclass
class ClientRequest:
    text: str | None
    messages: list[dict] | None
    chat: bool
    stream: bool
    exclude_input_in_output: bool
    params: SamplingParams


def parse(inputs: dict[str, Any], request_parameters: dict[str, Any] | None = None) -> ClientRequest:
    """inputs: name -> python value (scalars already unwrapped from their [1] tensors, strings decoded);
    request_parameters: the request's parameters map (may hold anything; unknown keys are ignored)."""
    merged: dict[str, Any] = {k: v for k, v in (request_parameters or {}).items() if k in FIELDS}
    raw_sp = inputs.get("sampling_parameters", request_parameters.get("sampling_parameters")
                        if request_parameters else None)
    if raw_sp:
        try:
            sp = json.loads(raw_sp) if isinstance(raw_sp, str) else raw_sp
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"sampling_parameters is not valid JSON: {e}") from None
        if not isinstance(sp, dict):
            raise InvalidRequest("sampling_parameters must be a JSON object")
        unknown = sorted(set(sp) - set(FIELDS))
        if unknown:
            raise InvalidRequest(f"unknown keys in sampling_parameters: {unknown}; known: {sorted(FIELDS)}")
        merged.update(sp)
    merged.update({k: v for k, v in inputs.items() if k in FIELDS})
    values = {k: FIELDS[k](k, v) for k, v in merged.items() if v is not None}

    text = inputs.get("text_input")
    if text is not None and not isinstance(text, str):
        raise InvalidRequest("text_input must be a string")
    messages = values.get("messages")
    if messages is None and not text:
        raise InvalidRequest("text_input is required and must not be empty (or give a messages list)")
    stream = values.get("stream", False)
    params = SamplingParams(**{_TO_PARAMS.get(k, k): values[k] for k in _PARAM_FIELDS if k in values})
    return ClientRequest(text=text, messages=messages, chat=values.get("apply_chat_template", False), stream=stream,
                         exclude_input_in_output=values.get("exclude_input_in_output", stream), params=params)
