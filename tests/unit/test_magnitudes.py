"""Validation by magnitude and length: every number and string a client sends is bounded where it arrives (tensor,
sampling_parameters, request parameter), and every malformed JSON or schema is one INVALID_ARG naming the field."""

import json

import pytest

from specgram.errors import InvalidRequest
from specgram.request import SamplingParams
from specgram.serving.protocol import parse

from .helpers import run, tokens_of

BIG = 100000000000000000000  # 1e20: a JSON integer that no INT32 tensor can carry


def _sp(**kw) -> dict:
    return {"text_input": "hi", "sampling_parameters": json.dumps(kw)}


def _validated(given: dict) -> SamplingParams:
    params = parse(given).params
    if params.num_draft_tokens is None:
        params.num_draft_tokens = 0
    return params.validate(16, 8)


@pytest.mark.parametrize(
    "given,field",
    [
        (_sp(temperature=1, top_k=BIG), "top_k"),
        (_sp(max_tokens=BIG), "max_tokens"),
        (_sp(min_tokens=-BIG), "min_tokens"),
        (_sp(num_draft_tokens=BIG), "num_draft_tokens"),
        (_sp(seed=2**64), "seed"),
        (_sp(stop_token_ids=[1, BIG]), "stop_token_ids"),
        (_sp(allowed_token_ids=[BIG]), "allowed_token_ids"),
        (_sp(logit_bias={str(BIG): 1}), "logit_bias"),
        (_sp(temperature=10**400), "temperature"),
        (_sp(logprobs=BIG), "logprobs"),
        ({"text_input": "hi", "sampling_parameters": '{"top_k": ' + "9" * 5000 + "}"}, "sampling_parameters"),
        ({"text_input": "hi", "top_k": "9" * 5000}, "top_k"),
    ],
)
def test_every_integer_and_float_is_bounded_however_it_arrives(given, field):
    with pytest.raises(InvalidRequest, match=field) as e:
        _validated(given)
    assert len(str(e.value)) < 400  # a 5,000-digit value is not echoed back


def test_request_parameters_are_bounded_too():
    with pytest.raises(InvalidRequest, match="top_k"):
        parse({"text_input": "hi"}, {"top_k": BIG})


def test_the_widest_values_each_type_carries_are_taken():
    params = _validated(_sp(seed=2**64 - 1, top_k=2**31 - 1, max_tokens=2**31 - 1))
    assert (params.seed, params.top_k, params.max_tokens) == (2**64 - 1, 2**31 - 1, 2**31 - 1)


def test_a_max_tokens_beyond_int32_means_no_limit():
    """max_tokens is a limit: 10**12 ("no limit") is taken as INT32's largest; beyond int64 it is refused."""
    assert _validated(_sp(max_tokens=10**12)).max_tokens == 2**31 - 1
    with pytest.raises(InvalidRequest, match="max_tokens"):
        _validated(_sp(max_tokens=2**63))


@pytest.mark.parametrize("t", [1e-300, 5e-324, 9.9e-6])
def test_a_temperature_below_1e_5_is_greedy(make_engine, t):
    params = SamplingParams(temperature=t, max_tokens=8, num_draft_tokens=0).validate(16, 8)
    assert params.temperature == 0.0 and params.greedy
    engine = make_engine()
    tiny, greedy = run(engine, ["Hello there"] * 2, temperature=[t, 0.0], max_tokens=12, logprobs=2)
    assert tokens_of(tiny) == tokens_of(greedy)
    assert all(e.logprob == e.logprob for o in tiny for row in o.logprobs for e in row)  # no NaN


@pytest.mark.parametrize("field", ["stop", "bad_words"])
def test_stop_strings_and_bad_words_are_capped_in_length(make_engine, field):
    engine = make_engine(max_stop_chars=50)
    engine.make_request(SamplingParams(**{field: ["x" * 50]}), text="hi")
    with pytest.raises(InvalidRequest, match=f"{field}.*51 characters.*max_stop_chars"):
        engine.make_request(SamplingParams(**{field: ["ok", "x" * 51]}), text="hi")


@pytest.mark.parametrize(
    "schema",
    [
        '{"type": [{}]}',
        '{"type": "string", "format": ["date"]}',
        '{"type": "object", "properties": []}',
        '{"type": "integer", "minimum": ' + "9" * 5000 + "}",
        '{"enum": 3}',
    ],
)
def test_a_malformed_schema_is_an_invalid_request(make_engine, schema):
    """Refused when the request is read (check) or when it compiles: InvalidRequest either way, never another
    exception type (which the adapter would report as INTERNAL)."""
    engine = make_engine()
    with pytest.raises(InvalidRequest, match="guide"):
        engine.grammar.check("json_schema", schema)
        engine.grammar.compile(engine.grammar.check("json_schema", schema), schema)
