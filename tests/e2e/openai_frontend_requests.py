"""The Triton requests that Triton's OpenAI-compatible frontend sends to the model `llm`, rebuilt exactly.

The frontend (https://github.com/triton-inference-server/server/tree/v2.71.0/python/openai, release 26.07)
turns an OpenAI request into one Triton request in one of two formats. It picks the format from the model's
`backend` in config.pbtxt: "vllm" gets its vLLM format, anything else (our `python` included) its TensorRT-LLM
format, unless the frontend runs with `--backend vllm` or `--backend tensorrtllm`.

vLLM format (engine/utils/triton.py, `_create_vllm_generate_request`), every tensor of shape [1]:

| input | dtype | value |
|---|---|---|
| `text_input` | BYTES | the prompt: the chat template rendered by the frontend's tokenizer, or the completion's |
| `stream` | BOOL | `stream` |
| `exclude_input_in_output` | BOOL | not `echo` (completions); true for chat |
| `sampling_parameters` | BYTES | JSON, below |
| `return_logprobs` | BOOL | true when logprobs were asked, else false (always sent) |
| `return_num_input_tokens`, `return_num_output_tokens` | BOOL | true (always sent) |

`sampling_parameters` is the OpenAI request's own fields, defaults included and None dropped (pydantic's
`model_dump(exclude_none=True)`), less those it handles itself, plus what it adds:
- chat: `frequency_penalty` (default 0), `ignore_eos` (false), `min_tokens` (if given), `n` (1),
  `presence_penalty` (0), `seed`, `stop` (a string or a list, as given), `temperature` (default 0.7), `top_p` (1);
- completions: the same keys, `temperature` defaulting to 1;
- `max_tokens`: `max_completion_tokens`, else `max_tokens`, else the frontend's `--default-max-tokens` (16);
- `logprobs`: chat `logprobs: true` sends `top_logprobs` (0..20; 1 when not given); completions send their
  `logprobs` (1..5) when it is above 0. The frontend only lets such a request through when the model's config
  `backend` is "vllm" (whatever `--backend` says), so for `llm` (`python`) these are the requests its converter
  builds but a 400 answers them first;
- `structured_outputs` (chat, `tool_choice` naming a function, or "required": the first tool): a JSON *string*
  (JSON inside JSON) of vLLM's `StructuredOutputsParams` dataclass as `dataclasses.asdict` writes it, every
  field present: `json` is the tool's `parameters` schema as a compact JSON string, the other constraints
  null, the options at their defaults, and the private `_backend` / `_backend_was_auto` fields too;
- never sent: `response_format` (dropped: `json_object` is not enforced; `json_schema` is refused by the
  frontend's request model), `logit_bias` (refused), `best_of`, `echo`, `stream_options`, `user`, tools.

TensorRT-LLM format (`_create_trtllm_generate_request`), every tensor of shape [1, 1] (`stop_words` [1, n]):
`text_input` BYTES, `stream` BOOL, `max_tokens` INT32, `stop_words` BYTES (when `stop` is given), `top_p`,
`frequency_penalty`, `presence_penalty`, `temperature` FP32 (always: they have defaults), `seed` UINT64 (when
given), `exclude_input_in_output` BOOL (completions only: not `echo`), `guided_decoding_guide_type` "json_schema"
and `guided_decoding_guide` (the tool's schema; named or "required" tool choice), `return_num_input_tokens` and
`return_num_output_tokens` BOOL true. No `sampling_parameters`, no `min_tokens` or `ignore_eos`, no logprobs.
This model does not take that format: Triton refuses a [1, 1] tensor for an input declared [1] before the model
sees it, and one config cannot declare both shapes. Run the frontend with `--backend vllm` (docs/openai.md).

Reading the responses (both formats; test_openai_frontend.py does the same): `text_output` must hold exactly
one string (the delta of a stream, the whole text otherwise; the frontend raises on any other element count);
a non-streaming request must end in one or two responses, the last one final, and the first one is read;
`num_input_tokens` / `num_output_tokens` are read as UINT32 or INT32 (another dtype: no `usage`), from a
response that holds both: `usage` is the first such response's prompt count and, on a stream with
`stream_options.include_usage`, the sum of every response's output count (so each response must count its own
tokens); `logprobs` is one JSON string per response, "null" or a list of `{token id: {"logprob", "rank",
"decoded_token"}}` whose lowest rank is taken as the chosen token; `finish_reason` and `cumulative_logprob`
are never asked for or read: the frontend answers `stop` on the last response (`tool_calls` when its
tool-call parser found calls in the text), even for an output that ran out of tokens.

Each `FrontendRequest` below is the request for one OpenAI request body, `body`, given in its docstring.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from collect import ASK, stream_infer
from triton_server import REPO

MODEL = "llm"
TOKENIZER = REPO / "models" / "SmolLM2-135M-Instruct"  # the frontend's --tokenizer (the served checkpoint)
DEFAULT_MAX_TOKENS = 16  # the frontend's --default-max-tokens default
LORA_SEPARATOR = "_lora_"  # the frontend's --lora-separator, as its own LoRA test runs it

# The request models' fields in declaration order (schemas/openai.py) with their defaults: what model_dump keeps.
# "float" fields are pydantic confloat: a value given as an integer is dumped as a float.
_CHAT_FIELDS = (
    ("messages", None),
    ("model", None),
    ("frequency_penalty", 0),
    ("ignore_eos", False),
    ("logit_bias", None),
    ("logprobs", False),
    ("top_logprobs", None),
    ("max_completion_tokens", None),
    ("max_tokens", None),
    ("min_tokens", None),
    ("n", 1),
    ("presence_penalty", 0),
    ("response_format", None),
    ("seed", None),
    ("stop", None),
    ("stream", False),
    ("stream_options", None),
    ("temperature", 0.7),
    ("top_p", 1),
    ("tools", None),
    ("tool_choice", None),
    ("user", None),
    ("function_call", None),
    ("functions", None),
)
_COMPLETION_FIELDS = (
    ("model", None),
    ("prompt", None),
    ("best_of", 1),
    ("echo", False),
    ("frequency_penalty", 0),
    ("ignore_eos", False),
    ("logit_bias", None),
    ("logprobs", None),
    ("max_tokens", None),
    ("min_tokens", None),
    ("n", 1),
    ("presence_penalty", 0),
    ("seed", None),
    ("stop", None),
    ("stream", False),
    ("stream_options", None),
    ("suffix", None),
    ("temperature", 1),
    ("top_p", 1),
    ("user", None),
)
_FLOAT_FIELDS = {"frequency_penalty", "presence_penalty", "temperature", "top_p"}
# what the vLLM format keeps out of sampling_parameters (or adds itself)
_VLLM_EXCLUDES = {
    "model",
    "stream",
    "messages",
    "prompt",
    "echo",
    "store",
    "metadata",
    "response_format",
    "service_tier",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "function_call",
    "functions",
    "suffix",
    "max_completion_tokens",
    "max_tokens",
    "logprobs",
    "top_logprobs",
    "best_of",
}
# vLLM's guide dataclasses, their fields in order with their defaults, as dataclasses.asdict writes them:
# StructuredOutputsParams of current vLLM, the same with "disable_fallback" (earlier vLLM releases), and
# GuidedDecodingParams, what the frontend sent before release 25.11 (under the key "guided_decoding")
_STRUCTURED_OUTPUTS_FIELDS = (
    ("json", None),
    ("regex", None),
    ("choice", None),
    ("grammar", None),
    ("json_object", None),
    ("disable_any_whitespace", False),
    ("disable_additional_properties", False),
    ("whitespace_pattern", None),
    ("structural_tag", None),
    ("_backend", None),
    ("_backend_was_auto", False),
)
_STRUCTURED_OUTPUTS_FALLBACK_FIELDS = (
    _STRUCTURED_OUTPUTS_FIELDS[:5] + (("disable_fallback", False),) + _STRUCTURED_OUTPUTS_FIELDS[5:]
)
_GUIDED_DECODING_FIELDS = (
    ("json", None),
    ("regex", None),
    ("choice", None),
    ("grammar", None),
    ("json_object", None),
    ("backend", None),
    ("backend_was_auto", False),
    ("disable_fallback", False),
    ("disable_any_whitespace", False),
    ("disable_additional_properties", False),
    ("whitespace_pattern", None),
    ("structural_tag", None),
)
# releases: the frontend's vLLM format changed at 25.11 (structured_outputs instead of guided_decoding), at
# 25.12 (logprobs handled, return_logprobs sent; before, the chat request's own "logprobs": false went into
# sampling_parameters as it is) and at 26.01 (best_of kept out; before, completions carried "best_of": 1)
RELEASE = "26.07"


@dataclass(frozen=True)
class FrontendRequest:
    """One OpenAI request (`body`, to `endpoint` "chat" or "completions") and the Triton request the frontend of
    `release` sends for it in its vLLM format: `inputs`, name -> numpy array of the exact dtype and shape (strings
    as object arrays of UTF-8 bytes); `prompt` is its text_input."""

    name: str
    endpoint: str
    body: dict
    prompt: str
    inputs: dict
    release: str = RELEASE

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))

    @property
    def echo(self) -> bool:
        return self.endpoint == "completions" and bool(self.body.get("echo", False))

    @property
    def logprobs(self) -> int | None:
        """The top-n count sent as sampling_parameters.logprobs (None: logprobs not asked)."""
        if "return_logprobs" not in self.inputs:
            return None
        return json.loads(self.inputs["sampling_parameters"][0]).get("logprobs")

    @property
    def tool_name(self) -> str | None:
        """The function whose arguments the output is (named or "required" tool choice), else None."""
        return _named_tool(self.body)[0] if self.endpoint == "chat" else None

    @property
    def tool_schema(self) -> dict | None:
        return _named_tool(self.body)[1] if self.endpoint == "chat" else None

    @property
    def sampling_parameters(self) -> dict:
        return json.loads(self.inputs["sampling_parameters"][0]) if "sampling_parameters" in self.inputs else {}


@lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)


def chat_prompt(body: dict) -> str:
    """The prompt the frontend renders for a chat request: its tokenizer's chat template over the messages (text
    content only), the assistant turn opened, the tools passed to the template as the tools' model_dump()."""
    conversation = []
    for m in body["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "text", "text": part["text"]} for part in content]
        msg = {"role": m["role"], "content": content}
        if m["role"] == "user" and isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        conversation.append(msg)
    tools = None
    if body.get("tools") is not None:
        tools = [
            {
                "type": t["type"],
                "function": {
                    "description": t["function"].get("description"),
                    "name": t["function"]["name"],
                    "parameters": t["function"].get("parameters"),
                },
            }
            for t in body["tools"]
        ]
    return tokenizer().apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, tools=tools)


