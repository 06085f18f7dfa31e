"""Triton's OpenAI-compatible frontend in front of `llm`: the exact requests it sends (openai_frontend_requests.py)
go through the real tritonserver over gRPC streams, and the responses are read the way the frontend reads them
(`frontend_answer` below follows engine/triton_engine.py and engine/utils/triton.py of its 26.07 release):
text without the prompt, `usage` equal to the real token counts, tool-call arguments that parse and satisfy the
tool's schema, logprobs where asked, the frontend's finish_reason. docs/openai.md says how to run it."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import jsonschema
import numpy as np
import pytest
from collect import errors_of, ids_of
from openai_frontend_requests import (
    FrontendRequest,
    chat_basic,
    chat_json_object,
    chat_named_tool,
    chat_required_tool,
    chat_seed,
    chat_stop,
    chat_stream,
    completion_basic,
    completion_echo,
    completion_min_tokens,
    completion_stream,
    earlier_releases,
    send,
    tokenizer,
    vllm_requests,
)

VLLM = vllm_requests() + earlier_releases()


# ---- what the frontend makes of the responses ---------------------------------------------------------------


@dataclass
class Answer:
    """The OpenAI answer the frontend builds from a request's responses (one choice)."""

    content: str = ""  # message.content / text, a stream's deltas joined
    tool_calls: list[dict] = field(default_factory=list)  # [{"name", "arguments"}] for a forced tool
    finish_reasons: list = field(default_factory=list)  # per chunk sent (one for a non-streaming answer)
    logprobs: list = field(default_factory=list)  # per chunk: chat content list / completion Logprobs
    usage: dict | None = None


def _one_string(resp: dict, name: str) -> str | None:
    """A STRING output as the frontend reads it: exactly one element, or it fails the request."""
    arr = resp["outputs"].get(name)
    if arr is None:
        return None
    assert arr.size == 1, f"the frontend needs exactly one {name} string per response, got shape {arr.shape}"
    value = arr.reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _usage(resp: dict) -> tuple[int, int] | None:
    """(prompt, completion) tokens of one response: both outputs present, each UINT32 or INT32 (read as its
    first element), else nothing."""
    n_in, n_out = resp["outputs"].get("num_input_tokens"), resp["outputs"].get("num_output_tokens")
    if (
        n_in is None
        or n_out is None
        or n_in.dtype not in (np.uint32, np.int32)
        or n_out.dtype not in (np.uint32, np.int32)
    ):
        return None
    return int(n_in.reshape(-1)[0]), int(n_out.reshape(-1)[0])


def _vllm_logprobs(resp: dict) -> list | None:
    text = _one_string(resp, "logprobs")
    if text is None or text == "null":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _by_rank(token_logprobs: dict) -> list[tuple[str, dict]]:
    return sorted(token_logprobs.items(), key=lambda item: item[1].get("rank", sys.maxsize))


def _chat_logprobs(data: list | None) -> list[dict] | None:
    """The ChatCompletionTokenLogprob list: per token, the lowest rank as the chosen one, every entry as a top."""
    if not data:
        return None
    out = []
    for token in data:
        if not token:
            continue
        ranked = _by_rank(token)
        chosen = ranked[0][1]
        out.append(
            {
                "token": chosen["decoded_token"],
                "logprob": chosen["logprob"],
                "bytes": list(chosen["decoded_token"].encode("utf-8")),
                "top_logprobs": [
                    {
                        "token": d["decoded_token"],
                        "logprob": d["logprob"],
                        "bytes": list(d["decoded_token"].encode("utf-8")),
                    }
                    for _, d in ranked
                ],
            }
        )
    return out


def _completion_logprobs(data: list | None, offset: int) -> dict | None:
    """The completions Logprobs object; text offsets count from `offset` (the text already streamed)."""
    if not data:
        return None
    lp = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    current = 0
    for token in data:
        if not token:
            continue
        ranked = _by_rank(token)
        chosen = ranked[0][1]
        lp["text_offset"].append(offset + current)
        lp["token_logprobs"].append(chosen["logprob"])
        lp["tokens"].append(chosen["decoded_token"])
        lp["top_logprobs"].append({d["decoded_token"]: d["logprob"] for _, d in ranked})
        current += len(chosen["decoded_token"])
    return lp


