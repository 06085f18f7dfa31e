"""vLLM's structured-output request (`sampling_parameters.structured_outputs`, or its older name `guided_decoding`)
-> this model's guide type and guide text (what `guided_decoding_guide_type` / `guided_decoding_guide` carry).

Exactly one constraint key may be set: json (a schema, as an object or a JSON string), regex, choice (a list of
strings), grammar (xgrammar EBNF), json_object (true: guide type json, any JSON object or array; vLLM's xgrammar
backend takes an object only), structural_tag (xgrammar's JSON format). Two of vLLM's flags change a JSON grammar
as they do in vLLM: `disable_any_whitespace` true = the compact layout, no free whitespace (the request's own
json_any_whitespace false; for `json` and `json_object` alike), `disable_additional_properties`
true = no properties beyond a `json` schema's unless it allows them (the request's own json_strict true); false or
absent = the server's settings.
vLLM's tuning keys that change nothing here are accepted: `backend` (the engine always uses xgrammar),
`disable_fallback`, and `whitespace_pattern` at null.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from ..grammar.compile import JSON_OPTIONS

# constraint key -> guide type
KINDS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "ebnf",
    "json_object": "json",
    "structural_tag": "structural_tag",
}
# vLLM's flags that change a JSON grammar: flag -> the compile option it sets to that value when true (for the
# guide types that read that option: JSON_OPTIONS)
FLAGS = {
    "disable_any_whitespace": ("json_any_whitespace", False),
    "disable_additional_properties": ("json_strict", True),
}
# keys that tune vLLM's own guided-decoding backends; accepted, they change nothing here
TUNING = (
    "backend",
    "disable_fallback",
    "whitespace_pattern",
    "_backend",
    "_backend_was_auto",
    "backend_was_auto",
    *FLAGS,
)


def _given(value: Any) -> bool:
    return value is not None and value is not False and value != ""


def guide_of(name: str, spec: Any) -> tuple[str, str, tuple] | None:
    """spec: the dict (or its JSON text) under sampling_parameters.<name> -> (guide type, guide, the request's
    (name, value) compile options from vLLM's flags), or None when no constraint key is set. Raises InvalidRequest
    naming the problem."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long
            raise InvalidRequest(f"sampling_parameters.{name} must be a JSON object") from None
    if not isinstance(spec, dict):
        raise InvalidRequest(f"sampling_parameters.{name} must be an object with one of {sorted(KINDS)}")
    found = _guide(name, spec)
    if found is None:
        return None
    options = []
    for flag, option in FLAGS.items():
        if spec.get(flag) is not None and not isinstance(spec[flag], bool):
            raise InvalidRequest(f"sampling_parameters.{name}.{flag} must be true or false")
        if spec.get(flag) and option[0] in JSON_OPTIONS.get(found[0], ()):
            options.append(option)
    return (*found, tuple(options))


def _guide(name: str, spec: dict) -> tuple[str, str] | None:
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