def _named_tool(body: dict) -> tuple[str | None, dict | None]:
    """The frontend's forced tool: tool_choice {"type": "function", "function": {"name"}} or "required" (which
    takes the first tool); (None, None) for "auto", "none" or no tool choice."""
    choice, tools = body.get("tool_choice"), body.get("tools")
    if choice is None or not tools:
        return None, None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
    elif choice == "required":
        name = tools[0]["function"]["name"]
    else:
        return None, None
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    return name, by_name[name].get("parameters")


def _guided_json(body: dict) -> str | None:
    """The forced tool's parameters as pydantic's model_dump_json writes them: compact JSON."""
    name, schema = _named_tool(body)
    return None if name is None else json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _max_tokens(endpoint: str, body: dict) -> int:
    if endpoint == "chat" and body.get("max_completion_tokens") is not None:
        return body["max_completion_tokens"]
    return body["max_tokens"] if body.get("max_tokens") is not None else DEFAULT_MAX_TOKENS


def _text(*values: str) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def vllm_inputs(
    endpoint: str, body: dict, prompt: str, release: str = RELEASE, lora: str | None = None
) -> dict[str, np.ndarray]:
    """The vLLM-format request (see the module docstring) of the frontend of `release` ("25.10" .. "26.07"); lora:
    the adapter that `--lora-separator` split off the request's model name ("llm_lora_<adapter>" with separator
    "_lora_"), sent as sampling_parameters' lora_name after the logprobs."""
    fields = _CHAT_FIELDS if endpoint == "chat" else _COMPLETION_FIELDS
    excludes = (
        _VLLM_EXCLUDES
        - ({"best_of"} if release < "26.01" else set())
        - ({"logprobs", "top_logprobs"} if release < "25.12" else set())
    )
    sp: dict[str, Any] = {}
    for name, default in fields:
        value = body.get(name, default)
        if value is None or name in excludes:
            continue
        sp[name] = float(value) if name in _FLOAT_FIELDS and name in body else value
    sp["max_tokens"] = _max_tokens(endpoint, body)
    want_logprobs = False
    if release < "25.12":
        pass
    elif endpoint == "chat":
        if body.get("logprobs"):
            sp["logprobs"] = body["top_logprobs"] if body.get("top_logprobs") is not None else 1
            want_logprobs = True
    elif body.get("logprobs") is not None and body["logprobs"] > 0:
        sp["logprobs"] = body["logprobs"]
        want_logprobs = True
    if lora is not None:
        sp["lora_name"] = lora
    guided = _guided_json(body) if endpoint == "chat" else None
    if guided is not None:
        key, layout = (
            ("structured_outputs", _STRUCTURED_OUTPUTS_FIELDS)
            if release >= "25.12"
            else ("structured_outputs", _STRUCTURED_OUTPUTS_FALLBACK_FIELDS)
            if release == "25.11"
            else ("guided_decoding", _GUIDED_DECODING_FIELDS)
        )
        params = dict(layout)
        params["json"] = guided
        sp[key] = json.dumps(params)
    switches = {"return_logprobs": np.array([want_logprobs], dtype=np.bool_)} if release >= "25.12" else {}
    return {
        **switches,
        "text_input": _text(prompt),
        "stream": np.array([bool(body.get("stream", False))], dtype=np.bool_),
        "exclude_input_in_output": np.array([not body.get("echo", False)], dtype=np.bool_),
        "sampling_parameters": _text(json.dumps(sp)),
        "return_num_input_tokens": np.array([True], dtype=np.bool_),
        "return_num_output_tokens": np.array([True], dtype=np.bool_),
    }


