"""vLLM's structured-output request (`sampling_parameters.structured_outputs`, or its older name `guided_decoding`)
-> this model's guide type and guide text (what `guided_decoding_guide_type` / `guided_decoding_guide` carry).

Exactly one constraint key may be set: json (a schema, as an object or a JSON string), regex, choice (a list of
strings), grammar (xgrammar EBNF), json_object (true: guide type json, xgrammar's built-in JSON grammar, which
vLLM's xgrammar backend uses for it too), structural_tag (xgrammar's JSON format). vLLM's tuning keys that change
nothing here are accepted: `backend` (the engine always uses xgrammar), `disable_fallback`,
`disable_any_whitespace` (whitespace is the config setting json_any_whitespace), `disable_additional_properties`,
and `whitespace_pattern` at null.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest

# constraint key -> guide type
KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "ebnf", "json_object": "json",
         "structural_tag": "structural_tag"}
# keys that tune vLLM's own guided-decoding backends; accepted, they change nothing here
TUNING = ("backend", "disable_fallback", "disable_any_whitespace", "disable_additional_properties",
          "whitespace_pattern", "_backend", "_backend_was_auto", "backend_was_auto")


def _given(value: Any) -> bool:
    return value is not None and value is not False and value != ""


def guide_of(name: str, spec: Any) -> tuple[str, str] | None:
    """spec: the dict (or its JSON text) under sampling_parameters.<name> -> (guide type, guide), or None when
    no constraint key is set. Raises InvalidRequest naming the problem."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except (ValueError, RecursionError):      # ValueError: JSONDecodeError, or an integer too long
            raise InvalidRequest(f"sampling_parameters.{name} must be a JSON object") from None
    if not isinstance(spec, dict):
        raise InvalidRequest(f"sampling_parameters.{name} must be an object with one of {sorted(KINDS)}")
    unknown = sorted(set(spec) - set(KINDS) - set(TUNING))
    if unknown:
        raise InvalidRequest(f"unknown keys in sampling_parameters.{name}: {unknown}; known: {sorted(KINDS)}")
    if spec.get("whitespace_pattern") is not None:
        raise InvalidRequest(f"sampling_parameters.{name}.whitespace_pattern is not supported; leave it null")
    given = [k for k in KINDS if _given(spec.get(k))]
    if len(given) > 1:
        raise InvalidRequest(f"sampling_parameters.{name} sets {given}; set exactly one")
    if not given:
        return None
    key = given[0]
    value = spec[key]
    if key == "json_object":
        if value is not True:
            raise InvalidRequest(f"sampling_parameters.{name}.json_object must be true or absent")
        return KINDS[key], ""
    if key == "choice":
        if not isinstance(value, list):
            raise InvalidRequest(f"sampling_parameters.{name}.choice must be a list of strings")
        return KINDS[key], json.dumps(value)
    if key in ("json", "structural_tag") and isinstance(value, (dict, list)):
        return KINDS[key], json.dumps(value)
    if not isinstance(value, str):
        raise InvalidRequest(f"sampling_parameters.{name}.{key} must be a string")
    return KINDS[key], value
