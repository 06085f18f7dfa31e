import json

import pytest

from specgram.config import EngineConfig
from specgram.errors import InvalidRequest, ModelLoadError
from specgram.serving.protocol import parse


def test_precedence_tensor_and_sampling_parameters_over_request_parameters():
    c = parse({"text_input": "x", "top_k": 5, "sampling_parameters": json.dumps({"top_k": 5, "temperature": 0.5})},
              {"temperature": 0.9, "seed": 11, "top_p": 0.3, "top_k": 2})
    assert (c.params.top_k, c.params.temperature, c.params.seed, c.params.top_p) == (5, 0.5, 11, 0.3)


def test_an_input_and_sampling_parameters_that_disagree_are_refused():
    with pytest.raises(InvalidRequest, match="top_k is given as an input .* different values"):
        parse({"text_input": "x", "top_k": 5, "sampling_parameters": json.dumps({"top_k": 7})})


@pytest.mark.parametrize("inputs, request_parameters, needle", [
    ({"max_tokens": 5, "sampling_parameters": '{"max_tokens": "many"}'}, None, "sampling_parameters.max_tokens"),
    ({"temperature": 0.5}, {"temperature": "hot"}, "request parameter temperature"),
    ({"sampling_parameters": '{"top_p": 0.5}'}, {"top_p": [1]}, "request parameter top_p"),
])
def test_a_value_overridden_by_a_higher_source_is_still_checked(inputs, request_parameters, needle):
    with pytest.raises(InvalidRequest, match=needle):
        parse({"text_input": "x", **inputs}, request_parameters)


def test_defaults_follow_the_stream_flag():
    assert parse({"text_input": "x"}).exclude_input_in_output is False
    assert parse({"text_input": "x", "stream": True}).exclude_input_in_output is True
    assert parse({"text_input": "x", "stream": True, "exclude_input_in_output": False}).exclude_input_in_output is False


def test_numbers_as_strings_as_genai_perf_sends_them():
    c = parse({"text_input": "x", "sampling_parameters": json.dumps({"max_tokens": "32", "temperature": "0.5"})})
    assert c.params.max_tokens == 32 and c.params.temperature == 0.5
    for bad in ({"max_tokens": "32.5"}, {"max_tokens": "many"}, {"temperature": "nan"}):
        with pytest.raises(InvalidRequest):
            parse({"text_input": "x", "sampling_parameters": json.dumps(bad)})


def test_http_style_values_and_stop_forms():
    c = parse({"text_input": "x"}, {"stream": "true", "stop": "END", "max_tokens": 4.0})
    assert c.stream is True and c.params.stop == ["END"] and c.params.max_tokens == 4
    assert parse({"text_input": "x", "stop": ["a", "b"]}).params.stop == ["a", "b"]


@pytest.mark.parametrize("inputs, needle", [
    ({"text_input": "x", "max_tokens": 2.5}, "max_tokens must be an integer"),
    ({"text_input": "x", "max_tokens": True}, "max_tokens must be an integer"),
    ({"text_input": "x", "temperature": "hot"}, "temperature"),
    ({"text_input": "x", "temperature": float("nan")}, "temperature"),
    ({"text_input": "x", "stream": "maybe"}, "stream must be a boolean"),
    ({"text_input": "x", "stop": [1]}, "stop"),
    ({"text_input": ""}, "text_input"),
    ({"text_input": "x", "sampling_parameters": "[1]"}, "JSON object"),
    ({"text_input": "", "messages": "[]"}, "messages"),
    ({"text_input": "", "messages": '[{"role": "user"}]'}, "messages"),
])
def test_type_errors_name_the_field(inputs, needle):
    with pytest.raises(InvalidRequest, match=needle):
        parse(inputs)


def test_messages_replace_text_input():
    c = parse({"text_input": "", "messages": json.dumps([{"role": "user", "content": "hi"}])})
    assert c.messages == [{"role": "user", "content": "hi"}]


def test_engine_config_from_strings():
    cfg = EngineConfig.from_dict({"checkpoint": "/x", "max_slots": "3", "device": "cpu", "dtype": "bf16"})
    assert cfg.max_slots == 3 and str(cfg.torch_dtype()) == "torch.bfloat16"
    with pytest.raises(ModelLoadError, match="unknown engine parameters"):
        EngineConfig.from_dict({"checkpoint": "/x", "max_slot": "3"})
    with pytest.raises(ModelLoadError, match="integer"):
        EngineConfig.from_dict({"checkpoint": "/x", "max_slots": "many"})
    with pytest.raises(ModelLoadError, match="device"):
        EngineConfig(checkpoint="/x", device="tpu")


