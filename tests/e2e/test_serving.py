"""End-to-end through the real tritonserver with the default model (SmolLM2-135M-Instruct), gRPC streaming
and HTTP generate_stream. One server for the whole session (fixture `triton_server`)."""

import json
import queue
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from collect import errors_of, ids_of, last_value, stream_infer, text_of, total_of
from stream_client import build_inputs
from triton_server import REPO, metric_total

PROMPT = "Give me three facts about the Moon."
CHECKPOINT = REPO / "models" / "SmolLM2-135M-Instruct"


def greedy(server, prompt=PROMPT, max_tokens=24, **extra):
    return stream_infer(
        server.grpc_url,
        {"text_input": prompt, "apply_chat_template": True, "stream": True, "max_tokens": max_tokens, **extra},
    )


def test_stream_sends_several_responses_then_final(triton_server):
    resps = greedy(triton_server)
    assert not errors_of(resps)
    assert len(resps) >= 3 and resps[-1]["final"] and not any(r["final"] for r in resps[:-1])
    ids = ids_of(resps)
    assert len(ids) == total_of(resps, "num_output_tokens") <= 24
    assert last_value(resps, "finish_reason") in ("stop", "length")
    assert text_of(resps).strip()


def test_greedy_through_triton_equals_hf_generate(triton_server):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(CHECKPOINT)
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    for prompt in (PROMPT, "Write a JSON object with keys name and age."):
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(rendered, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        ref = ref[0, ids.shape[1] :].tolist()
        resps = greedy(triton_server, prompt)
        assert ids_of(resps) == ref
        assert last_value(resps, "num_input_tokens") == ids.shape[1]


def test_concurrent_streams_equal_their_solo_runs(triton_server):
    prompts = ["What is 2+2?", "Name a color.", "Say hello in French.", PROMPT, "Count to five."]
    solo = [ids_of(greedy(triton_server, p, 16)) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: greedy(triton_server, p, 16), prompts))
    assert [ids_of(r) for r in together] == solo
    assert all(r[-1]["final"] and not errors_of(r) for r in together)


def test_non_streaming_returns_one_full_response(triton_server):
    streamed = greedy(triton_server, max_tokens=12)
    single = stream_infer(triton_server.grpc_url, {"text_input": PROMPT, "apply_chat_template": True, "max_tokens": 12})
    assert len(single) == 1 and single[0]["final"]
    assert ids_of(single) == ids_of(streamed)
    assert text_of(single) == PROMPT + text_of(streamed)  # input included unless excluded


def test_bad_request_next_to_a_good_one(triton_server):
    solo = ids_of(greedy(triton_server, max_tokens=12))
    bad_inputs = [
        {"max_tokens": 0},
        {"sampling_parameters": "{oops"},
        {"temperature": -2.0},
        {"num_draft_tokens": 1000},
        {"text_input": ""},
        {"min_tokens": -1},
    ]
    with ThreadPoolExecutor(len(bad_inputs) + 1) as pool:
        good = pool.submit(greedy, triton_server, PROMPT, 12)
        bads = [pool.submit(stream_infer, triton_server.grpc_url, {"text_input": PROMPT, **b}) for b in bad_inputs]
        bad_results = [f.result() for f in bads]
        assert ids_of(good.result()) == solo
    for b, r in zip(bad_inputs, bad_results, strict=True):
        assert len(r) == 1 and r[0]["error"], (b, r)
        assert any(k in r[0]["error"] for k in b), (b, r[0]["error"])  # the message names the field


def test_min_tokens_as_genai_perf_sends_it(triton_server):
    """genai-perf's --output-tokens-mean-deterministic: sampling_parameters {"max_tokens": n, "min_tokens": n} with
    numbers as strings gives exactly n tokens, none of them EOS, where the model alone stops sooner."""
    prompt, n = "What is 2+2?", 20
    free = greedy(triton_server, prompt, max_tokens=n)
    free_ids = ids_of(free)
    assert last_value(free, "finish_reason") == "stop" and len(free_ids) < n
    held = stream_infer(
        triton_server.grpc_url,
        {
            "text_input": prompt,
            "apply_chat_template": True,
            "stream": True,
            "sampling_parameters": json.dumps({"max_tokens": str(n), "min_tokens": str(n)}),
        },
    )
    ids = ids_of(held)
    assert not errors_of(held) and len(ids) == total_of(held, "num_output_tokens") == n
    assert last_value(held, "finish_reason") == "length" and free_ids[-1] not in ids  # free_ids[-1] is EOS
    assert ids[: len(free_ids) - 1] == free_ids[:-1]  # the same greedy output up to the banned EOS


