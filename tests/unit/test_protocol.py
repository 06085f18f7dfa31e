import json
from contextlib import closing

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.settings import dtype_of
from specgram.errors import InvalidRequest, ModelLoadError
from specgram.request import SamplingParams
from specgram.serving.protocol import parse


def test_precedence_tensor_and_sampling_parameters_over_request_parameters():
    c = parse(
        {"text_input": "x", "top_k": 5, "sampling_parameters": json.dumps({"top_k": 5, "temperature": 0.5})},
        {"temperature": 0.9, "seed": 11, "top_p": 0.3, "top_k": 2},
    )
    assert (c.params.top_k, c.params.temperature, c.params.seed, c.params.top_p) == (5, 0.5, 11, 0.3)


def test_an_input_and_sampling_parameters_that_disagree_are_refused():
    with pytest.raises(InvalidRequest, match="top_k is given as an input .* different values"):
        parse({"text_input": "x", "top_k": 5, "sampling_parameters": json.dumps({"top_k": 7})})


@pytest.mark.parametrize(
    "inputs, request_parameters, needle",
    [
        ({"max_tokens": 5, "sampling_parameters": '{"max_tokens": "many"}'}, None, "sampling_parameters.max_tokens"),
        ({"temperature": 0.5}, {"temperature": "hot"}, "request parameter temperature"),
        ({"sampling_parameters": '{"top_p": 0.5}'}, {"top_p": [1]}, "request parameter top_p"),
    ],
)
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


@pytest.mark.parametrize(
    "inputs, needle",
    [
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
    ],
)
def test_type_errors_name_the_field(inputs, needle):
    with pytest.raises(InvalidRequest, match=needle):
        parse(inputs)


def test_messages_replace_text_input():
    c = parse({"text_input": "", "messages": json.dumps([{"role": "user", "content": "hi"}])})
    assert c.messages == [{"role": "user", "content": "hi"}]


def test_engine_config_from_strings():
    cfg = EngineConfig.from_dict({"checkpoint": "/x", "max_slots": "3", "device": "cpu", "dtype": "bf16"})
    assert cfg.max_slots == 3 and dtype_of(cfg.dtype, torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown engine parameters"):
        EngineConfig.from_dict({"checkpoint": "/x", "max_slot": "3"})
    with pytest.raises(ModelLoadError, match="integer"):
        EngineConfig.from_dict({"checkpoint": "/x", "max_slots": "many"})
    with pytest.raises(ModelLoadError, match="device"):
        EngineConfig(checkpoint="/x", device="tpu")


def test_engine_config_booleans_from_strings():
    cfg = EngineConfig.from_dict(
        {"checkpoint": "/x", "cuda_graphs": "0", "json_strict": "1", "json_any_whitespace": "False"}
    )
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

    engine = Engine.from_config(
        EngineConfig(checkpoint=str(tiny_ckpt), default_num_draft_tokens=1, default_num_draft_tokens_guided=3)
    )
    assert engine.make_request(SamplingParams(), text="hi").params.num_draft_tokens == 1
    guided = engine.make_request(SamplingParams(guide_type="regex", guide="a+"), text="hi")
    assert guided.params.num_draft_tokens == 3
    explicit = engine.make_request(SamplingParams(num_draft_tokens=0, guide_type="json"), text="hi")
    assert explicit.params.num_draft_tokens == 0


def test_vllm_keys_at_their_neutral_value_are_accepted():
    """What vllm_backend clients (Triton's OpenAI frontend) send on every request changes nothing here."""
    sent = {
        "n": 1,
        "frequency_penalty": 0,
        "presence_penalty": "0",
        "repetition_penalty": 1.0,
        "best_of": "1",
        "logprobs": None,
        "stop_token_ids": [],
        "skip_special_tokens": "true",
        "use_beam_search": False,
        "structured_outputs": None,
        "max_tokens": "12",
        "temperature": 0,
    }
    c = parse({"text_input": "x", "sampling_parameters": json.dumps(sent)})
    assert c.params.max_tokens == 12 and c.params.temperature == 0


@pytest.mark.parametrize(
    "key, value",
    [
        ("n", 2),
        ("best_of", 3),
        ("prompt_logprobs", 1),
        ("use_beam_search", "true"),
        ("n", True),
        ("min_p", "x"),
        ("include_stop_str_in_output", True),
    ],
)
def test_vllm_keys_at_other_values_are_refused_by_name(key, value):
    with pytest.raises(InvalidRequest, match=rf"sampling_parameters\.{key} = .* is not supported"):
        parse({"text_input": "x", "sampling_parameters": json.dumps({key: value})})


def test_vllm_processor_keys_reach_the_sampling_parameters():
    sent = {
        "frequency_penalty": 0.5,
        "presence_penalty": "1",
        "repetition_penalty": 1.2,
        "logprobs": 3,
        "stop_token_ids": [7, 9],
        "bad_words": ["foo"],
        "logit_bias": {"5": -100, "6": 2.5},
        "allowed_token_ids": [1, 2, 3],
    }
    p = parse({"text_input": "x", "sampling_parameters": json.dumps(sent)}).params
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty, p.logprobs) == (0.5, 1.0, 1.2, 3)
    assert p.stop_token_ids == [7, 9] and p.bad_words == ["foo"] and p.logit_bias == {5: -100.0, 6: 2.5}
    assert p.allowed_token_ids == [1, 2, 3] and p.penalized
    tensors = parse(
        {
            "text_input": "x",
            "presence_penalty": 0.25,
            "stop_token_ids": [4],
            "bad_words": ["a", "b"],
            "logit_bias": '{"3": 1}',
        }
    ).params
    assert (tensors.presence_penalty, tensors.stop_token_ids, tensors.bad_words, tensors.logit_bias) == (
        0.25,
        [4],
        ["a", "b"],
        {3: 1.0},
    )
    with pytest.raises(InvalidRequest, match="logit_bias"):
        parse({"text_input": "x", "sampling_parameters": json.dumps({"logit_bias": [1, 2]})})
    with pytest.raises(InvalidRequest, match="stop_token_ids must be an integer"):
        parse({"text_input": "x", "sampling_parameters": json.dumps({"stop_token_ids": ["a"]})})