def frontend_answer(req: FrontendRequest, responses: list[dict]) -> Answer:
    """What the frontend answers for `req` given the model's responses (a request error fails the test)."""
    assert not errors_of(responses), f"{req.name}: {errors_of(responses)}"
    chat = req.endpoint == "chat"
    want_logprobs = bool(req.body.get("logprobs")) if chat else (req.body.get("logprobs") or 0) > 0
    answer = Answer()
    if not req.stream:
        assert 1 <= len(responses) <= 2 and responses[-1]["final"], (
            f"{req.name}: a non-streaming request must end in 1 or 2 responses, the last final: {len(responses)}"
        )
        resp = responses[0]
        text = _one_string(resp, "text_output") or ""
        if req.tool_name:
            answer.tool_calls = [{"name": req.tool_name, "arguments": text}]
        else:
            answer.content = text
        answer.finish_reasons = ["stop"]
        if want_logprobs:
            data = _vllm_logprobs(resp)
            answer.logprobs = [_chat_logprobs(data) if chat else _completion_logprobs(data, 0)]
        usage = _usage(resp)
    else:
        assert responses and responses[-1]["final"], f"{req.name}: the stream has no final response"
        prompt_tokens, completion_tokens, offset, arguments = None, 0, 0, []
        for resp in responses:
            counts = _usage(resp)
            if counts is not None:
                if prompt_tokens is None:
                    prompt_tokens = counts[0]
                completion_tokens += counts[1]
            delta = _one_string(resp, "text_output") or ""
            if req.tool_name:
                arguments.append(delta)
            else:
                answer.content += delta
            answer.finish_reasons.append("stop" if resp["final"] else None)
            if want_logprobs:
                data = _vllm_logprobs(resp)
                answer.logprobs.append(_chat_logprobs(data) if chat else _completion_logprobs(data, offset))
            offset += len(delta)
        if req.tool_name:
            answer.tool_calls = [{"name": req.tool_name, "arguments": "".join(arguments)}]
        usage = None if prompt_tokens is None else (prompt_tokens, completion_tokens)
    if usage is not None:
        answer.usage = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return answer


# ---- sending ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(triton_server):
    """name -> that request's responses; each request is sent once for the module."""
    cache: dict[str, list[dict]] = {}

    def get(req: FrontendRequest) -> list[dict]:
        if req.name not in cache:
            cache[req.name] = send(triton_server, req)
        return cache[req.name]

    return get


def prompt_tokens(req: FrontendRequest) -> int:
    return len(tokenizer()(req.prompt)["input_ids"])


def output_text(answer: Answer) -> str:
    return answer.tool_calls[0]["arguments"] if answer.tool_calls else answer.content


# ---- every request ------------------------------------------------------------------------------------------


def _check_served(req: FrontendRequest, responses: list[dict]) -> Answer:
    answer = frontend_answer(req, responses)
    ids = ids_of(responses)
    expected = {
        "prompt_tokens": prompt_tokens(req),
        "completion_tokens": len(ids),
        "total_tokens": prompt_tokens(req) + len(ids),
    }
    assert answer.usage == expected, f"{req.name}: usage {answer.usage}, real counts {expected}"
    max_tokens = req.sampling_parameters.get("max_tokens") or int(req.inputs["max_tokens"].reshape(-1)[0])
    assert 0 < len(ids) <= max_tokens
    text = output_text(answer)
    assert text.strip(), f"{req.name}: empty output"
    if req.echo:
        assert text.startswith(req.prompt) and len(text) > len(req.prompt)
    else:
        assert not text.startswith(req.prompt), f"{req.name}: the prompt came back: {text[:80]!r}"
    # the frontend ends every answer with "stop" on its last chunk (it never reads the model's finish_reason)
    assert answer.finish_reasons[-1] == "stop" and not any(answer.finish_reasons[:-1])
    return answer


@pytest.mark.parametrize("req", VLLM, ids=[r.name for r in VLLM])
def test_vllm_format_request_is_served(served, req):
    """Every vLLM-format request (the frontend with `--backend vllm`) is served and reads back correctly, the
    token counts as UINT32 as vllm_backend sends them."""
    responses = served(req)
    _check_served(req, responses)
    for resp in responses:
        for name in ("num_input_tokens", "num_output_tokens"):
            if name in resp["outputs"]:
                assert resp["outputs"][name].dtype == np.uint32, (name, resp["outputs"][name].dtype)


# ---- what the answers say -----------------------------------------------------------------------------------


def test_streamed_chat_is_the_non_streaming_answer(served):
    whole, streamed = served(chat_basic()), served(chat_stream())
    assert ids_of(streamed) == ids_of(whole)
    assert frontend_answer(chat_stream(), streamed).content == frontend_answer(chat_basic(), whole).content


def test_streamed_completion_is_the_non_streaming_answer(served):
    whole, streamed = served(completion_basic()), served(completion_stream())
    assert ids_of(streamed) == ids_of(whole)
    assert frontend_answer(completion_stream(), streamed).content == frontend_answer(completion_basic(), whole).content


def test_stop_strings_end_the_answer(served):
    full = frontend_answer(chat_basic(), served(chat_basic())).content
    stopped = frontend_answer(chat_stop(), served(chat_stop())).content
    cuts = [full.find(s) for s in chat_stop().body["stop"] if s in full]
    assert stopped == (full[: min(cuts)] if cuts else full)
    assert not any(s in stopped for s in chat_stop().body["stop"])