def test_engine_config_booleans_from_strings():
    cfg = EngineConfig.from_dict({"checkpoint": "/x", "cuda_graphs": "0", "json_strict": "1",
                                  "json_any_whitespace": "False"})
    assert (cfg.cuda_graphs, cfg.json_strict, cfg.json_any_whitespace) == (False, True, False)
    assert all(type(v) is bool for v in (cfg.cuda_graphs, cfg.json_strict, cfg.json_any_whitespace))
    assert EngineConfig.from_dict({"checkpoint": "/x", "cuda_graphs": " TRUE "}).cuda_graphs is True
    assert EngineConfig(checkpoint="/x", json_strict=0).json_strict is False
    with pytest.raises(ModelLoadError, match="cuda_graphs must be 0, 1, true or false"):
        EngineConfig.from_dict({"checkpoint": "/x", "cuda_graphs": "yes"})
    with pytest.raises(ModelLoadError, match="json_strict must be a boolean"):
        EngineConfig(checkpoint="/x", json_strict=2)


def test_load_errors_are_clear(tmp_path):
    from specgram.engine.engine import Engine
    with pytest.raises(ModelLoadError, match="does not exist"):
        Engine.from_config(EngineConfig(checkpoint=str(tmp_path / "missing")))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="not supported"):
        Engine.from_config(EngineConfig(checkpoint=str(tmp_path)))


def test_default_draft_length_depends_on_the_guide(tiny_ckpt):
    from specgram.engine.engine import Engine
    from specgram.request import SamplingParams
    engine = Engine.from_config(EngineConfig(checkpoint=str(tiny_ckpt), default_num_draft_tokens=1,
                                             default_num_draft_tokens_guided=3))
    assert engine.make_request(SamplingParams(), text="hi").params.num_draft_tokens == 1
    guided = engine.make_request(SamplingParams(guide_type="regex", guide="a+"), text="hi")
    assert guided.params.num_draft_tokens == 3
    explicit = engine.make_request(SamplingParams(num_draft_tokens=0, guide_type="json"), text="hi")
    assert explicit.params.num_draft_tokens == 0


def test_vllm_keys_at_their_neutral_value_are_accepted():
    """What vllm_backend clients (Triton's OpenAI frontend) send on every request changes nothing here."""
    sent = {"n": 1, "frequency_penalty": 0, "presence_penalty": "0", "repetition_penalty": 1.0, "best_of": "1",
            "logprobs": None, "stop_token_ids": [], "skip_special_tokens": "true", "use_beam_search": False,
            "structured_outputs": None, "max_tokens": "12", "temperature": 0}
    c = parse({"text_input": "x", "sampling_parameters": json.dumps(sent)})
    assert c.params.max_tokens == 12 and c.params.temperature == 0


@pytest.mark.parametrize("key, value", [("n", 2), ("frequency_penalty", 0.5), ("presence_penalty", "1"),
                                        ("repetition_penalty", 1.2), ("logprobs", 3), ("stop_token_ids", [7]),
                                        ("use_beam_search", "true"), ("n", True), ("min_p", "x")])
def test_vllm_keys_at_other_values_are_refused_by_name(key, value):
    with pytest.raises(InvalidRequest, match=rf"sampling_parameters\.{key} = .* is not supported"):
        parse({"text_input": "x", "sampling_parameters": json.dumps({key: value})})


def test_vllm_backend_switches():
    c = parse({"text_input": "x", "return_num_output_tokens": True, "return_finish_reason": True,
               "return_num_input_tokens": False, "return_logprobs": False, "return_cumulative_logprob": False})
    assert c.count_per_response
    assert not parse({"text_input": "x"}).count_per_response
    for name in ("return_logprobs", "return_cumulative_logprob"):
        with pytest.raises(InvalidRequest, match=f"{name}: this model does not return logprobs"):
            parse({"text_input": "x", name: True})
    with pytest.raises(InvalidRequest, match="return_finish_reason"):
        parse({"text_input": "x", "return_finish_reason": "maybe"})