@pytest.mark.parametrize(
    "spec, kind, guide",
    [
        ({"json": {"type": "object"}}, "json_schema", '{"type": "object"}'),
        ({"json": '{"type": "string"}', "backend": "xgrammar"}, "json_schema", '{"type": "string"}'),
        ({"regex": "[a-z]+"}, "regex", "[a-z]+"),
        ({"choice": ["yes", "no"]}, "choice", '["yes", "no"]'),
        ({"grammar": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
        ({"json_object": True, "disable_any_whitespace": False}, "json", ""),
        ({"structural_tag": '{"type": "structural_tag"}'}, "structural_tag", '{"type": "structural_tag"}'),
    ],
)
@pytest.mark.parametrize("name", ["structured_outputs", "guided_decoding"])
def test_vllm_structured_outputs_become_the_guide(name, spec, kind, guide):
    p = parse({"text_input": "x", "sampling_parameters": json.dumps({name: spec})}).params
    assert (p.guide_type, p.guide) == (kind, guide)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"json": {}, "regex": "a"}, "set exactly one"),
        ({"jsn": {}}, "unknown keys"),
        ([1], "must be an object"),
        ({"choice": "yes"}, "list of strings"),
        ({"json_object": "yes"}, "json_object must be true"),
        ({"regex": 5}, "must be a string"),
        ({"regex": "a", "whitespace_pattern": " "}, "whitespace_pattern"),
    ],
)
def test_bad_structured_outputs_are_refused_by_name(spec, message):
    with pytest.raises(InvalidRequest, match=message):
        parse({"text_input": "x", "sampling_parameters": json.dumps({"structured_outputs": spec})})


def test_a_guide_given_twice_is_refused():
    with pytest.raises(InvalidRequest, match="more than once"):
        parse(
            {
                "text_input": "x",
                "guided_decoding_guide_type": "regex",
                "guided_decoding_guide": "a",
                "sampling_parameters": json.dumps({"structured_outputs": {"regex": "b"}}),
            }
        )
    empty = parse({"text_input": "x", "sampling_parameters": json.dumps({"structured_outputs": {"json": None}})})
    assert empty.params.guide_type is None


def test_vllm_backend_switches_ask_for_their_outputs():
    c = parse(
        {
            "text_input": "x",
            "return_num_output_tokens": True,
            "return_finish_reason": True,
            "return_num_input_tokens": False,
            "return_logprobs": True,
            "return_cumulative_logprob": False,
        }
    )
    assert c.outputs == {"num_output_tokens", "finish_reason", "logprobs"} and not c.params.cumulative_logprob
    assert parse({"text_input": "x"}).outputs == frozenset()
    cumulative = parse({"text_input": "x", "return_cumulative_logprob": True})
    assert cumulative.outputs == {"cumulative_logprob"} and cumulative.params.wants_logprobs
    with pytest.raises(InvalidRequest, match="return_finish_reason"):
        parse({"text_input": "x", "return_finish_reason": "maybe"})


