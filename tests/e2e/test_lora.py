"""LoRA adapters served through tritonserver: a tiny random checkpoint with two random PEFT adapters listed in a
multi_lora.json; a request's `lora_name` (an input, or a key of sampling_parameters as vllm_backend's clients send
it) gets PEFT's greedy continuation at every draft length, requests of both adapters and the base sent together
get what each gets alone, and an unknown name is that request's error."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from collect import errors_of, ids_of, stream_infer
from openai_frontend_requests import completion_lora, send
from triton_server import TritonServer, metric_total, model_parameters, model_repository_with

from tests.unit.tiny import build_tokenizer, save_family_with_loras

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
N = 16


def _greedy(model, ids: list[int]) -> list[int]:
    import torch

    ids = list(ids)
    with torch.inference_mode():
        for _ in range(N):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-N:]


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    """(tritonserver, {adapter name or None: transformers / PEFT greedy ids of PROMPT})."""
    root = tmp_path_factory.mktemp("lora-e2e")
    loras = {"all-linear": dict(r=8, seed=1), "attention": dict(r=4, seed=2, modules=["q_proj", "k_proj", "v_proj"])}
    path, model, pefts, listing = save_family_with_loras(root, "llama", 3, loras)
    settings = {"checkpoint": str(path), "enable_lora": "1", "lora_adapters": str(listing)}
    server = TritonServer(
        model_repository=model_repository_with(settings, root / "repo"),
        model="llm",
        log_path=root / "tritonserver.log",
    )
    ids = build_tokenizer()(PROMPT)["input_ids"]
    expected = {None: _greedy(model, ids), **{name: _greedy(p, ids) for name, p in pefts.items()}}
    server.start()
    try:
        yield server, expected
    finally:
        server.stop()


def complete(server, lora_name=None, in_sampling_parameters=False, **extra):
    inputs = {"text_input": PROMPT, "stream": True, "max_tokens": N, "ignore_eos": True, **extra}
    if lora_name is not None and in_sampling_parameters:
        inputs["sampling_parameters"] = json.dumps({"lora_name": lora_name})
    elif lora_name is not None:
        inputs["lora_name"] = lora_name
    return stream_infer(server.grpc_url, inputs)


def test_each_adapter_serves_pefts_greedy_ids_at_every_draft_length(lora_server):
    server, expected = lora_server
    assert len({tuple(v) for v in expected.values()}) == 3  # the adapters change the output
    for name, want in expected.items():
        for k in (0, 4, -1):
            resps = complete(server, name, num_draft_tokens=k)
            assert not errors_of(resps), (name, k, errors_of(resps))
            assert ids_of(resps) == want, (name, k)
    resps = complete(server, "attention", in_sampling_parameters=True)
    assert ids_of(resps) == expected["attention"]


def test_adapters_and_the_base_together_get_what_each_gets_alone(lora_server):
    server, expected = lora_server
    names = [None, "all-linear", "attention", "all-linear", None, "attention"]
    with ThreadPoolExecutor(len(names)) as pool:
        got = list(pool.map(lambda n: complete(server, n, num_draft_tokens=-1), names))
    assert [ids_of(r) for r in got] == [expected[n] for n in names]


def test_an_unknown_adapter_is_that_requests_error(lora_server):
    server, expected = lora_server
    with ThreadPoolExecutor(2) as pool:
        bad, good = pool.map(lambda n: complete(server, n), ["nope", "attention"])
    assert errors_of(bad) == ["LoRA nope is not supported, we currently support ['all-linear', 'attention']"]
    assert not errors_of(good) and ids_of(good) == expected["attention"]


def test_the_openai_frontends_lora_requests_are_served(lora_server):
    """The vLLM-format request Triton's OpenAI frontend builds for model "llm_lora_<adapter>" (--lora-separator
    _lora_): PEFT's greedy continuation, as through our own inputs."""
    server, expected = lora_server
    for name in ("all-linear", "attention"):
        req = completion_lora(name, PROMPT)
        assert req.sampling_parameters["lora_name"] == name and req.body["model"] == f"llm_lora_{name}"
        resps = send(server, req)
        assert not errors_of(resps) and ids_of(resps) == expected[name], name