def frontend_request(
    name: str, endpoint: str, body: dict, release: str = RELEASE, lora: str | None = None
) -> FrontendRequest:
    body = {"model": MODEL if lora is None else f"{MODEL}{LORA_SEPARATOR}{lora}", **body}
    prompt = chat_prompt(body) if endpoint == "chat" else body["prompt"]
    return FrontendRequest(name, endpoint, body, prompt, vllm_inputs(endpoint, body, prompt, release, lora), release)


def send(server, req: FrontendRequest) -> list[dict]:
    """The request's tensors exactly as built (dtype and shape), and nothing else, over a gRPC stream."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = {name: None for name in ASK}  # stream_infer's own switches: not sent unless the request has them
    for name, arr in req.inputs.items():
        inputs[name] = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        inputs[name].set_data_from_numpy(arr)
    return stream_infer(server.grpc_url, inputs, timeout=120)


# ---- the requests ------------------------------------------------------------------------------------------

PLANETS = [{"role": "user", "content": "Name three planets of the solar system."}]
COMPLETION_PROMPT = "The three primary colors are"
LOGPROBS_PROMPT = "Write one sentence about the sea."
COMPLETION_LOGPROBS_PROMPT = "The ocean covers"
# A stream whose last response carries the usage.
STREAM_WITH_USAGE = {"stream": True, "stream_options": {"include_usage": True}}

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city.", "parameters": WEATHER_SCHEMA},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Current time in a time zone.", "parameters": TIME_SCHEMA},
    },
]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]


def completion_lora(adapter: str, prompt: str) -> FrontendRequest:
    """POST /v1/completions {"model": "llm_lora_<adapter>", "prompt": prompt, "temperature": 0, "max_tokens": 16}
    to the frontend run with `--lora-separator _lora_` (and `<version>/model.json` {"enable_lora": true}, which
    it reads to list the adapters): the adapter goes in sampling_parameters as lora_name."""
    return frontend_request(
        f"completion_lora_{adapter}",
        "completions",
        {"prompt": prompt, "temperature": 0, "max_tokens": 16},
        lora=adapter,
    )


def chat_basic() -> FrontendRequest:
    """POST /v1/chat/completions {"model": "llm", "messages": PLANETS, "temperature": 0}: no max tokens, so
    the frontend's default 16."""
    return frontend_request("chat_basic", "chat", {"messages": PLANETS, "temperature": 0})


