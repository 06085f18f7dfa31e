"""model.py driven in-process with a fake triton_python_backend_utils: the adapter's rules, without a server."""

import gc
import json
import re
import sys
import time

import numpy as np
import pytest

from specgram.serving import contract

from . import fake_pb_utils as pb
from .helpers import MODEL_DIR, config_parameters, initialize_args, load_model_py


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    module = load_model_py()
    params = config_parameters()
    params["checkpoint"] = {"string_value": str(tiny_ckpt)}
    params["max_slots"] = {"string_value": "2"}
    params["ngram_min"] = {"string_value": "1"}  # random tiny models rarely repeat 2-grams
    m = module.TritonPythonModel()
    m.initialize(initialize_args(params))
    yield m
    m.finalize()
    del sys.modules["triton_python_backend_utils"]


# what the clients of these tests ask for (vllm_backend's switches; a switch given as None is not sent)
ASK = {"return_finish_reason": True, "return_num_input_tokens": True, "return_num_output_tokens": True}


def request(text="Hello there", **inputs):
    tensors = {"text_input": np.array([text.encode()], dtype=np.object_)}
    kinds = {
        "stream": np.bool_,
        "max_tokens": np.int32,
        "temperature": np.float32,
        "top_p": np.float32,
        "top_k": np.int32,
        "seed": np.uint64,
        "num_draft_tokens": np.int32,
        "ignore_eos": np.bool_,
        "exclude_input_in_output": np.bool_,
        "apply_chat_template": np.bool_,
        **{name: np.bool_ for name in contract.INPUT if name.startswith("return_")},
    }
    params = inputs.pop("parameters", None)
    for k, v in {**ASK, **inputs}.items():
        if v is None:
            continue
        if k == "stop":
            tensors[k] = np.array([s.encode() for s in v], dtype=np.object_)
        elif k in kinds:
            tensors[k] = np.array([v], dtype=kinds[k])
        else:
            tensors[k] = np.array([v.encode()], dtype=np.object_)
    return pb.InferenceRequest(tensors, params)