def test_seeded_sampling_repeats(triton_server, served):
    first = served(chat_seed())
    again = send(triton_server, chat_seed())
    assert ids_of(again) == ids_of(first)
    assert chat_seed().sampling_parameters["temperature"] == 0.7  # sampled, not greedy


def test_json_object_response_format_is_a_plain_request(served):
    """The frontend drops response_format: nothing guides the output (its JSON is not enforced)."""
    req = chat_json_object()
    assert "response_format" not in req.sampling_parameters and "structured_outputs" not in req.sampling_parameters
    _check_served(req, served(req))


@pytest.mark.parametrize(
    "req",
    [chat_named_tool(), chat_named_tool(stream=True), chat_required_tool()]
    + [r for r in earlier_releases() if r.tool_name],
    ids=lambda r: r.name,
)
def test_forced_tool_arguments_are_json_of_its_schema(served, req):
    """Named and "required" tool choice: structured_outputs.json (the tool's parameters schema) guides the output,
    which the frontend returns as the call's arguments."""
    answer = frontend_answer(req, served(req))
    assert answer.tool_calls[0]["name"] == "get_weather" and not answer.content
    jsonschema.validate(json.loads(answer.tool_calls[0]["arguments"]), req.tool_schema)


def _check_vllm_logprobs(req: FrontendRequest, responses: list[dict]) -> None:
    """The model's logprobs: per response, one entry per output token holding the chosen token (rank 1 when
    greedy) and n - 1 more (n = max(sampling_parameters.logprobs, 1)), ranked by logprob."""
    n = max(req.logprobs, 1)
    decoded = []
    for resp in responses:
        data = _vllm_logprobs(resp)
        ids = [int(i) for i in resp["outputs"]["output_ids"].reshape(-1).tolist()]
        if not ids and data is None:
            continue
        assert isinstance(data, list) and len(data) == len(ids), (req.name, data, ids)
        for token_id, entry in zip(ids, data, strict=True):
            assert str(token_id) in entry, (token_id, entry)
            assert len(entry) == n, entry
            ranked = _by_rank(entry)
            assert ranked[0][0] == str(token_id) and ranked[0][1]["rank"] == 1
            assert [d["rank"] for _, d in ranked] == list(range(1, n + 1))
            assert all(isinstance(d["logprob"], float) and d["logprob"] <= 0 for _, d in ranked)
            assert [d["logprob"] for _, d in ranked] == sorted((d["logprob"] for _, d in ranked), reverse=True)
            assert all(isinstance(d["decoded_token"], str) for _, d in ranked)
            if token_id not in tokenizer().all_special_ids:  # EOS is counted, but not in the text
                decoded.append(entry[str(token_id)]["decoded_token"])
    assert "".join(decoded) == output_text(frontend_answer(req, responses))


def _visible(tokens) -> str:
    """The text of decoded tokens, special ones (EOS) left out as the text output leaves them out."""
    return "".join(t for t in tokens if t not in tokenizer().all_special_tokens)


@pytest.mark.parametrize("req", [r for r in VLLM if r.logprobs is not None], ids=lambda r: r.name)
def test_logprobs_are_well_formed(served, req):
    responses = served(req)
    _check_vllm_logprobs(req, responses)
    answer = frontend_answer(req, responses)
    chunks = [c for c in answer.logprobs if c]
    assert chunks, f"{req.name}: the frontend found no logprobs"
    if req.endpoint == "chat":
        tokens = [t for chunk in chunks for t in chunk]
        assert len(tokens) == answer.usage["completion_tokens"]
        assert _visible(t["token"] for t in tokens) == answer.content
        assert all(len(t["top_logprobs"]) == max(req.logprobs, 1) for t in tokens)
    else:
        offsets = [o for chunk in chunks for o in chunk["text_offset"]]
        tokens = [t for chunk in chunks for t in chunk["tokens"]]
        assert len(tokens) == answer.usage["completion_tokens"]
        assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
        assert _visible(tokens) == answer.content


def test_outputs_not_asked_for_are_not_sent(served):
    """vllm_backend's semantics: the frontend never sends return_finish_reason or return_cumulative_logprob, and
    return_logprobs false unless logprobs were asked, so none of those outputs comes back."""
    for req in (chat_basic(), chat_stream(), completion_basic()):
        for resp in served(req):
            assert not {"finish_reason", "cumulative_logprob", "logprobs"} & set(resp["outputs"]), req.name


def test_min_tokens_and_ignore_eos(served):
    answer = frontend_answer(completion_min_tokens(), served(completion_min_tokens()))
    assert answer.usage["completion_tokens"] == 8


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_echo_returns_the_prompt_then_the_completion(served, stream):
    plain = frontend_answer(completion_basic(), served(completion_basic())).content
    req = completion_echo(stream)
    assert frontend_answer(req, served(req)).content == req.prompt + plain
