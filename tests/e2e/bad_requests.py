"""The robustness suite's table of bad requests (test_robustness.py sends them all next to a good stream).

Each entry says who refuses the request and what the one error it gets must name:
  MODEL   the model refuses it (protocol.py, request.py, prompt.py, grammar.py): INVALID_ARG. Triton's gRPC
          stream carries only an error's message, not its code; HTTP generate answers INVALID_ARG with 400 and
          INTERNAL with 500, so a request that has a JSON form is sent there too and must get 400.
  TRITON  tritonserver refuses it before the model runs (a data type or shape that config.pbtxt does not
          declare, an input it does not know); its message names the input and "model 'llm'".
`xfail` marks a request the server answers wrongly today (the test is a strict xfail with that reason).
ACCEPTED lists requests that look odd but are valid by the contract: they must succeed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

MODEL = "INVALID_ARG"
TRITON = "TRITON_INVALID_ARG"

# Every request starts from this; an entry's inputs replace (None removes) these.
BASE = {"text_input": "Hi", "max_tokens": 2}


@dataclass(frozen=True)
class Case:
    id: str
    inputs: dict[str, Any]
    field: str  # the error message must contain this
    refused_by: str = MODEL
    parameters: dict | None = None  # gRPC request parameters
    xfail: str | None = None

    def request(self) -> dict[str, Any]:
        return {**BASE, **self.inputs}

    def http_body(self) -> dict | None:
        """The same request as an HTTP generate JSON body, or None where it has no JSON form (raw tensors, bytes,
        non-finite numbers, request parameters)."""
        if self.parameters:
            return None
        body = {}
        for name, value in self.request().items():
            if value is None:
                continue
            if name in ("sampling_parameters", "messages") and isinstance(value, (dict, list)):
                value = json.dumps(value)
            if not _json_safe(value):
                return None
            body[name] = value
        return body


@dataclass(frozen=True)
class Accepted:
    id: str
    inputs: dict[str, Any]
    parameters: dict | None = None
    finish_reasons: tuple[str, ...] = ("length", "stop")

    def request(self) -> dict[str, Any]:
        return {**BASE, **self.inputs}


def _json_safe(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_json_safe(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (str, bool, int))


def tensor(name: str, values: list, dtype: str) -> grpcclient.InferInput:
    """A raw input tensor with any Triton dtype and shape (values: a nested list)."""
    numpy_dtype = {
        "BYTES": np.object_,
        "BOOL": np.bool_,
        "INT32": np.int32,
        "INT64": np.int64,
        "UINT64": np.uint64,
        "FP32": np.float32,
        "FP64": np.float64,
    }[dtype]
    arr = np.array(values, dtype=numpy_dtype)
    t = grpcclient.InferInput(name, list(arr.shape), dtype)
    t.set_data_from_numpy(arr)
    return t


def sp(**options: Any) -> dict:
    """sampling_parameters carrying `options`."""
    return {"sampling_parameters": options}


def guide(kind: str, text: str | None) -> dict:
    return {"guided_decoding_guide_type": kind, "guided_decoding_guide": text}


def refused_tensor(id: str, name: str, values: list, dtype: str) -> Case:
    """Input `name` as a raw tensor of a data type or shape config.pbtxt does not declare: tritonserver refuses
    it, naming the input."""
    return Case(id, {name: tensor(name, values, dtype)}, name, TRITON)


def bad_guide(id: str, kind: str, text: str | None, field: str = "") -> Case:
    """A guide of `kind` the model refuses; the error names "<kind> guide" unless `field` says otherwise."""
    return Case(id, guide(kind, text), field or f"{kind} guide")


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_schema(depth: int) -> str:
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "integer"}' + "}}" * depth


# ---- tritonserver refuses: a data type config.pbtxt does not declare ------------------------------------------
WRONG_DTYPE = [
    refused_tensor("dtype-text_input-int32", "text_input", [1], "INT32"),
    refused_tensor("dtype-stream-int32", "stream", [1], "INT32"),
    refused_tensor("dtype-max_tokens-fp32", "max_tokens", [2.0], "FP32"),
    refused_tensor("dtype-max_tokens-string", "max_tokens", [b"2"], "BYTES"),
    refused_tensor("dtype-max_tokens-int64", "max_tokens", [2], "INT64"),
    refused_tensor("dtype-temperature-fp64", "temperature", [0.0], "FP64"),
    refused_tensor("dtype-temperature-string", "temperature", [b"0.5"], "BYTES"),
    refused_tensor("dtype-top_p-int32", "top_p", [1], "INT32"),
    refused_tensor("dtype-top_k-fp32", "top_k", [5.0], "FP32"),
    refused_tensor("dtype-seed-int64", "seed", [-1], "INT64"),
    refused_tensor("dtype-stop-int32", "stop", [1, 2], "INT32"),
    refused_tensor("dtype-ignore_eos-string", "ignore_eos", [b"yes"], "BYTES"),
    refused_tensor("dtype-num_draft_tokens-fp32", "num_draft_tokens", [2.0], "FP32"),
    refused_tensor("dtype-drafter-int32", "drafter", [1], "INT32"),
    refused_tensor("dtype-guide_type-bool", "guided_decoding_guide_type", [True], "BOOL"),
    refused_tensor("dtype-guide-int32", "guided_decoding_guide", [7], "INT32"),
    refused_tensor("dtype-exclude_input_in_output-fp32", "exclude_input_in_output", [1.0], "FP32"),
    refused_tensor("dtype-sampling_parameters-int32", "sampling_parameters", [1], "INT32"),
    refused_tensor("dtype-apply_chat_template-int32", "apply_chat_template", [1], "INT32"),
    refused_tensor("dtype-messages-fp32", "messages", [1.0], "FP32"),
]

# ---- tritonserver refuses: a shape config.pbtxt does not declare (two elements where one is expected, ...) ----
_TWO = {
    "text_input": ([b"Hi", b"there"], "BYTES"),
    "stream": ([True, False], "BOOL"),
    "max_tokens": ([2, 3], "INT32"),
    "temperature": ([0.0, 0.5], "FP32"),
    "top_p": ([1.0, 0.5], "FP32"),
    "top_k": ([0, 5], "INT32"),
    "seed": ([1, 2], "UINT64"),
    "ignore_eos": ([True, False], "BOOL"),
    "num_draft_tokens": ([0, 1], "INT32"),
    "drafter": ([b"ngram", b"grammar"], "BYTES"),
    "guided_decoding_guide_type": ([b"regex", b"json"], "BYTES"),
    "guided_decoding_guide": ([b"a", b"b"], "BYTES"),
    "exclude_input_in_output": ([True, False], "BOOL"),
    "sampling_parameters": ([b"{}", b"{}"], "BYTES"),
    "apply_chat_template": ([True, False], "BOOL"),
    "messages": ([b"[]", b"[]"], "BYTES"),
}
WRONG_SHAPE = [
    refused_tensor(f"shape-{name}-two-elements", name, values, dtype) for name, (values, dtype) in _TWO.items()
] + [
    refused_tensor("shape-max_tokens-1x1", "max_tokens", [[2]], "INT32"),
    refused_tensor("shape-max_tokens-empty", "max_tokens", [], "INT32"),
    refused_tensor("shape-text_input-empty", "text_input", [], "BYTES"),
    refused_tensor("shape-stop-2d", "stop", [[b"a", b"b"]], "BYTES"),
    refused_tensor("unknown-input", "bogus", [1], "INT32"),
]

# ---- the model refuses: values out of range or of the wrong kind -------------------------------------------
VALUES = [
    Case("max_tokens-0", {"max_tokens": 0}, "max_tokens"),
    Case("max_tokens-negative", {"max_tokens": -1}, "max_tokens"),
    Case("max_tokens-0-in-sampling_parameters", {"max_tokens": None, **sp(max_tokens=0)}, "max_tokens"),
    Case("max_tokens-not-a-number", {"max_tokens": None, **sp(max_tokens="abc")}, "max_tokens"),
    Case("max_tokens-fraction", {"max_tokens": None, **sp(max_tokens=1.5)}, "max_tokens"),
    Case("max_tokens-boolean", {"max_tokens": None, **sp(max_tokens=True)}, "max_tokens"),
    Case("max_tokens-list", {"max_tokens": None, **sp(max_tokens=[4])}, "max_tokens"),
    Case("temperature-negative", {"temperature": -1.0}, "temperature"),
    Case("temperature-nan", {"temperature": float("nan")}, "temperature"),
    Case("temperature-inf", {"temperature": float("inf")}, "temperature"),
    Case("temperature--inf", {"temperature": float("-inf")}, "temperature"),
    Case("temperature-word", sp(temperature="hot"), "temperature"),
    Case("temperature-overflows", sp(temperature="1e400"), "temperature"),
    Case("top_p-0", {"top_p": 0.0}, "top_p"),
    Case("top_p-1.5", {"top_p": 1.5}, "top_p"),
    Case("top_p-negative", {"top_p": -0.5}, "top_p"),
    Case("top_p-nan", {"top_p": float("nan")}, "top_p"),
    Case("top_k--5", {"top_k": -5}, "top_k"),
    Case("top_k--2", {"top_k": -2}, "top_k"),
    Case("top_k-fraction", sp(top_k="1.5"), "top_k"),
    Case("seed-below-int64", sp(seed=-(2**63) - 1), "seed"),
    Case("seed-2^64", sp(seed=2**64), "seed"),
    Case("seed-word", sp(seed="abc"), "seed"),
    Case("seed-fraction", sp(seed=1.5), "seed"),
    Case("num_draft_tokens--2", {"num_draft_tokens": -2}, "num_draft_tokens"),
    Case("num_draft_tokens-99", {"num_draft_tokens": 99}, "num_draft_tokens"),
    Case("num_draft_tokens-above-max_draft_len", {"num_draft_tokens": 9}, "num_draft_tokens"),
    Case("num_draft_tokens-word", sp(num_draft_tokens="abc"), "num_draft_tokens"),
    Case("stop-too-many", {"stop": [f"s{i}" for i in range(17)]}, "stop"),
    Case("stop-empty-string", {"stop": [""]}, "stop"),
    Case("stop-one-empty-of-two", {"stop": ["ok", ""]}, "stop"),
    Case("stop-numbers", sp(stop=[1, 2]), "stop"),
    Case("stop-empty-in-sampling_parameters", sp(stop=""), "stop"),
    Case("ignore_eos-2", sp(ignore_eos=2), "ignore_eos"),
    Case("stream-word", sp(stream="maybe"), "stream"),
    Case("exclude_input_in_output-word", sp(exclude_input_in_output="no"), "exclude_input_in_output"),
    Case("apply_chat_template-word", sp(apply_chat_template="yes"), "apply_chat_template"),
    Case("drafter-unknown", {"drafter": "magic"}, "drafter"),
    Case("drafter-empty", {"drafter": ""}, "drafter"),
    Case("drafter-number", sp(drafter=5), "drafter"),
    Case("presence_penalty-out-of-range", {"presence_penalty": 5.0}, "presence_penalty"),
    Case("repetition_penalty-zero", sp(repetition_penalty=0), "repetition_penalty"),
    Case("logit_bias-not-an-object", sp(logit_bias=[1, 2]), "logit_bias"),
    Case("logit_bias-token-outside-the-vocabulary", sp(logit_bias={"10000000": 1}), "logit_bias"),
    Case("logit_bias-too-large", {"logit_bias": '{"5": 500}'}, "logit_bias"),
    Case("stop_token_ids-words", sp(stop_token_ids=["x"]), "stop_token_ids"),
    Case("stop_token_ids-negative", {"stop_token_ids": tensor("stop_token_ids", [-3], "INT32")}, "stop_token_ids"),
    Case("allowed_token_ids-empty", sp(allowed_token_ids=[]), "allowed_token_ids"),
    Case("bad_words-empty-word", sp(bad_words=[""]), "bad_words"),
    Case("logprobs-21", sp(logprobs=21), "logprobs"),
    Case("logprobs-word", sp(logprobs="many"), "logprobs"),
    # magnitudes: a JSON number may be any size; the tensors that carry the same field are INT32 / FP32
    Case("top_k-1e20-in-sampling_parameters", sp(temperature=1, top_k=10**20), "top_k"),
    Case("top_k-1e20-as-text", sp(top_k=str(10**20)), "top_k"),
    Case("num_draft_tokens-1e20", sp(num_draft_tokens=10**20), "num_draft_tokens"),
    Case("stop_token_ids-1e20", sp(stop_token_ids=[10**20]), "stop_token_ids"),
    Case("logit_bias-token-1e20", sp(logit_bias={str(10**20): 1}), "logit_bias"),
    Case("temperature-integer-beyond-float", sp(temperature=10**400), "temperature"),
    Case("integer-of-5000-digits", {"sampling_parameters": '{"top_k": ' + "9" * 5000 + "}"}, "sampling_parameters"),
    Case("stop-longer-than-max_stop_chars", {"stop": ["x" * 1001]}, "max_stop_chars"),
    Case("bad_words-longer-than-max_stop_chars", sp(bad_words=["x" * 1001]), "max_stop_chars"),
]

# ---- the model refuses: guides ------------------------------------------------------------------------------
GUIDES = [
    bad_guide("guide_type-unknown", "yaml", "a: b", "guided_decoding_guide_type"),
    bad_guide("guide_type-empty", "", "a", "guided_decoding_guide_type"),
    Case("guide_type-list", sp(guided_decoding_guide_type=["regex"]), "guided_decoding_guide_type"),
    bad_guide("guide-missing-json_schema", "json_schema", None, "guided_decoding_guide"),
    bad_guide("guide-missing-regex", "regex", None, "guided_decoding_guide"),
    bad_guide("guide-missing-ebnf", "ebnf", None, "guided_decoding_guide"),
    bad_guide("guide-missing-structural_tag", "structural_tag", None, "guided_decoding_guide"),
    Case("guide-without-type", {"guided_decoding_guide": "[a-z]+"}, "guided_decoding_guide_type"),
    Case(
        "guide-object", sp(guided_decoding_guide_type="regex", guided_decoding_guide={"a": 1}), "guided_decoding_guide"
    ),
    bad_guide("guide-too-large", "regex", "x" * 300_000, "guided_decoding_guide"),
    bad_guide("schema-not-json", "json_schema", "{not json", "guided_decoding_guide"),
    bad_guide("schema-type-5", "json_schema", '{"type": 5}'),
    bad_guide("schema-array", "json_schema", "[1, 2]"),
    bad_guide("schema-string", "json_schema", '"string"'),
    bad_guide("schema-ref-missing", "json_schema", '{"$ref": "#/definitions/missing"}'),
    bad_guide(
        "schema-ref-cycle",
        "json_schema",
        json.dumps({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}),
    ),
    bad_guide("schema-properties-not-object", "json_schema", '{"type": "object", "properties": 3}'),
    bad_guide("schema-minLength-above-maxLength", "json_schema", '{"type": "string", "minLength": 5, "maxLength": 2}'),
    bad_guide("schema-integer-beyond-int64", "json_schema", '{"type": "integer", "minimum": -1e30}'),
    bad_guide("regex-unclosed", "regex", "("),
    bad_guide("regex-bad-range", "regex", "[z-a]"),
    bad_guide("regex-bad-repeat", "regex", "a{3,1}"),
    bad_guide("regex-nothing-to-repeat", "regex", "*a"),
    bad_guide("ebnf-empty-rule", "ebnf", "root ::= "),
    bad_guide("ebnf-no-root", "ebnf", 'foo ::= "a"'),
    bad_guide("ebnf-undefined-rule", "ebnf", "root ::= bar"),
    bad_guide("ebnf-dangling-alternative", "ebnf", 'root ::= "a" |'),
    bad_guide("ebnf-nested-too-deep", "ebnf", "root ::= " + "(" * 5000 + '"a"' + ")" * 5000),
    bad_guide("structural_tag-not-json", "structural_tag", "junk", "guided_decoding_guide"),
    bad_guide("structural_tag-no-format", "structural_tag", '{"foo": 1}'),
    bad_guide("structural_tag-unknown-format", "structural_tag", '{"type": "structural_tag", "format": {"type": "x"}}'),
    bad_guide("structural_tag-array", "structural_tag", "[]"),
    bad_guide("json-guide-text-given", "json", '{"type": "integer"}', "guided_decoding_guide"),
    bad_guide("json_object-guide-text-given", "json_object", '{"type": "string"}', "guided_decoding_guide"),
    bad_guide("schema-nested-too-deep", "json_schema", _deep_schema(2000), "guided_decoding_guide"),
    bad_guide("structural_tag-nested-too-deep", "structural_tag", _deep(5000), "guided_decoding_guide"),
    bad_guide("choice-not-a-list", "choice", '"yes"'),
    bad_guide("choice-empty-string", "choice", '["yes", ""]'),
    Case("structured_outputs-two-constraints", sp(structured_outputs={"regex": "a", "json": {}}), "exactly one"),
    Case("structured_outputs-unknown-key", sp(structured_outputs={"xml": "<a/>"}), "structured_outputs"),
    Case("structured_outputs-bad-regex", sp(structured_outputs={"regex": "a(b"}), "regex"),
    Case("guided_decoding-choice-not-a-list", sp(guided_decoding={"choice": "yes"}), "choice"),
    bad_guide("schema-type-list-of-objects", "json_schema", '{"type": [{}]}'),
    bad_guide("schema-format-list", "json_schema", '{"type": "string", "format": ["date"]}'),
    bad_guide(
        "schema-integer-of-5000-digits",
        "json_schema",
        '{"type": "integer", "minimum": ' + "9" * 5000 + "}",
        "guided_decoding_guide",
    ),
    Case(
        "structured_outputs-flag-not-boolean",
        sp(structured_outputs={"json": {"type": "object"}, "disable_any_whitespace": "yes"}),
        "disable_any_whitespace",
    ),
    Case(
        "structured_outputs-and-guide-inputs",
        {**guide("regex", "a"), **sp(structured_outputs={"regex": "b"})},
        "more than once",
    ),
]

# ---- the model refuses: sampling_parameters, messages, the prompt, request parameters ------------------------
REQUEST = [
    Case("sampling_parameters-not-json", {"sampling_parameters": "{oops"}, "sampling_parameters"),
    Case("sampling_parameters-array", {"sampling_parameters": "[1, 2]"}, "sampling_parameters"),
    Case("sampling_parameters-null", {"sampling_parameters": "null"}, "sampling_parameters"),
    Case("sampling_parameters-number", {"sampling_parameters": "42"}, "sampling_parameters"),
    Case("sampling_parameters-true", {"sampling_parameters": "true"}, "sampling_parameters"),
    Case("sampling_parameters-unknown-key", sp(bogus=1), "bogus"),
    Case("sampling_parameters-text_input-key", sp(text_input="x"), "text_input"),
    Case("sampling_parameters-nested", sp(sampling_parameters="{}"), "sampling_parameters"),
    Case("sampling_parameters-nested-too-deep", {"sampling_parameters": _deep(5000)}, "sampling_parameters"),
    Case("conflict-temperature", {"temperature": 0.0, **sp(temperature=0.7)}, "temperature"),
    Case("conflict-max_tokens", {"max_tokens": 2, **sp(max_tokens=0)}, "max_tokens"),
    Case("conflict-stop", {"stop": ["a"], **sp(stop=["b"])}, "stop"),
    Case("messages-not-json", {"messages": "not json"}, "messages"),
    Case("messages-object", {"messages": '{"role": "user", "content": "hi"}'}, "messages"),
    Case("messages-empty-list", {"messages": "[]"}, "messages"),
    Case("messages-no-content", {"messages": '[{"role": "user"}]'}, "messages"),
    Case("messages-content-number", {"messages": '[{"role": "user", "content": 5}]'}, "messages"),
    Case("messages-role-number", {"messages": '[{"role": 1, "content": "x"}]'}, "messages"),
    Case("messages-strings", {"messages": '["hi"]'}, "messages"),
    Case("messages-in-sampling_parameters-not-json", sp(messages="nope"), "messages"),
    Case("messages-nested-too-deep", {"messages": _deep(5000)}, "messages"),
    Case("prompt-empty", {"text_input": ""}, "text_input"),
    Case("prompt-empty-chat", {"text_input": "", "apply_chat_template": True}, "text_input"),
    Case("prompt-missing", {"text_input": None}, "text_input"),
    # 10000 tokens: more than any max_seq_len the default model allows (8192 positions)
    Case("prompt-longer-than-max_seq_len", {"text_input": "word " * 10_000}, "prompt"),
    Case("messages-longer-than-max_seq_len", {"messages": [{"role": "user", "content": "word " * 10_000}]}, "prompt"),
    Case("parameter-max_tokens-0", {"max_tokens": None}, "max_tokens", parameters={"max_tokens": 0}),
    Case("parameter-temperature-word", {}, "temperature", parameters={"temperature": "hot"}),
    Case("parameter-top_p-2", {}, "top_p", parameters={"top_p": 2.0}),
    Case(
        "parameter-sampling_parameters-not-json", {}, "sampling_parameters", parameters={"sampling_parameters": "{oops"}
    ),
]

# ---- the model refuses: strings that are not UTF-8 ------------------------------------------------------------
NOT_UTF8 = [
    Case("utf8-text_input", {"text_input": b"\xff\xfe"}, "text_input"),
    Case("utf8-text_input-truncated-sequence", {"text_input": b"Hi \xc3("}, "text_input"),
    Case("utf8-guide", {**guide("regex", None), "guided_decoding_guide": b"\xff"}, "guided_decoding_guide"),
    Case("utf8-guide_type", {"guided_decoding_guide_type": b"\xff"}, "guided_decoding_guide_type"),
    Case("utf8-stop", {"stop": [b"\xff"]}, "stop"),
    Case("utf8-drafter", {"drafter": b"\xff"}, "drafter"),
    Case("utf8-sampling_parameters", {"sampling_parameters": b"\xff"}, "sampling_parameters"),
    Case("utf8-messages", {"messages": b"\xff"}, "messages"),
]

BAD: list[Case] = WRONG_DTYPE + WRONG_SHAPE + VALUES + GUIDES + REQUEST + NOT_UTF8

# Odd but valid: each must succeed (max_tokens larger than the context is cut by max_seq_len, not refused).
ACCEPTED = [
    Accepted("max_tokens-int32-max", {"max_tokens": 2**31 - 1, **guide("regex", "(yes|no)")}, finish_reasons=("stop",)),
    Accepted(
        "max_tokens-1e12-in-sampling_parameters",
        {"max_tokens": None, **sp(max_tokens=10**12), **guide("regex", "(yes|no)")},
        finish_reasons=("stop",),
    ),
    Accepted("max_tokens-as-string", {"max_tokens": None, **sp(max_tokens="2")}, finish_reasons=("length",)),
    Accepted("top_k--1-is-off", {"top_k": -1}),
    Accepted("num_draft_tokens--1-is-auto", {"num_draft_tokens": -1}),
    Accepted("num_draft_tokens-auto-in-sampling_parameters", {"num_draft_tokens": None, **sp(num_draft_tokens="auto")}),
    Accepted("stop-empty-list", {"stop": tensor("stop", [], "BYTES")}),
    Accepted("guide_type-upper-case", guide("REGEX", "(yes|no)")),
    Accepted("request-parameter-unknown-key-ignored", {}, parameters={"bogus": 1}),
    Accepted(
        "vllm-keys-implemented",
        sp(
            presence_penalty=0.5,
            frequency_penalty="0.2",
            repetition_penalty=1.1,
            logit_bias={"5": -100},
            stop_token_ids=[7],
            bad_words=["the"],
            logprobs=3,
        ),
    ),
    Accepted("logprobs-false-is-none", sp(logprobs=False)),
    Accepted("seed-negative", {"seed": None, **sp(seed=-7, temperature=0.8)}),
    Accepted(
        "max_tokens-1e12-as-text",
        {"max_tokens": None, **sp(max_tokens=str(10**12)), **guide("regex", "(yes|no)")},
        finish_reasons=("stop",),
    ),
    Accepted("temperature-1e-300-is-greedy", sp(temperature=1e-300)),
    Accepted(
        "structured_outputs-compact-json",
        {
            "max_tokens": 8,
            **sp(
                structured_outputs={
                    "json": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    "disable_any_whitespace": True,
                    "disable_additional_properties": True,
                }
            ),
        },
    ),
    Accepted(
        "structured_outputs-choice",
        {"max_tokens": 6, **sp(structured_outputs={"choice": ["yes", "no"]})},
        finish_reasons=("stop",),
    ),
]

assert len({c.id for c in BAD} | {a.id for a in ACCEPTED}) == len(BAD) + len(ACCEPTED), "duplicate case ids"
