"""A fuzz of the whole client contract through the real tritonserver: hundreds of random requests, valid, odd and
hostile (values of every type and magnitude, wrong kinds, guides that cannot compile or leave no token, token
lists, penalties, drafters), sent a few at a time while a greedy reference stream runs again and again.

Every request ends with exactly one final response; none fails with an internal error (the server's own count
of internal errors does not move); every run of the reference stream is token-identical to its run alone.
SPECGRAM_FUZZ_SEED picks the requests (default: a fixed seed; any seed must pass), SPECGRAM_FUZZ_N how many.
"""

from __future__ import annotations

import json
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from collect import StreamTimeout, errors_of, ids_of, stream_infer
from triton_server import REPO, metric_total

SEED = int(os.environ.get("SPECGRAM_FUZZ_SEED", "20261203"))
N = int(os.environ.get("SPECGRAM_FUZZ_N", "240"))
WORKERS = 6
REFERENCE = {
    "text_input": "Describe the water cycle in detail.",
    "apply_chat_template": True,
    "stream": True,
    "max_tokens": 96,
    "ignore_eos": True,
    "temperature": 0.0,
}
BIG = 10**20


def _digits() -> list[int]:
    """The served tokenizer's single-digit tokens (for guides whose allowed_token_ids leave them nothing)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REPO / "models" / "SmolLM2-135M-Instruct")
    return [tok.convert_tokens_to_ids(d) for d in "0123456789"]


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["name", "n"],
}
GUIDES = [
    ("json_schema", json.dumps(SCHEMA)),
    ("json_schema", '{"type": [{}]}'),
    ("json_schema", '{"type": "string", "format": ["date"]}'),
    ("json_schema", "{not json"),
    ("json_schema", '{"type": "integer", "minimum": ' + "9" * 5000 + "}"),
    ("json", ""),
    ("regex", "[0-9]{3}x"),
    ("regex", "(yes|no)"),
    ("regex", "("),
    ("choice", '["red", "green"]'),
    ("choice", "[]"),
    ("ebnf", 'root ::= "a" | "b"'),
    ("ebnf", "root ::= bar"),
    ("structural_tag", "junk"),
    ("yaml", "a: b"),
]
# each option's values: (valid, hostile), the hostile of every JSON type and magnitude
VALUES = {
    "max_tokens": ([1, 3, 6, "4", 10**12], [0, -1, BIG, 1.5, True, [2]]),
    "min_tokens": ([0, 2, 5], [50, -3, BIG]),
    "temperature": ([0, 0.7, 1.3, 1e-300, 5e-324], [-1, "hot", 10**400, float("nan"), float("inf")]),
    "top_p": ([1, 0.9, 0.01], [0, 2, "x"]),
    "top_k": ([0, -1, 5, 50000, 2**31 - 1], [BIG, -7, "3.5", 2**31]),
    "seed": ([1, 7, -5, 2**64 - 1], [2**64, "abc", 1.5]),
    "stop": ([["."], ["\n", "the"], "a"], [[""], ["x" * 2000], [1, 2], [f"s{i}" for i in range(20)]]),
    "ignore_eos": ([True, False], ["maybe", 2]),
    "num_draft_tokens": ([0, 1, 3, 8, -1, "auto"], [9, -2, BIG]),
    "drafter": (["ngram", "draft_model", "grammar"], ["magic", 5]),
    "presence_penalty": ([0.5, -1.5], [5, float("nan")]),
    "frequency_penalty": ([0.3], [3]),
    "repetition_penalty": ([1.2, 0.8], [0, 100]),
    "logit_bias": ([{"5": 10}, {"13": -100}], [{"5": 1000}, {str(BIG): 1}, "junk"]),
    "stop_token_ids": ([[13], [2, 0]], [[BIG], ["x"], [-1]]),
    "bad_words": ([["the"], ["a", "e"], "the"], [[""], ["x" * 2000]]),
    "allowed_token_ids": ([[1, 2, 3], "DIGITS"], [[], [BIG], [-1]]),
    "logprobs": ([0, 3, True, False], [21, "many"]),
    "n": ([1], [2]),
    "best_of": ([1], [3]),
    "min_p": ([0], [0.1]),
}
PROMPTS = (["Hi", "Write a haiku about rain.", "¿Qué tal? 你好 🚀", '{"a": ', "\x00\x01"], ["", "word " * 3000])
HOSTILE = 0.15  # the share of values (and prompts) drawn from the hostile side


def _draw(rng: random.Random, pools: tuple[list, list]):
    return rng.choice(pools[1] if rng.random() < HOSTILE else pools[0])


def make_request(rng: random.Random, digits: list[int]) -> tuple[dict, dict | None]:
    """One random request -> (inputs, gRPC request parameters or None)."""
    options = {}
    for name in rng.sample(sorted(VALUES), rng.randint(1, 6)):
        value = _draw(rng, VALUES[name])
        options[name] = digits if value == "DIGITS" else value
    if rng.random() < 0.4:
        kind, text = rng.choice(GUIDES)
        if rng.random() < 0.3 and kind == "json_schema":
            options["structured_outputs"] = {"json": text, "disable_any_whitespace": rng.choice([True, False, "y"])}
        else:
            options["guided_decoding_guide_type"], options["guided_decoding_guide"] = kind, text
    options.setdefault("max_tokens", rng.choice([2, 4, 8]))
    inputs = {"text_input": _draw(rng, PROMPTS), "stream": rng.random() < 0.8}
    if rng.random() < 0.3:
        inputs["apply_chat_template"] = True
    where = rng.random()
    if where < 0.7:  # all in sampling_parameters, as vLLM clients send them
        inputs["sampling_parameters"] = json.dumps(options)
        return inputs, None
    if where < 0.85:  # as request parameters (HTTP generate's spare keys)
        return inputs, {k: _parameter(v) for k, v in options.items() if k not in ("n", "best_of", "min_p")}
    inputs["sampling_parameters"] = json.dumps(options)  # ... or beside a type-correct input that disagrees
    inputs["max_tokens"] = rng.choice([1, 5])
    return inputs, None


def _parameter(value):
    """A gRPC request parameter carries a bool, an int64, a double or a string: anything else goes as JSON text."""
    if isinstance(value, (bool, float, str)) or (isinstance(value, int) and -(2**63) <= value < 2**63):
        return value
    return json.dumps(value)


def internal_errors(server) -> float:
    return metric_total(
        requests.get(server.metrics_url, timeout=30).text, "specgram_request_errors_total", kind="internal"
    )


@pytest.fixture(scope="module")
def reference(triton_server) -> list[int]:
    responses = stream_infer(triton_server.grpc_url, REFERENCE)
    assert not errors_of(responses) and len(ids_of(responses)) == REFERENCE["max_tokens"]
    return ids_of(responses)


def test_a_fuzz_of_the_contract_leaves_no_internal_error_and_the_reference_stream_identical(triton_server, reference):
    rng = random.Random(SEED)
    digits = _digits()
    cases = [make_request(rng, digits) for _ in range(N)]
    before = internal_errors(triton_server)
    done = threading.Event()
    reference_runs: list[list[int]] = []

    def references():
        while not done.is_set():
            reference_runs.append(ids_of(stream_infer(triton_server.grpc_url, REFERENCE)))

    def send(case):
        inputs, parameters = case
        try:
            return stream_infer(triton_server.grpc_url, inputs, parameters=parameters, timeout=240)
        except StreamTimeout as e:
            return e.responses + [{"error": "no final response (StreamTimeout)", "final": False, "outputs": {}}]

    with ThreadPoolExecutor(1) as ref_pool, ThreadPoolExecutor(WORKERS) as pool:
        running = ref_pool.submit(references)
        try:
            answers = list(pool.map(send, cases))
        finally:
            done.set()
        running.result()

    problems = []
    for (inputs, parameters), responses in zip(cases, answers, strict=True):
        finals = [r for r in responses if r["final"]]
        errors = errors_of(responses)
        if len(finals) != 1 or not responses[-1]["final"]:
            problems.append(("not exactly one final response", inputs, parameters, responses[-2:]))
        elif any("internal" in e.lower() or "Failed to process" in e for e in errors):
            problems.append(("internal error", inputs, parameters, errors))
    outcome = {"errors": sum(bool(errors_of(a)) for a in answers), "ok": sum(not errors_of(a) for a in answers)}
    print(f"fuzz seed {SEED}: {N} requests, {outcome}, reference runs {len(reference_runs)}")
    assert not problems, problems[:5]
    assert outcome["ok"] >= N // 10 and outcome["errors"] >= N // 10, outcome  # the fuzz reaches both sides
    assert reference_runs and all(run == reference for run in reference_runs)
    assert internal_errors(triton_server) == before
    after = stream_infer(triton_server.grpc_url, REFERENCE)
    assert ids_of(after) == reference


@pytest.mark.parametrize("drafter,k", [("draft_model", 3), ("ngram", 3), ("ngram", 0)])
def test_a_guide_left_without_tokens_ends_that_request_alone(triton_server, reference, drafter, k):
    """Regex [0-9]{3}x with only the digit tokens allowed: three digits, then nothing may follow. The request gets
    its digits and one error saying why; the reference stream beside it is as alone."""
    digits = _digits()
    bad = {
        "text_input": "Give me a code.",
        "stream": True,
        "sampling_parameters": json.dumps(
            {
                "allowed_token_ids": digits,
                "max_tokens": 16,
                "drafter": drafter,
                "num_draft_tokens": k,
                "structured_outputs": {"regex": "[0-9]{3}x"},
            }
        ),
    }
    with ThreadPoolExecutor(4) as pool:
        good = pool.submit(stream_infer, triton_server.grpc_url, REFERENCE)
        answers = list(pool.map(lambda _: stream_infer(triton_server.grpc_url, bad), range(3)))
        assert ids_of(good.result()) == reference
    for responses in answers:
        assert responses[-1]["final"] and errors_of(responses) == [responses[-1]["error"]]
        assert "no token is allowed" in responses[-1]["error"]
        assert set(ids_of(responses)) <= set(digits) and len(ids_of(responses)) <= 3