def test_negative_seeds_are_their_64_bits_read_unsigned():
    """OpenAI's seeds are signed 64-bit integers; the noise is keyed by the same bits."""
    from specgram.request import SamplingParams

    assert SamplingParams(seed=-5, num_draft_tokens=0).validate(16, 8).seed == 2**64 - 5
    assert SamplingParams(seed=-(2**63), num_draft_tokens=0).validate(16, 8).seed == 2**63
    with pytest.raises(InvalidRequest, match="seed"):
        SamplingParams(seed=-(2**63) - 1, num_draft_tokens=0).validate(16, 8)
    with pytest.raises(InvalidRequest, match="seed"):
        SamplingParams(seed=2**64, num_draft_tokens=0).validate(16, 8)


@pytest.mark.parametrize(
    "flags, options",
    [
        ({}, ()),
        ({"disable_any_whitespace": False, "disable_additional_properties": False}, ()),
        ({"disable_any_whitespace": True}, (("json_any_whitespace", False),)),
        ({"disable_additional_properties": True}, (("json_strict", True),)),
    ],
)
def test_vllm_json_flags_become_the_requests_compile_options(flags, options):
    p = parse(
        {
            "text_input": "x",
            "sampling_parameters": json.dumps({"structured_outputs": {"json": {"type": "object"}, **flags}}),
        }
    ).params
    assert p.guide_options == options
    with pytest.raises(InvalidRequest, match="disable_any_whitespace must be true or false"):
        parse(
            {
                "text_input": "x",
                "sampling_parameters": json.dumps(
                    {"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": "yes"}}
                ),
            }
        )


def test_vllm_whitespace_flag_reaches_any_json_but_the_properties_flag_does_not():
    """json_object compiles any JSON, which has a layout (json_any_whitespace) but takes any keys (no json_strict)."""
    spec = {"json_object": True, "disable_any_whitespace": True, "disable_additional_properties": True}
    p = parse({"text_input": "x", "sampling_parameters": json.dumps({"structured_outputs": spec})}).params
    assert (p.guide_type, p.guide_options) == ("json", (("json_any_whitespace", False),))


def test_vllm_json_flags_change_the_grammar(make_engine):
    """disable_any_whitespace: the compact layout only; disable_additional_properties: no extra keys, where the
    server's json_strict 0 would allow them. Checked on the compiled grammars' matchers, and through the engine's
    own compile path (the cache keys the options: the same schema compiles three ways)."""
    import xgrammar as xgr

    engine = make_engine(json_strict=False)
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'

    def accepts(options, text):
        m = xgr.GrammarMatcher(engine.grammar.submit("json_schema", schema, options).future.result())
        return m.accept_string(text)

    compact = (("json_any_whitespace", False),)
    assert accepts((), '{ "a": 1 }') and not accepts(compact, '{ "a"') and not accepts(compact, '{"a":  1')
    assert accepts(compact, '{"a": 1}')
    assert accepts((), '{"a": 1, "b"') and not accepts((("json_strict", True),), '{"a": 1, "b"')


def test_chat_template_kwargs_reach_the_chat_template(make_engine):
    """vLLM's chat_template_kwargs as an input, in sampling_parameters or as a request parameter: the template's
    variables (a thinking switch here); refused where it is not an object, names a template-call argument, or
    comes without a chat prompt."""
    off = {"enable_thinking": False}
    for inputs, rp in (
        ({"chat_template_kwargs": json.dumps(off)}, {}),
        ({"sampling_parameters": json.dumps({"chat_template_kwargs": off})}, {}),
        ({}, {"chat_template_kwargs": json.dumps(off)}),
    ):
        assert parse({"text_input": "hi", **inputs}, rp).template_kwargs == off
    with closing(make_engine()) as engine:
        tok = engine.tokenizer

        def prompt(**kw) -> str:
            req = engine.make_request(SamplingParams(max_tokens=1), text="hi", chat=True, **kw)
            return tok.decode(req.prompt_ids)

        assert prompt().endswith("assistant: ") and prompt(template_kwargs=off).endswith("assistant: <think></think>")
        assert prompt(template_kwargs={"enable_thinking": True}) == prompt()
        with pytest.raises(InvalidRequest, match="applies to chat prompts"):
            engine.make_request(SamplingParams(max_tokens=1), text="hi", template_kwargs=off)
    for bad, needle in (
        ("[1]", "must be a JSON object"),
        ('{"tokenize": true}', "may not set tokenize"),
        ("{", "must be a JSON object"),
    ):
        with pytest.raises(InvalidRequest, match=needle):
            parse({"text_input": "hi", "chat_template_kwargs": bad})