def test_cancelled_streams_free_their_slots(triton_server):
    """Cancel more long streams than there are slots; a new request must then run to completion."""
    import tritonclient.grpc as grpcclient

    clients, started = [], queue.Queue()
    for i in range(9):  # max_slots is 8
        c = grpcclient.InferenceServerClient(triton_server.grpc_url)
        c.start_stream(callback=lambda result, error, i=i: started.put(i))
        c.async_stream_infer(
            "llm",
            build_inputs(
                {"text_input": f"Tell a long story {i}.", "stream": True, "max_tokens": 1500, "ignore_eos": True}
            ),
        )
        clients.append(c)
    seen, deadline = set(), time.time() + 120
    while len(seen) < 8 and time.time() < deadline:
        seen.add(started.get(timeout=120))
    assert len(seen) >= 8, "the running streams never produced tokens"
    for c in clients:
        c.stop_stream(cancel_requests=True)
        c.close()
    resps = stream_infer(
        triton_server.grpc_url, {"text_input": "Hi", "max_tokens": 4, "ignore_eos": True}, timeout=60
    )  # the cancelled streams' slots are free: it is served, not left waiting
    assert not errors_of(resps) and len(ids_of(resps)) == 4


def test_http_generate_stream(triton_server):
    body = {
        "text_input": PROMPT,
        "apply_chat_template": True,
        "max_tokens": 10,
        "stream": True,
        "return_finish_reason": True,
    }
    with requests.post(
        f"{triton_server.http_url}/v2/models/llm/generate_stream", json=body, stream=True, timeout=120
    ) as r:
        assert r.status_code == 200
        events = [json.loads(line[len(b"data: ") :]) for line in r.iter_lines() if line.startswith(b"data: ")]
    assert len(events) >= 2
    assert events[-1]["finish_reason"] in ("stop", "length") and events[0]["finish_reason"] == "None"
    assert "".join(e["text_output"] for e in events) == text_of(greedy(triton_server, max_tokens=10))
    bad = requests.post(
        f"{triton_server.http_url}/v2/models/llm/generate_stream", json={"text_input": "x", "top_p": 3.0}, timeout=60
    )
    assert "top_p" in bad.text


VLLM_OUTPUTS = ("finish_reason", "num_input_tokens", "num_output_tokens", "logprobs", "cumulative_logprob")


@pytest.mark.parametrize("stream", [True, False])
def test_vllm_backend_outputs_are_sent_when_asked_as_it_sends_them(triton_server, stream):
    """vllm_backend's additional outputs: absent unless their return_* switch is true; then finish_reason "None"
    until the final one, per-response counts that add up, per-token logprobs whose rank-1 tokens spell the text,
    a cumulative logprob that moves with every response."""
    base = {
        "text_input": "In this example,",
        "stream": stream,
        "max_tokens": 20,
        "ignore_eos": True,
        "exclude_input_in_output": True,
        "sampling_parameters": json.dumps({"temperature": "0", "logprobs": 2}),
    }
    off = {f"return_{name}": None for name in VLLM_OUTPUTS} | {"return_finish_reason": False}
    plain = stream_infer(triton_server.grpc_url, {**base, **off}, timeout=60)
    assert not errors_of(plain) and len(ids_of(plain)) == 20
    assert not any(name in r["outputs"] for r in plain for name in VLLM_OUTPUTS)
    resps = [
        r
        for r in stream_infer(
            triton_server.grpc_url, {**base, **{f"return_{n}": True for n in VLLM_OUTPUTS}}, timeout=60
        )
        if r["outputs"]
    ]
    assert not errors_of(resps) and ids_of(resps) == ids_of(plain) and (len(resps) > 1) == stream
    reasons = [r["outputs"]["finish_reason"][0].decode() for r in resps]
    assert reasons[:-1] == ["None"] * (len(resps) - 1) and reasons[-1] == "length"
    assert total_of(resps, "num_output_tokens") == 20
    assert {r["outputs"]["num_input_tokens"].dtype.name for r in resps} == {"uint32"}
    cumulative = []
    for r in resps:
        tokens = json.loads(r["outputs"]["logprobs"][0])
        assert len(tokens) == int(r["outputs"]["num_output_tokens"][0]) == len(r["outputs"]["output_ids"])
        for token_id, row in zip(r["outputs"]["output_ids"].tolist(), tokens, strict=True):
            assert list(row)[0] == str(token_id) and len(row) <= 3  # the chosen token first, then the top 2
            assert row[str(token_id)]["rank"] == 1 and all(e["logprob"] <= 0 for e in row.values())
        spelled = "".join(row[next(iter(row))]["decoded_token"] for row in tokens)
        assert spelled == r["outputs"]["text_output"][0].decode()
        cumulative.append(float(r["outputs"]["cumulative_logprob"][0]))
    assert all(b < a for a, b in zip(cumulative, cumulative[1:], strict=False)) and cumulative[-1] < 0
    unasked = stream_infer(
        triton_server.grpc_url, {**base, "sampling_parameters": None, "return_logprobs": True}, timeout=60
    )
    assert all(r["outputs"]["logprobs"][0] == b"null" for r in unasked if r["outputs"])


def test_the_served_forward_is_the_one_configured(triton_server):
    """The model serves the forward its settings ask for: the native CPU kernels by default here, the PyTorch
    forward (the code CUDA runs) when the session serves linear=torch (scripts/test.sh's second leg)."""
    from conftest import engine_settings

    wanted = "torch" if engine_settings().get("linear") == "torch" else "native"
    text = requests.get(triton_server.metrics_url, timeout=30).text
    assert metric_total(text, "specgram_forward", kind=wanted) == 1, [
        line for line in text.splitlines() if line.startswith("specgram_forward")
    ]
