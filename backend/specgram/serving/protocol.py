"""Turn a request's inputs (the client contract, declared in contract.py) into engine terms, and the engine's
logprobs into the wire's JSON; no Triton here.

Sources, highest precedence first: input tensors, the `sampling_parameters` JSON object (as vllm_backend and
genai-perf `--backend vllm` send it), then request parameters (how HTTP generate passes extra JSON keys). A key
given both as an input and in sampling_parameters must have one value. Every type or value problem raises
InvalidRequest naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest
from ..request import SamplingParams
from .contract import INPUT, OPTIONS, OUTPUTS

# the options (inputs that may also come in sampling_parameters or as request parameters) -> SamplingParams
_PARAMS = {name: f.param for name, f in OPTIONS.items() if f.param is not None}

# vllm_backend's additional-output switches (the contract's return_* inputs): input tensors only, as vllm_backend
# reads them
_SWITCHES = tuple(name for name in INPUT if name.startswith("return_"))

# vLLM sampling_parameters keys this engine does not implement, with the value that changes nothing: clients
# built for vllm_backend (Triton's OpenAI-compatible frontend among them) send some of them on every request.
# At that value a key is accepted and ignored; any other value is refused, naming the key. None: absent, null,
# or empty ("", [], {}).
NEUTRAL = {
    "n": 1,
    "best_of": 1,
    "min_p": 0,
    "length_penalty": 1,
    "use_beam_search": False,
    "early_stopping": False,
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "detokenize": True,
    "prompt_logprobs": None,
    "truncate_prompt_tokens": None,
}
_STRUCTURED = ("structured_outputs", "guided_decoding")
_GUIDE_OPTIONS = "guide_options"  # the structured object's compile options (vLLM's flags), not an input


@dataclass
class ClientRequest:
    text: str | None
    messages: list[dict] | None
    chat: bool
    stream: bool
    exclude_input_in_output: bool
    params: SamplingParams
    outputs: frozenset[str] = frozenset()  # the outputs sent only when asked (contract switch) that were asked
    template_kwargs: dict | None = None  # chat_template_kwargs: extra variables of the chat template


def parse(inputs: dict[str, Any], request_parameters: dict[str, Any] | None = None) -> ClientRequest:
    """inputs: name -> python value (scalars already unwrapped from their [1] tensors, strings decoded);
    request_parameters: the request's parameters map (may hold anything; unknown keys are ignored)."""
    request_parameters = request_parameters or {}
    raw_sp = inputs.get("sampling_parameters", request_parameters.get("sampling_parameters"))
    sources = [
        ("request parameter ", {k: v for k, v in request_parameters.items() if k in OPTIONS}),
        ("sampling_parameters.", _sampling_parameters(raw_sp) if raw_sp else {}),
        ("", {k: v for k, v in inputs.items() if k in OPTIONS}),
    ]
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for prefix, given in sources:  # lowest precedence first; every value is checked, even one overridden
        for k, v in given.items():
            if v is None:
                continue
            value = OPTIONS[k].convert(prefix + k, v)
            # an input tensor and sampling_parameters disagreeing is a malformed request, not a precedence
            # question (request parameters, HTTP generate's spare keys, do yield to both)
            if origin.get(k) == "sampling_parameters." and prefix == "" and values[k] != value:
                raise InvalidRequest(
                    f"{k} is given as an input ({value!r}) and in sampling_parameters "
                    f"({values[k]!r}) with different values; give it once"
                )
            values[k], origin[k] = value, prefix

    text = inputs.get("text_input")
    if text is not None and not isinstance(text, str):
        raise InvalidRequest("text_input must be a string")
    messages = values.get("messages")
    if messages is None and not text:
        raise InvalidRequest("text_input is required and must not be empty (or give a messages list)")
    stream = values.get("stream", False)
    _structured(values)
    params = SamplingParams(**{param: values[name] for name, param in _PARAMS.items() if name in values})
    params.guide_options = values.get(_GUIDE_OPTIONS, ())
    asked = frozenset(
        name for name in _SWITCHES if inputs.get(name) is not None and INPUT[name].convert(name, inputs[name])
    )
    params.cumulative_logprob = "return_cumulative_logprob" in asked
    return ClientRequest(
        text=text,
        messages=messages,
        chat=values.get("apply_chat_template", False),
        stream=stream,
        exclude_input_in_output=values.get("exclude_input_in_output", stream),
        params=params,
        outputs=frozenset(f.name for f in OUTPUTS if f.switch in asked),
        template_kwargs=values.get("chat_template_kwargs"),
    )


def _structured(values: dict[str, Any]) -> None:
    """A structured_outputs / guided_decoding object becomes the guide type and guide (given once)."""
    given = [(k, values.pop(k)) for k in _STRUCTURED if values.get(k) is not None]
    if not given:
        return
    if len(given) > 1 or "guided_decoding_guide_type" in values:
        names = [k for k, _ in given] + (
            ["guided_decoding_guide_type"] if "guided_decoding_guide_type" in values else []
        )
        raise InvalidRequest(f"a guide is given more than once ({', '.join(names)}); give one")
    values["guided_decoding_guide_type"], values["guided_decoding_guide"], values[_GUIDE_OPTIONS] = given[0][1]


def _sampling_parameters(raw: Any) -> dict[str, Any]:
    """The sampling_parameters JSON object (a string, or already a dict when it came as a request parameter)."""
    try:
        sp = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as e:  # json.JSONDecodeError, and an integer of more than 4300 digits
        raise InvalidRequest(f"sampling_parameters is not valid JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest("sampling_parameters is nested too deeply to parse") from None
    if not isinstance(sp, dict):
        raise InvalidRequest("sampling_parameters must be a JSON object")
    unknown = sorted(set(sp) - set(OPTIONS) - set(NEUTRAL))
    if unknown:
        raise InvalidRequest(f"unknown keys in sampling_parameters: {unknown}; known: {sorted(OPTIONS)}")
    for key in sorted(set(sp) & set(NEUTRAL)):
        if not _is_neutral(sp[key], NEUTRAL[key]):
            raise InvalidRequest(
                f"sampling_parameters.{key} = {sp[key]!r} is not supported by this model; only "
                f"{'an empty value' if NEUTRAL[key] is None else repr(NEUTRAL[key])} is accepted"
            )
    return {k: v for k, v in sp.items() if k in OPTIONS}


def _is_neutral(value: Any, neutral: Any) -> bool:
    """value (as a JSON client sends it: numbers and booleans may come as strings) means `neutral`."""
    if neutral is None:
        return value is None or value in ("", [], {})
    if isinstance(neutral, bool):
        text = str(value).strip().lower()
        return text in (("true", "1") if neutral else ("false", "0"))
    try:
        return not isinstance(value, bool) and float(value) == neutral
    except (TypeError, ValueError):
        return False


def logprobs_json(rows: list | None) -> str:
    """Per token, its [chosen, top-n...] TokenLogprobs (request.py) -> the `logprobs` output, vllm_backend's JSON:
    a list with one object per token, {"<token id>": {"logprob", "rank", "decoded_token"}}, the chosen token
    first. None -> "null" (the request asked for no logprobs in sampling_parameters)."""
    if rows is None:
        return "null"
    return json.dumps(
        [
            {str(e.token_id): {"logprob": e.logprob, "rank": e.rank, "decoded_token": e.decoded} for e in row}
            for row in rows
        ]
    )  # a row lists each token once (logprobs.py)
