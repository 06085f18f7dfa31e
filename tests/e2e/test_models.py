"""Model families served, each through its own tritonserver on the native CPU forward: a second real model, Gemma
3 270M (gemma3_text: local and global layers, q/k norms, a 262,144-token vocabulary): greedy output equals
transformers' generate on the same checkpoint at every draft length, and a guided JSON answer validates (set-up
builds the checkpoint: scripts/test.sh sets SPECGRAM_MODEL=gemma3-270m); and a tiny random checkpoint of every
listed family: greedy ids and raw logprobs equal transformers'."""

from __future__ import annotations

import json

import jsonschema
import pytest
from collect import errors_of, ids_of, last_value, stream_infer, text_of
from triton_server import REPO, TritonServer, model_repository_with

from tests.unit.tiny import FAMILY_CONFIGS, build_family, build_tokenizer, save_family, transformers_logits

GEMMA = REPO / "models" / "gemma-3-270m"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
N = 16


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory):
    if not (GEMMA / "model.safetensors").exists():
        pytest.fail(f"{GEMMA} is missing: build it with SPECGRAM_MODEL=gemma3-270m bash scripts/setup.sh")
    repo = model_repository_with({"checkpoint": str(GEMMA)}, tmp_path_factory.mktemp("gemma") / "repo")
    server = TritonServer(
        model_repository=repo,
        model="llm",
        startup_timeout=600,
        log_path=tmp_path_factory.mktemp("triton-gemma") / "tritonserver.log",
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hf_greedy():
    """transformers' own greedy continuation of each prompt (float32, the same checkpoint folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(GEMMA)
    model = AutoModelForCausalLM.from_pretrained(GEMMA, dtype=torch.float32)
    out = {}
    with torch.inference_mode():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            out[p] = model.generate(ids, max_new_tokens=N, do_sample=False)[0, ids.shape[1] :].tolist()
    return out


def complete(server, prompt, **extra):
    return stream_infer(server.grpc_url, {"text_input": prompt, "stream": True, "max_tokens": N, **extra})


def test_greedy_output_is_transformers_generate_at_every_draft_length(gemma_server, hf_greedy):
    for prompt in PROMPTS:
        for k in (0, 4, -1):
            resps = complete(gemma_server, prompt, num_draft_tokens=k)
            assert not errors_of(resps), errors_of(resps)
            assert ids_of(resps) == hf_greedy[prompt], (prompt, k)
    drafted = complete(gemma_server, PROMPTS[1], num_draft_tokens=4, drafter="draft_model")
    assert ids_of(drafted) == hf_greedy[PROMPTS[1]] and last_value(drafted, "spec_drafted_tokens") > 0


def test_a_guided_json_answer_validates(gemma_server):
    schema = {
        "type": "object",
        "properties": {"animal": {"type": "string", "maxLength": 20}, "legs": {"type": "integer"}},
        "required": ["animal", "legs"],
        "additionalProperties": False,
    }
    prompt = "A cat has four legs. As JSON with the animal and its number of legs:"
    plain, spec = (
        complete(
            gemma_server,
            prompt,
            max_tokens=48,
            num_draft_tokens=k,
            guided_decoding_guide_type="json_schema",
            guided_decoding_guide=json.dumps(schema),
        )
        for k in (0, -1)
    )
    assert not errors_of(plain) and not errors_of(spec)
    assert last_value(plain, "finish_reason") == "stop", text_of(plain)
    jsonschema.validate(json.loads(text_of(plain)), schema)
    assert ids_of(spec) == ids_of(plain)


# ---- every family, served: tiny random checkpoints of each family's distinguishing config -----------------------

FAMILY_PROMPT = "The quick brown fox jumps over the lazy dog, and then"
SERVED_MAX_SEQ_LEN = 2048  # past phi4_mini's and phi4_long's original contexts: longrope's long factor


@pytest.fixture(scope="module", params=sorted(FAMILY_CONFIGS))
def family_server(request, tmp_path_factory):
    """(family name, its tiny checkpoint's transformers model, a tritonserver serving that checkpoint)."""
    name = request.param
    path = save_family(tmp_path_factory.mktemp(name) / "ckpt", name, seed=3)
    settings = {"checkpoint": str(path), "max_seq_len": str(SERVED_MAX_SEQ_LEN)}
    repo = model_repository_with(settings, tmp_path_factory.mktemp(f"{name}-repo") / "repo")
    server = TritonServer(model_repository=repo, model="llm", log_path=path.parent / "tritonserver.log")
    server.start()
    try:
        yield name, build_family(name, seed=3), server
    finally:
        server.stop()


def test_each_family_serves_transformers_greedy_ids_and_raw_logprobs(family_server):
    """Greedy ids equal transformers' own greedy continuation and each token's raw logprob equals its
    log-softmax there, at num_draft_tokens 0, 4 and auto."""
    import torch

    name, model, server = family_server
    tok = build_tokenizer()
    ids = tok(FAMILY_PROMPT)["input_ids"]
    for _ in range(N):  # as a server of SERVED_MAX_SEQ_LEN computes it (longrope: the long factor throughout)
        ids.append(int(transformers_logits(model, ids, SERVED_MAX_SEQ_LEN)[-1].argmax()))
    want = torch.log_softmax(transformers_logits(model, ids, SERVED_MAX_SEQ_LEN), -1)  # [len, V]
    n_prompt = len(ids) - N
    for k in (0, 4, -1):
        resps = complete(
            server,
            FAMILY_PROMPT,
            num_draft_tokens=k,
            ignore_eos=True,
            return_logprobs=True,
            sampling_parameters=json.dumps({"logprobs": 0}),
        )
        assert not errors_of(resps), (name, k, errors_of(resps))
        assert ids_of(resps) == ids[n_prompt:], (name, k)
        rows = [row for r in resps if r["outputs"] for row in json.loads(r["outputs"]["logprobs"][0])]
        for i, (t, row) in enumerate(zip(ids[n_prompt:], rows, strict=True)):
            got = row[str(t)]["logprob"]
            assert abs(got - want[n_prompt + i - 1, t].item()) < 1e-4, (name, k, i)


# ---- a GGUF file served as it comes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_server(tmp_path_factory):
    """(the path of a tiny qwen2 GGUF file in Q4_K, a tritonserver whose checkpoint is that file)."""
    from tests.unit.tiny_gguf import save_gguf

    path = save_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q4_k.gguf", seed=1, types={"output": "Q4_K"})
    repo = model_repository_with({"checkpoint": str(path)}, tmp_path_factory.mktemp("gguf-repo") / "repo")
    server = TritonServer(model_repository=repo, model="llm", log_path=path.parent / "tritonserver.log")
    server.start()
    try:
        yield path, server
    finally:
        server.stop()


def test_a_gguf_file_serves_transformers_greedy_ids_at_every_draft_length(gguf_server):
    """Its Q4_K blocks served as they are (int4): greedy ids equal transformers' greedy continuation of its own
    reading of the file, at num_draft_tokens 0, 4 and auto; the tokenizer and chat template from the metadata."""
    from tests.unit.tiny_gguf import transformers_model

    path, server = gguf_server
    model, tok = transformers_model(path), build_tokenizer()
    ids = tok(FAMILY_PROMPT)["input_ids"]
    for _ in range(N):
        ids.append(int(transformers_logits(model, ids, 1024)[-1].argmax()))
    for k in (0, 4, -1):
        resps = complete(server, FAMILY_PROMPT, num_draft_tokens=k, ignore_eos=True)
        assert not errors_of(resps), (k, errors_of(resps))
        assert ids_of(resps) == ids[len(ids) - N :], k
    chat = complete(server, "hi", apply_chat_template=True, max_tokens=4, return_num_input_tokens=True)
    assert not errors_of(chat) and last_value(chat, "num_input_tokens") > 20  # "<s>user: hi\n<s>assistant: "