def chat_stream() -> FrontendRequest:
    """{"messages": PLANETS, "temperature": 0, "max_completion_tokens": 16, "stream": true,
    "stream_options": {"include_usage": true}}: the same answer as chat_basic, streamed, usage at the end."""
    return frontend_request(
        "chat_stream",
        "chat",
        {"messages": PLANETS, "temperature": 0, "max_completion_tokens": 16, **STREAM_WITH_USAGE},
    )


def chat_stop() -> FrontendRequest:
    """{"messages": PLANETS, "temperature": 0, "max_tokens": 16, "stop": ["Mars", "Jupiter"]}."""
    return frontend_request(
        "chat_stop", "chat", {"messages": PLANETS, "temperature": 0, "max_tokens": 16, "stop": ["Mars", "Jupiter"]}
    )


def chat_seed() -> FrontendRequest:
    """{"messages": PLANETS, "seed": 1234, "max_completion_tokens": 12, "stream": true}: sampled at the chat
    default temperature 0.7, seeded (the same request twice gives the same text)."""
    return frontend_request(
        "chat_seed", "chat", {"messages": PLANETS, "seed": 1234, "max_completion_tokens": 12, "stream": True}
    )


def chat_penalties() -> FrontendRequest:
    """{"messages": PLANETS, "temperature": 0, "max_tokens": 16, "presence_penalty": 0.5, "frequency_penalty":
    0.5}."""
    return frontend_request(
        "chat_penalties",
        "chat",
        {"messages": PLANETS, "temperature": 0, "max_tokens": 16, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    )


def chat_json_object() -> FrontendRequest:
    """{"messages": [...JSON please...], "temperature": 0, "max_tokens": 16, "response_format": {"type":
    "json_object"}}: the frontend drops response_format, so this is a plain chat request."""
    return frontend_request(
        "chat_json_object",
        "chat",
        {
            "messages": [{"role": "user", "content": "Give a JSON object with the keys name and age."}],
            "temperature": 0,
            "max_tokens": 16,
            "response_format": {"type": "json_object"},
        },
    )


def chat_named_tool(stream: bool = False) -> FrontendRequest:
    """{"messages": WEATHER_QUESTION, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name":
    "get_weather"}}, "temperature": 0, "max_tokens": 48, "stream": stream}: the output, guided by get_weather's
    parameters schema, is the call's arguments."""
    return frontend_request(
        "chat_named_tool_stream" if stream else "chat_named_tool",
        "chat",
        {
            "messages": WEATHER_QUESTION,
            "tools": TOOLS,
            "temperature": 0,
            "max_tokens": 48,
            "stream": stream,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    )


def chat_required_tool() -> FrontendRequest:
    """{"messages": WEATHER_QUESTION, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
    "max_tokens": 48}: the frontend forces the first tool, get_weather."""
    return frontend_request(
        "chat_required_tool",
        "chat",
        {"messages": WEATHER_QUESTION, "tools": TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": 48},
    )


def _chat_logprobs(name: str, **extra: Any) -> FrontendRequest:
    """{"messages": [LOGPROBS_PROMPT], "temperature": 0, "max_tokens": 6, "logprobs": true, **extra}."""
    messages = [{"role": "user", "content": LOGPROBS_PROMPT}]
    return frontend_request(
        name, "chat", {"messages": messages, "temperature": 0, "max_tokens": 6, "logprobs": True, **extra}
    )


def chat_logprobs() -> FrontendRequest:
    """{"messages": [LOGPROBS_PROMPT], "temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 3}."""
    return _chat_logprobs("chat_logprobs", top_logprobs=3)


def chat_logprobs_stream() -> FrontendRequest:
    """{"messages": [LOGPROBS_PROMPT], "temperature": 0, "max_tokens": 6, "logprobs": true, "stream": true}:
    no top_logprobs, so the frontend asks for 1."""
    return _chat_logprobs("chat_logprobs_stream", stream=True)


def chat_logprobs_chosen_only() -> FrontendRequest:
    """{"messages": [LOGPROBS_PROMPT], "temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 0}:
    sampling_parameters.logprobs 0, the chosen tokens' logprobs alone."""
    return _chat_logprobs("chat_logprobs_chosen_only", top_logprobs=0)


def completion_basic() -> FrontendRequest:
    """POST /v1/completions {"model": "llm", "prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8}."""
    return frontend_request(
        "completion_basic", "completions", {"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8}
    )


def completion_stream() -> FrontendRequest:
    """{"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8, "stream": true, "stream_options":
    {"include_usage": true}}."""
    return frontend_request(
        "completion_stream",
        "completions",
        {"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8, **STREAM_WITH_USAGE},
    )


def completion_min_tokens() -> FrontendRequest:
    """{"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8, "min_tokens": 8, "ignore_eos": true}
    (min_tokens and ignore_eos are the frontend's extensions): exactly 8 tokens."""
    return frontend_request(
        "completion_min_tokens",
        "completions",
        {"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8, "min_tokens": 8, "ignore_eos": True},
    )


def completion_echo(stream: bool = False) -> FrontendRequest:
    """{"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8, "echo": true, "stream": stream}: the
    prompt comes back before the completion (exclude_input_in_output false)."""
    return frontend_request(
        "completion_echo_stream" if stream else "completion_echo",
        "completions",
        {"prompt": COMPLETION_PROMPT, "temperature": 0, "max_tokens": 8, "echo": True, "stream": stream},
    )


def completion_logprobs(stream: bool = False) -> FrontendRequest:
    """{"prompt": COMPLETION_LOGPROBS_PROMPT, "temperature": 0, "max_tokens": 6, "logprobs": 2, "stream":
    stream}."""
    return frontend_request(
        "completion_logprobs_stream" if stream else "completion_logprobs",
        "completions",
        {"prompt": COMPLETION_LOGPROBS_PROMPT, "temperature": 0, "max_tokens": 6, "logprobs": 2, "stream": stream},
    )


def earlier_releases() -> list[FrontendRequest]:
    """Chat (plain and with a forced tool) and a completion as the frontend of 25.10 sends them (guided_decoding,
    GuidedDecodingParams; "logprobs": false and "best_of": 1 in sampling_parameters; no return_logprobs), and the
    forced tool as 25.11 sends it (structured_outputs with disable_fallback)."""

    def at(r: FrontendRequest, release: str) -> FrontendRequest:
        body = {k: v for k, v in r.body.items() if k != "model"}
        return frontend_request(f"{r.name}_{release.replace('.', '_')}", r.endpoint, body, release=release)

    return [
        at(chat_basic(), "25.10"),
        at(chat_named_tool(), "25.10"),
        at(completion_basic(), "25.10"),
        at(chat_named_tool(), "25.11"),
    ]


def vllm_requests() -> list[FrontendRequest]:
    """Every vLLM-format request above."""
    return [
        chat_basic(),
        chat_stream(),
        chat_stop(),
        chat_seed(),
        chat_penalties(),
        chat_json_object(),
        chat_named_tool(),
        chat_named_tool(stream=True),
        chat_required_tool(),
        chat_logprobs(),
        chat_logprobs_stream(),
        chat_logprobs_chosen_only(),
        completion_basic(),
        completion_stream(),
        completion_min_tokens(),
        completion_echo(),
        completion_echo(stream=True),
        completion_logprobs(),
        completion_logprobs(stream=True),
    ]