def finish(model, *reqs, timeout=60):
    assert model.execute(list(reqs)) is None, "decoupled execute returns nothing"
    for r in reqs:
        assert r.sender.done.wait(timeout), "request never got its FINAL response"
    for r in reqs:
        finals = [f for _, f in r.sender.responses if f & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
        assert len(finals) == 1 and r.sender.responses[-1][1] == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    return [[resp for resp, _ in r.sender.responses] for r in reqs]


def joined(responses, name="text_output"):
    if name == "text_output":
        return "".join(r.output_tensors[name][0].decode() for r in responses if r is not None)
    return [int(x) for r in responses if r is not None for x in r.output_tensors[name]]


def test_streaming_sends_deltas_then_final(model):
    [resps] = finish(model, request(stream=True, max_tokens=12, ignore_eos=True, num_draft_tokens=0))
    assert len(resps) == 12 and all(r.error is None for r in resps)
    assert len(joined(resps, "output_ids")) == 12
    last = resps[-1].output_tensors
    assert last["finish_reason"][0] == b"length"
    assert [r.output_tensors["num_output_tokens"][0] for r in resps] == [1] * 12
    assert resps[0].output_tensors["finish_reason"][0] == b"None", "vllm_backend's word for not finished yet"
    assert last["spec_drafted_tokens"][0] == 0 and last["spec_acceptance_rate"][0] == 0.0


def test_non_streaming_equals_stream_and_includes_prompt(model):
    [streamed] = finish(model, request(stream=True, max_tokens=10, ignore_eos=True))
    [[full]] = finish(model, request(max_tokens=10, ignore_eos=True))
    assert full.output_tensors["text_output"][0].decode() == "Hello there" + joined(streamed)
    assert list(full.output_tensors["output_ids"]) == joined(streamed, "output_ids")
    [[excl]] = finish(model, request(max_tokens=10, ignore_eos=True, exclude_input_in_output=True))
    assert excl.output_tensors["text_output"][0].decode() == joined(streamed)


def test_sampling_parameters_json_and_request_parameters(model):
    [[a]] = finish(model, request(sampling_parameters=json.dumps({"max_tokens": 5, "ignore_eos": True})))
    assert a.output_tensors["num_output_tokens"][0] == 5
    [[b]] = finish(model, request(max_tokens=5, sampling_parameters=json.dumps({"max_tokens": 5, "ignore_eos": True})))
    assert b.output_tensors["num_output_tokens"][0] == 5, "the same value in both places is fine"
    [[c]] = finish(model, request(parameters={"max_tokens": 4, "ignore_eos": True, "unrelated": 1}))
    assert c.output_tensors["num_output_tokens"][0] == 4


@pytest.mark.parametrize(
    "inputs, code, needle",
    [
        (dict(max_tokens=0), pb.TritonError.INVALID_ARG, "max_tokens"),
        (dict(max_tokens=3, sampling_parameters='{"max_tokens": 5}'), pb.TritonError.INVALID_ARG, "different values"),
        (dict(text=""), pb.TritonError.INVALID_ARG, "text_input"),
        (dict(sampling_parameters="{not json"), pb.TritonError.INVALID_ARG, "sampling_parameters"),
        (dict(sampling_parameters='{"bogus": 1}'), pb.TritonError.INVALID_ARG, "bogus"),
        (dict(num_draft_tokens=99), pb.TritonError.INVALID_ARG, "num_draft_tokens"),
        (dict(num_draft_tokens=2, drafter="nope"), pb.TritonError.INVALID_ARG, "drafter"),
        (dict(guided_decoding_guide_type="regex", guided_decoding_guide="a(b"), pb.TritonError.INVALID_ARG, "regex"),
        (
            dict(guided_decoding_guide_type="json_schema", guided_decoding_guide='{"type": "nonsense"}'),
            pb.TritonError.INVALID_ARG,
            "nonsense",
        ),
        (dict(guided_decoding_guide_type="xml", guided_decoding_guide="<a/>"), pb.TritonError.INVALID_ARG, "xml"),
        (
            dict(
                guided_decoding_guide_type="json_schema",
                guided_decoding_guide='{"type": "array", "items": {}, "uniqueItems": true}',
            ),
            pb.TritonError.INVALID_ARG,
            "uniqueItems",
        ),
    ],
)
def test_bad_request_gets_one_error_and_good_neighbour_is_untouched(model, inputs, code, needle):
    [[alone]] = finish(model, request(max_tokens=8))
    bad, good = request(**inputs), request(max_tokens=8)
    bad_resps, good_resps = finish(model, bad, good)
    assert len(bad_resps) == 1 and bad_resps[0].error.code() == code and needle in bad_resps[0].error.message()
    assert list(good_resps[0].output_tensors["output_ids"]) == list(alone.output_tensors["output_ids"])


def test_a_full_compile_queue_refuses_with_unavailable(model, monkeypatch):
    monkeypatch.setattr(model.engine.grammar.pool, "queue_limit", 0)  # every new guide finds it full
    [resps] = finish(model, request(max_tokens=8, guided_decoding_guide_type="regex", guided_decoding_guide="[xyz]{2}"))
    assert resps[0].error.code() == pb.TritonError.UNAVAILABLE and "grammar_compile_queue" in resps[0].error.message()


def test_cancelled_stream_gets_final_and_frees_its_slot(model):
    r = request(stream=True, max_tokens=2000, ignore_eos=True)
    model.execute([r])
    for _ in range(500):
        if len(r.sender.responses) >= 3:
            break
        time.sleep(0.01)
    r.sender.cancel()
    assert r.sender.done.wait(10)
    assert r.sender.responses[-1][0].error.code() == pb.TritonError.CANCELLED
    [[after]] = finish(model, request(max_tokens=4))
    assert after.error is None
    assert len(model.engine.scheduler.free_slots) == 2


def test_cancellation_is_polled_at_a_bounded_rate(model):
    """is_cancelled() is a round trip to the server process: each stream is asked at most every 0.25 s (one
    token a step, no drafts: 60 steps and responses each)."""
    reqs = [request(stream=True, max_tokens=60, ignore_eos=True, num_draft_tokens=0) for _ in range(2)]
    t0 = time.monotonic()
    model.execute(reqs)
    for r in reqs:
        assert r.sender.done.wait(60)
    elapsed = time.monotonic() - t0
    for r in reqs:
        assert len(r.sender.responses) >= 30
        assert r.sender.cancel_checks <= elapsed / 0.25 + 2, (r.sender.cancel_checks, elapsed)


def metric(name, **labels):
    """The exported series of `name` (those of families still alive: other tests' are released) with these labels."""
    return [m for m in pb.on_port(name) if all(m.labels.get(k) == v for k, v in labels.items())]


def test_speculative_request_reports_statistics_and_metrics(model):
    """Every position of this guide is forced (one legal token), so grammar-forced drafts are all accepted."""
    drafted_before = metric("specgram_draft_tokens_total")[0].value()
    generated_before = metric("specgram_generated_tokens_total")[0].value()
    ttft_before = len(metric("specgram_time_to_first_token_seconds")[0].observations)
    latency_before = list(metric("specgram_e2e_request_latency_seconds")[0].observations)
    tpot_before = list(metric("specgram_time_per_output_token_seconds")[0].observations)
    queue_before = list(metric("specgram_request_queue_time_seconds")[0].observations)
    steps_before = len(metric("specgram_accepted_drafts_per_step")[0].observations)
    length_before = metric("specgram_requests_total", finish_reason="length")[0].value()
    forced_before = metric("specgram_accepted_draft_tokens_by_source_total", source="forced")[0].value()
    k_steps_before = len(metric("specgram_draft_tokens_per_step")[0].observations)
    reused_before = metric("specgram_prompt_tokens_reused_total")[0].value()
    prompt_before = metric("specgram_prompt_tokens_total")[0].value()
    guide = dict(guided_decoding_guide_type="regex", guided_decoding_guide="(abc ){10}")
    [spec] = finish(
        model, request("abcabc abcabc abc", stream=True, max_tokens=24, num_draft_tokens=4, drafter="grammar", **guide)
    )
    [plain] = finish(model, request("abcabc abcabc abc", stream=True, max_tokens=24, num_draft_tokens=0, **guide))
    assert joined(spec, "output_ids") == joined(plain, "output_ids")
    last = spec[-1].output_tensors
    drafted, accepted = int(last["spec_drafted_tokens"][0]), int(last["spec_accepted_tokens"][0])
    assert drafted > 0 and accepted == drafted
    assert last["spec_acceptance_rate"][0] == pytest.approx(1.0)
    assert metric("specgram_draft_tokens_total")[0].value() - drafted_before == drafted
    assert metric("specgram_generated_tokens_total")[0].value() - generated_before == 48
    assert len(metric("specgram_time_to_first_token_seconds")[0].observations) == ttft_before + 2
    latency = metric("specgram_e2e_request_latency_seconds")[0].observations[len(latency_before) :]
    tpot = metric("specgram_time_per_output_token_seconds")[0].observations[len(tpot_before) :]
    assert len(latency) == len(tpot) == 2 and all(0 < t < x for t, x in zip(tpot, latency, strict=True))
    queue = metric("specgram_request_queue_time_seconds")[0].observations[len(queue_before) :]
    assert len(queue) == 2 and all(0 <= q < x for q, x in zip(queue, latency, strict=True))
    assert len(metric("specgram_accepted_drafts_per_step")[0].observations) > steps_before
    assert last["spec_acceptance_length"][0] > 1.0
    assert metric("specgram_requests_total", finish_reason="length")[0].value() - length_before == 2
    n_prompt = int(last["num_input_tokens"][0])
    assert int(plain[-1].output_tensors["num_cached_tokens"][0]) == (n_prompt - 1 if model.engine.prefix else 0)
    assert metric("specgram_prompt_tokens_total")[0].value() - prompt_before == 2 * n_prompt
    # the second request resends the first one's prompt: with prefix reuse on, all but its last token are reused
    # (the first may reuse as much, from an earlier test's request)
    reused = metric("specgram_prompt_tokens_reused_total")[0].value() - reused_before
    if model.engine.prefix is not None:
        assert n_prompt - 1 <= reused <= 2 * (n_prompt - 1)
    else:
        assert reused == 0
    detail = json.loads(last["spec_detail"][0])
    assert detail["sources"] == {"forced": {"drafted": drafted, "accepted": accepted}}
    assert (
        metric("specgram_accepted_draft_tokens_by_source_total", source="forced")[0].value() - forced_before == accepted
    )
    steps = sum(detail["k_hist"])  # decode steps of both requests: every step observed once
    plain_steps = sum(json.loads(plain[-1].output_tensors["spec_detail"][0])["k_hist"])
    assert len(metric("specgram_draft_tokens_per_step")[0].observations) - k_steps_before == steps + plain_steps
    assert spec[0].output_tensors["spec_detail"][0] == b"" or len(spec) == 1  # set on the final one only


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the load error on a machine without CUDA")
def test_kind_gpu_without_cuda_fails_the_load_with_a_clear_message(tiny_ckpt, model_py):
    params = config_parameters()
    params["checkpoint"] = {"string_value": str(tiny_ckpt)}
    with pytest.raises(pb.TritonModelException, match=r"'cuda:1' was asked for, but CUDA is not available"):
        model_py.TritonPythonModel().initialize(initialize_args(params, "GPU", "1"))
    params["device"] = {"string_value": "cpu"}  # KIND_GPU + device cpu: the settings disagree
    args = initialize_args(params, "GPU", "1")
    with pytest.raises(pb.TritonModelException, match="KIND_GPU places this instance on GPU 1"):
        model_py.TritonPythonModel().initialize(args)


def test_invalid_utf8_names_the_input(model):
    bad_text = pb.InferenceRequest({"text_input": np.array([b"caf\xe9"], dtype=np.object_)})
    bad_stop = request(max_tokens=4)
    bad_stop.inputs["stop"] = np.array([b"ok", b"\xc3("], dtype=np.object_)
    for req, name in ((bad_text, "text_input"), (bad_stop, "stop")):
        [[resp]] = finish(model, req)
        assert resp.error.code() == pb.TritonError.INVALID_ARG
        assert f"input {name} is not valid UTF-8" in resp.error.message()


@pytest.fixture
def model_py():
    """model.py as a module of its own, the fake triton_python_backend_utils restored to what it was after."""
    previous = sys.modules.get("triton_python_backend_utils")
    yield load_model_py("llm_model_own")
    if previous is None:
        del sys.modules["triton_python_backend_utils"]
    else:
        sys.modules["triton_python_backend_utils"] = previous


@pytest.fixture
def own_model(tiny_ckpt, request):
    """A model instance of its own (settings as keyword arguments), labelled with the test's name; finalized at
    the end unless the test did."""
    module = load_model_py()
    made = []

    def make(**settings):
        params = config_parameters()
        params["checkpoint"] = {"string_value": str(tiny_ckpt)}
        params.update({k: {"string_value": str(v)} for k, v in settings.items()})
        args = initialize_args(params)
        args["model_name"] = request.node.name
        m = module.TritonPythonModel()
        m.initialize(args)
        made.append(m)
        return m

    yield make
    for m in made:
        if m.loop._thread.is_alive():
            m.finalize()


def slow_steps(m, seconds=0.005):
    """Each engine step takes at least this long (a long request then surely outlasts a check)."""
    step = m.loop.engine.step
    m.loop.engine.step = lambda: (time.sleep(seconds), step())[1]


def started(m, **inputs):
    r = request(stream=True, max_tokens=2000, ignore_eos=True, **inputs)
    m.execute([r])
    for _ in range(WAIT_STEPS):
        if r.sender.responses:
            return r
        time.sleep(0.01)
    raise AssertionError("the stream never started")


WAIT_STEPS = 12000  # x 10 ms: 2 minutes, far above what a busy machine needs


def wait_for(condition, what):
    for _ in range(WAIT_STEPS):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_finalize_ends_every_stream_and_releases_the_metrics(own_model):
    m = own_model(max_slots=1, shutdown_grace_s=0)
    running = started(m)
    waiting = request(max_tokens=4)
    m.execute([waiting])
    m.finalize()
    for r, code in ((running, pb.TritonError.CANCELLED), (waiting, pb.TritonError.UNAVAILABLE)):
        assert r.sender.done.is_set(), "every request has its final response once finalize returns"
        last = r.sender.responses[-1][0]
        assert last.error.code() == code and "shutting down" in last.error.message()
    mine = [
        x
        for ms in pb.MetricFamily.registry.values()
        for x in ms
        if x.labels.get("model") == "test_finalize_ends_every_stream_and_releases_the_metrics"
    ]
    assert len(mine) > 10
    gc.collect()
    assert all(x._family_ref() is None for x in mine), "a metric family outlived finalize()"


def test_load_gauges_refusals_and_a_dying_engine(own_model):
    name = "test_load_gauges_refusals_and_a_dying_engine"
    m = own_model(max_slots=1, max_waiting_requests=1)
    gauge = lambda family: metric(family, model=name)[0].value()  # noqa: E731
    assert gauge("specgram_kv_slots") == 1 and m.is_ready()
    slow_steps(m)
    running = started(m)
    waiting = request(max_tokens=4)
    m.execute([waiting])
    [[refused]] = finish(m, request(max_tokens=4))
    assert refused.error.code() == pb.TritonError.UNAVAILABLE
    assert "max_waiting_requests = 1" in refused.error.message()

    def errors(kind):
        return sum(x.value() for x in metric("specgram_request_errors_total", model=name) if x.labels["kind"] == kind)

    assert (errors("unavailable"), errors("internal"), errors("invalid")) == (1, 0, 0)
    wait_for(
        lambda: (gauge("specgram_requests_running"), gauge("specgram_requests_waiting")) == (1, 1),
        "the gauges show one running and one waiting request",
    )
    assert gauge("specgram_engine_up") == 1 and gauge("specgram_kv_cache_usage") == 1.0  # its one slot is held
    assert name not in pb.unloaded

    def broken_step():
        raise RuntimeError("slot bookkeeping broke")

    m.loop.engine.step = broken_step
    for r in (running, waiting):
        assert r.sender.done.wait(60)
        last = r.sender.responses[-1][0]
        assert last.error.code() == pb.TritonError.INTERNAL and "slot bookkeeping broke" in last.error.message()
    assert not m.is_ready()
    [[refused]] = finish(m, request(max_tokens=4))
    assert refused.error.code() == pb.TritonError.UNAVAILABLE and "engine stopped" in refused.error.message()
    assert (errors("unavailable"), errors("internal"), errors("invalid")) == (2, 2, 0)
    wait_for(lambda: gauge("specgram_engine_up") == 0, "the engine_up gauge drops to 0")
    assert gauge("specgram_requests_running") == gauge("specgram_requests_waiting") == 0
    assert gauge("specgram_kv_cache_usage") == 0
    wait_for(lambda: name in pb.unloaded, "the model asks Triton to unload it")
    time.sleep(0.2)  # the sender thread goes on polling: it must not ask again
    assert pb.unloaded.count(name) == 1


# ---- one request's failure stays with it -----------------------------------------------------------------------


def test_a_failing_cancellation_poll_leaves_every_stream_served(model, monkeypatch):
    """is_cancelled() raising (a broken connection to the server process) must not stop the sender thread."""
    monkeypatch.setitem(type(model).initialize.__globals__, "_CANCEL_CHECK_S", 0.0)  # poll every round
    bad, good = request(stream=True, max_tokens=40, ignore_eos=True), request(max_tokens=8)

    def broken():
        raise RuntimeError("stub connection lost")

    bad.sender.is_cancelled = broken
    bad_resps, good_resps = finish(model, bad, good, timeout=20)
    assert bad_resps[-1].error is None and len(joined(bad_resps, "output_ids")) == 40
    assert good_resps[-1].error is None
    [[after]] = finish(model, request(max_tokens=4), timeout=20)  # and the thread still runs
    assert after.error is None


def test_a_failure_while_building_a_response_still_ends_the_stream(model, monkeypatch):
    calls = []

    def record(st, out):
        calls.append(out.finished)
        raise ValueError("metrics backend gone")

    monkeypatch.setattr(model.metrics, "record", record)
    [[only]] = finish(model, request(max_tokens=4), timeout=20)
    assert only.error is None and calls[-1], "metrics failures must not cost the response"
    monkeypatch.setattr(model, "_response", lambda *a: (_ for _ in ()).throw(ValueError("bad tensor")))
    [resps] = finish(model, request(stream=True, max_tokens=6, ignore_eos=True), timeout=20)
    assert resps[-1].error.code() == pb.TritonError.INTERNAL and "bad tensor" in resps[-1].error.message()


def test_a_chat_template_error_fails_that_request_alone(model, monkeypatch):
    import jinja2

    tokenizer = model.engine.intake.tokenizer

    def refuse(messages, **kw):
        if any(m["role"] == "tool" for m in messages):
            raise jinja2.TemplateError("Conversation roles must alternate user/assistant")
        return type(tokenizer).apply_chat_template(tokenizer, messages, **kw)

    monkeypatch.setattr(tokenizer, "apply_chat_template", refuse)
    bad = request("", messages=json.dumps([{"role": "tool", "content": "x"}]))
    good = request("", messages=json.dumps([{"role": "user", "content": "hi"}]), max_tokens=4)
    bad_resps, good_resps = finish(model, bad, good, timeout=20)
    assert bad_resps[0].error.code() == pb.TritonError.INVALID_ARG
    assert "messages" in bad_resps[0].error.message() and "alternate" in bad_resps[0].error.message()
    assert good_resps[-1].error is None


def test_any_error_while_reading_a_request_fails_it_alone(model, monkeypatch):
    make = model.engine.make_request

    def flaky(params, **kw):
        if kw.get("text") == "boom":
            raise RuntimeError("unexpected")
        return make(params, **kw)

    monkeypatch.setattr(model.engine, "make_request", flaky)
    bad_resps, good_resps = finish(model, request("boom"), request(max_tokens=4), timeout=20)
    assert bad_resps[0].error.code() == pb.TritonError.INTERNAL and "unexpected" in bad_resps[0].error.message()
    assert good_resps[-1].error is None


def test_requests_are_tokenized_with_a_tokenizer_of_their_own(model):
    """The adapter's threads encode while the engine thread decodes: never the same fast tokenizer object."""
    assert model.engine.intake.tokenizer is not model.engine.output.tokenizer
    assert model.engine.intake.tokenizer._tokenizer is not model.engine.output.tokenizer._tokenizer


def test_vllm_backends_outputs_only_when_asked(model):
    """vllm_backend's clients (Triton's OpenAI frontend) ask for each additional output, and add num_output_tokens
    up over a stream; logprobs come per response in its JSON, and a non-streaming response carries them all."""
    switches = {
        f"return_{n}": True
        for n in ("finish_reason", "num_input_tokens", "num_output_tokens", "logprobs", "cumulative_logprob")
    }
    lp = json.dumps({"logprobs": 1})
    asked = request(stream=True, max_tokens=24, ignore_eos=True, num_draft_tokens=4, sampling_parameters=lp, **switches)
    whole = request(max_tokens=24, ignore_eos=True, num_draft_tokens=4, sampling_parameters=lp, **switches)
    plain = request(stream=True, max_tokens=24, ignore_eos=True, num_draft_tokens=4, **{name: None for name in ASK})
    asked_resps, [whole_resp], plain_resps = finish(model, asked, whole, plain)
    per = [int(r.output_tensors["num_output_tokens"][0]) for r in asked_resps]
    assert per == [len(r.output_tensors["output_ids"]) for r in asked_resps] and sum(per) == 24
    assert {r.output_tensors["num_output_tokens"].dtype for r in asked_resps} == {np.dtype(np.uint32)}
    rows = [row for r in asked_resps for row in json.loads(r.output_tensors["logprobs"][0])]
    ids = joined(asked_resps, "output_ids")
    assert [next(iter(row)) for row in rows] == [str(t) for t in ids] and all(1 <= len(row) <= 2 for row in rows)
    assert json.loads(whole_resp.output_tensors["logprobs"][0]) == rows, "one response: every token's logprobs"
    total = sum(row[str(t)]["logprob"] for row, t in zip(rows, ids, strict=True))
    assert abs(float(asked_resps[-1].output_tensors["cumulative_logprob"][0]) - total) < 1e-3
    assert all(set(r.output_tensors) == {f.name for f in contract.OUTPUTS if f.switch is None} for r in plain_resps)


def test_enable_lora_reads_the_version_folders_multi_lora_json(tiny_ckpt, model_py):
    """vllm_backend's layout: with enable_lora and no lora_adapters, the list is <version folder>/multi_lora.json
    (the shipped model has none: the load fails naming that file)."""
    params = config_parameters()
    params["checkpoint"] = {"string_value": str(tiny_ckpt)}
    params["enable_lora"] = {"string_value": "1"}
    wanted = str(MODEL_DIR / "1" / "multi_lora.json")
    with pytest.raises(pb.TritonModelException, match=f"could not read the LoRA list '{re.escape(wanted)}'"):
        model_py.TritonPythonModel().initialize(initialize_args(params))


def test_a_model_json_with_enable_lora_enables_it(tiny_ckpt, tmp_path, model_py):
    """vllm_backend's <version>/model.json {"enable_lora": true} (which Triton's OpenAI frontend reads to list the
    adapters) turns LoRA on: the list is then read from that version folder."""
    params = config_parameters()
    params["checkpoint"] = {"string_value": str(tiny_ckpt)}
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.json").write_text('{"enable_lora": true}')
    args = {**initialize_args(params), "model_repository": str(tmp_path)}
    wanted = str(tmp_path / "1" / "multi_lora.json")
    with pytest.raises(pb.TritonModelException, match=f"could not read the LoRA list '{re.escape(wanted)}'"):
        model_py.TritonPythonModel().initialize(args)


def refused_at_once(m, **inputs):
    """A new request's only response, which must come within a second: its error."""
    r = request(max_tokens=4, **inputs)
    t0 = time.monotonic()
    m.execute([r])
    assert r.sender.done.wait(1.0), "a down engine answers a new request within a second"
    assert time.monotonic() - t0 < 1.0
    [(only, _)] = r.sender.responses
    return only.error


def test_grammar_workers_that_cannot_restart_make_the_model_unready(own_model):
    """Guided requests would all be refused: the instance is down as for a stopped engine (one test decides it):
    it asks Triton to unload it, refuses every new request naming the workers, and engine_up says 0."""
    name = "test_grammar_workers_that_cannot_restart_make_the_model_unready"
    m = own_model()
    gauge = lambda family: metric(family, model=name)[0].value()  # noqa: E731
    wait_for(lambda: gauge("specgram_engine_up") == 1, "the engine_up gauge is set")
    assert m.is_ready() and m.engine.grammar.broken is None
    m.engine.grammar.pool._broken = "grammar compile workers keep failing to start (see the server log)"
    wait_for(lambda: name in pb.unloaded, "the model asks Triton to unload it")
    assert not m.is_ready() and m.loop.alive  # the engine itself still runs until the unload finalizes it
    assert any("keep failing to start" in e and "unloaded itself" in e for e in pb.Logger.errors)
    wait_for(lambda: gauge("specgram_engine_up") == 0, "the engine_up gauge drops to 0")
    for inputs in ({}, {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[ab]+"}):
        error = refused_at_once(m, **inputs)
        assert error.code() == pb.TritonError.UNAVAILABLE, inputs
        assert "grammar compile workers keep failing to start" in error.message(), inputs


@pytest.mark.parametrize("failure", ["engine", "grammar"])
def test_outside_explicit_model_control_a_down_model_stays_loaded_refusing_with_engine_up_0(
    own_model, monkeypatch, failure
):
    """Model-control modes none and poll: a model cannot unload itself there, so it does not ask (a refused
    unload can crash Triton 2.51's Python backend) and stays READY to Triton; every new request is refused at once
    (UNAVAILABLE, naming what failed) and engine_up is 0, the signals a load balancer has there; the log says to
    restart the server, once."""
    name = f"test_outside_explicit_model_control_a_down_model_stays_loaded_refusing_with_engine_up_0[{failure}]"
    monkeypatch.setitem(pb.model_control, "explicit", False)
    m = own_model()
    gauge = lambda family: metric(family, model=name)[0].value()  # noqa: E731
    wait_for(lambda: gauge("specgram_engine_up") == 1, "the engine_up gauge is set")
    [[served]] = finish(m, request(max_tokens=2))
    assert served.error is None
    if failure == "engine":

        def broken_step():
            raise RuntimeError("slot bookkeeping broke")

        m.loop.engine.step = broken_step
        [[failed]] = finish(m, request(max_tokens=2))
        assert failed.error.code() == pb.TritonError.INTERNAL and "slot bookkeeping broke" in failed.error.message()
        needle = "engine stopped"
    else:
        m.engine.grammar.pool._broken = "grammar compile workers keep failing to start (see the server log)"
        needle = "grammar compile workers keep failing to start"
    logged = lambda: [e for e in pb.Logger.errors if f"'{name}'" in e]  # noqa: E731
    wait_for(logged, "the withdrawal is logged")
    assert needle in logged()[0] and "still reports ready" in logged()[0] and "restart the server" in logged()[0]
    assert name not in pb.unloaded and name not in pb.refused_unloads and not m.is_ready()
    wait_for(lambda: gauge("specgram_engine_up") == 0, "the engine_up gauge drops to 0")
    for _ in range(3):  # every new request, for as long as the instance lives
        error = refused_at_once(m)
        assert error.code() == pb.TritonError.UNAVAILABLE and needle in error.message(), error.message()
    time.sleep(0.2)  # the sender thread goes on polling: the gauge stays down and nothing is tried again
    assert gauge("specgram_engine_up") == 0
    assert len(logged()) == 1 and name not in pb.refused_unloads


@pytest.mark.parametrize(
    "argv, explicit",
    [
        (["tritonserver", "--model-repository=/models", "--model-control-mode=explicit", "--load-model=llm"], True),
        (["tritonserver", "--model-control-mode", "explicit"], True),
        (["tritonserver", "--model-control-mode=EXPLICIT"], True),
        (["tritonserver", "--model-control-mode=explicit", "--model-control-mode=poll"], False),  # the last counts
        (["tritonserver", "--model-control-mode=poll"], False),
        (["tritonserver", "--model-control-mode=none"], False),
        (["tritonserver", "--model-repository=/models"], False),  # the default: none
        (["tritonserver", "--model-control-mode"], False),
        ([], False),  # a command line that cannot be read
    ],
)
def test_explicit_model_control_is_read_from_the_servers_command_line(model_py, argv, explicit):
    assert model_py.explicit_model_control(argv) is explicit