def test_each_adapter_has_its_counters_and_is_listed(lora_server):
    """specgram_lora_requests_total / specgram_lora_generated_tokens_total by adapter ("none": the base), and a
    specgram_lora_adapter series for each adapter served."""
    server, expected = lora_server

    def scrape() -> str:
        return requests.get(server.metrics_url, timeout=30).text

    before = scrape()
    complete(server, "attention")
    complete(server)
    after = scrape()
    for adapter, name in (("attention", "attention"), ("none", None)):
        got = {
            m: metric_total(after, m, adapter=adapter) - metric_total(before, m, adapter=adapter)
            for m in ("specgram_lora_requests_total", "specgram_lora_generated_tokens_total")
        }
        assert got == {"specgram_lora_requests_total": 1, "specgram_lora_generated_tokens_total": N}, (name, got)
    assert {a: metric_total(after, "specgram_lora_adapter", adapter=a) for a in ("all-linear", "attention")} == {
        "all-linear": 1,
        "attention": 1,
    }


def lora_info(text: str) -> dict[str, str] | None:
    """The labels of the LoRA info series an endpoint picker reads: of those naming an adapter, the one with the
    largest value (the time its labels became current)."""
    best, labels = None, None
    for m in re.finditer(r"^specgram_lora_requests_info\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if (have["running_lora_adapters"] or have["waiting_lora_adapters"]) and (best is None or float(m[2]) > best):
            best, labels = float(m[2]), have
    return labels


def lora_info_series(text: str) -> int:
    return len(re.findall(r"^specgram_lora_requests_info\{", text, re.MULTILINE))


def test_the_lora_info_metric_names_the_running_and_waiting_adapters(lora_server):
    """Every slot held by requests of one adapter and a request of the other waiting: the picker's series names
    them as running and waiting, with max_lora the two adapters loaded. Through every change of those labels
    the port holds the current label set's series alone (beside it, for the moment of a change, the one it
    replaces), and one once the requests have ended."""
    import tritonclient.grpc as grpcclient
    from stream_client import build_inputs

    server, _ = lora_server
    slots = int(model_parameters(server.model_repository)["max_slots"])
    # no drafts: the suffix store holds this prompt's earlier answers, and drafting from them would end the
    # requests long before the scrape sees them all
    long = {"text_input": PROMPT, "stream": True, "max_tokens": 900, "ignore_eos": True, "num_draft_tokens": 0}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    want = {"max_lora": "2", "running_lora_adapters": "all-linear", "waiting_lora_adapters": "attention"}
    got = None
    finished = metric_total(requests.get(server.metrics_url, timeout=30).text, "specgram_lora_requests_total")
    try:
        for name in ["all-linear"] * slots + ["attention"]:
            client.async_stream_infer("llm", build_inputs({**long, "lora_name": name}))
        for _ in range(200):  # the gauges follow the load within 50 ms
            text = requests.get(server.metrics_url, timeout=30).text
            assert lora_info_series(text) <= 2, text
            labels = lora_info(text)
            got = labels and {k: labels[k] for k in want}
            if got == want:
                break
            time.sleep(0.1)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert got == want
    for _ in range(300):  # every request ended (cancelled): none is left to count in a later test's window
        text = requests.get(server.metrics_url, timeout=30).text
        assert lora_info_series(text) <= 2, text
        if metric_total(text, "specgram_lora_requests_total") == finished + slots + 1:
            break
        time.sleep(0.1)
    assert metric_total(text, "specgram_lora_requests_total") == finished + slots + 1
    time.sleep(0.2)  # the gauges follow the last end within 50 ms
    text = requests.get(server.metrics_url, timeout=30).text
    assert lora_info_series(text) == 1, text
