"""Value checks of the client contract: (field name, python value) -> the checked value, or InvalidRequest naming
the field. Every number is bounded by what its Triton data type carries (a JSON number may be any size), and a
client's value is never echoed back at length.

Pure Python (no torch, no Triton): the client imports it too, through contract.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import InvalidRequest
from ..request import INT32_MAX, UINT64_MAX


def _number(v: Any) -> Any:
    """Numbers may arrive as JSON strings (genai-perf sends sampling_parameters {"max_tokens": "32"}, and
    vllm_backend accepts that); anything that does not parse stays as it is and fails the type check."""
    if isinstance(v, str):
        try:
            return float(v) if any(c in v for c in ".eE") or v.strip().lower() in ("nan", "inf", "-inf") else int(v)
        except ValueError:
            return v
    return v


INT32 = (-INT32_MAX - 1, INT32_MAX)
SEED = (-(2**63), UINT64_MAX)  # OpenAI's signed seeds and UINT64 tensors alike (SamplingParams' seed range)


def _shown(v: Any) -> str:
    """A client's value for an error message, cut short (a JSON integer may have thousands of digits)."""
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"an integer of {len(str(abs(v)))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def to_int(name: str, v: Any, bounds: tuple[int, int] = INT32) -> int:
    """An integer within bounds (INT32: what the input tensor carries; a JSON number may be any size)."""
    v = _number(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise InvalidRequest(f"{name} must be an integer, got {_shown(v)}")
    if not bounds[0] <= v <= bounds[1]:
        raise InvalidRequest(f"{name} must be an integer in [{bounds[0]}, {bounds[1]}], got {_shown(v)}")
    return int(v)


def to_limit(name: str, v: Any) -> int:
    """A limit (max_tokens): any integer up to 2^63 - 1, larger than INT32 taken as INT32's largest (a client that
    means "no limit" may say 10**12; the context cuts the output long before either)."""
    return min(to_int(name, v, (INT32[0], 2**63 - 1)), INT32[1])


def to_seed(name: str, v: Any) -> int:
    return to_int(name, v, SEED)


def to_float(name: str, v: Any) -> float:
    v = _number(v)
    try:
        finite = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        raise InvalidRequest(f"{name} must be a finite number, got {_shown(v)}")
    return float(v)


def to_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise InvalidRequest(f"{name} must be a boolean, got {v!r}")


def to_draft_len(name: str, v: Any) -> int:
    """An integer, or "auto" (= -1: the engine chooses the draft length per step)."""
    return -1 if isinstance(v, str) and v.strip().lower() == "auto" else to_int(name, v)


def to_str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidRequest(f"{name} must be a string, got {v!r}")
    return v


def to_str_list(name: str, v: Any) -> list[str]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise InvalidRequest(f"{name} must be a string or a list of strings, got {v!r}")
    return list(items)


def to_logprobs(name: str, v: Any) -> int | None:
    """vLLM's logprobs: a count; false (older OpenAI frontends send it on every chat request) = none, true = 1."""
    if isinstance(v, bool):
        return 1 if v else None
    return to_int(name, v)


def to_int_list(name: str, v: Any) -> list[int]:
    items = v if isinstance(v, (list, tuple)) else [v]
    return [to_int(name, x) for x in items]


def to_logit_bias(name: str, v: Any) -> dict[int, float]:
    """A JSON object (or its text) of token id -> bias, as OpenAI and vLLM take it (ids may be strings)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long
            v = None
    if not isinstance(v, dict):
        raise InvalidRequest(f"{name} must be a JSON object of token id -> bias")
    return {to_int(f"{name} token id", k): to_float(f"{name}[{k}]", b) for k, b in v.items()}


def to_structured(name: str, v: Any) -> tuple[str, str, tuple] | None:
    from .structured import guide_of

    return guide_of(name.rsplit(".", 1)[-1], v)


def to_template_kwargs(name: str, v: Any) -> dict:
    from ..engine.prompt import parse_template_kwargs

    return parse_template_kwargs(v if isinstance(v, str) else json.dumps(v))


def to_messages(name: str, v: Any) -> list[dict]:
    from ..engine.prompt import parse_messages

    return parse_messages(v if isinstance(v, str) else json.dumps(v))
