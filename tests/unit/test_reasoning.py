"""Thinking models: a guided chat request's guide holds after the reasoning's end marker; the reasoning before it
is free text, at most max_reasoning_chars characters, after which the grammar forces the marker - also where the
marker falls inside a speculative draft window. A tiny random model is driven through the marker (its reasoning budget
runs out), and its output is identical with speculation on and off."""

from __future__ import annotations

import json
from contextlib import closing

import pytest

from specgram.engine.settings import reasoning_end_of
from specgram.request import SamplingParams

from .helpers import run_to_end, text_of, tokens_of

END = "</think>"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
GUIDES = [("choice", json.dumps(["yes", "no"])), ("json_schema", json.dumps(SCHEMA))]


@pytest.fixture(scope="module")
def engine(make_engine):
    with closing(
        make_engine(reasoning_end=END, draft_quantization="int8", json_any_whitespace=False, max_seq_len=160)
    ) as e:
        yield e


def answer(engine, guide, budget, k=0, drafter="ngram", **kw):
    kind, text = guide
    params = SamplingParams(
        max_tokens=64, guide_type=kind, guide=text, max_reasoning_chars=budget, num_draft_tokens=k, drafter=drafter
    )
    req = engine.make_request(params, text="Is it ok?", chat=True, **kw)
    outs = run_to_end(engine, [req])[req.request_id]
    assert outs[-1].error is None, outs[-1].error
    return outs


@pytest.mark.parametrize("guide", GUIDES, ids=[g[0] for g in GUIDES])
@pytest.mark.parametrize("budget", [0, 5])
def test_the_guide_holds_after_the_reasoning_and_speculation_changes_nothing(engine, guide, budget):
    plain = answer(engine, guide, budget)
    reasoning, marker, rest = text_of(plain).partition(END)
    assert marker == END and plain[-1].finish_reason == "stop", text_of(plain)
    # the bound counts characters; the tiny tokenizer's tokens are single bytes, a character at most 4 of them
    ids, marker_ids = tokens_of(plain), engine.tokenizer(END, add_special_tokens=False)["input_ids"]
    at = next(i for i in range(len(ids)) if ids[i : i + len(marker_ids)] == marker_ids)
    assert budget <= at <= 4 * budget + 3 and END not in reasoning
    if guide[0] == "choice":
        assert rest in ("yes", "no")
    else:
        assert isinstance(json.loads(rest)["ok"], bool)
    for k, drafter in ((4, "ngram"), (4, "draft_model"), (-1, "draft_model"), (2, "grammar")):
        assert tokens_of(answer(engine, guide, budget, k, drafter)) == tokens_of(plain), (k, drafter)


def test_a_prompt_that_closes_the_reasoning_is_guided_from_its_first_token(engine):
    outs = answer(engine, GUIDES[0], 5, template_kwargs={"enable_thinking": False})
    assert text_of(outs) in ("yes", "no")


def test_plain_text_prompts_and_models_without_a_marker_are_guided_at_once(engine, make_engine):
    params = SamplingParams(max_tokens=8, guide_type="choice", guide=GUIDES[0][1])
    req = engine.make_request(params, text="Is it ok?")
    assert text_of(run_to_end(engine, [req])[req.request_id]) in ("yes", "no")
    with closing(make_engine()) as plain:  # the tiny tokenizer has no "</think>" token: auto finds no marker
        req = plain.make_request(SamplingParams(max_tokens=8, guide_type="choice", guide=GUIDES[0][1]), text="x")
        assert text_of(run_to_end(plain, [req])[req.request_id]) in ("yes", "no")


def test_the_marker_is_found_where_the_tokenizer_and_template_have_it(engine):
    class Tok:
        def __init__(self, vocab, template):
            self.get_vocab, self.chat_template = (lambda: vocab), template

    assert reasoning_end_of("auto", Tok({END: 5}, "{{ '<think>' }}")) == END
    assert reasoning_end_of("auto", Tok({END: 5}, "no thinking here")) == ""
    assert reasoning_end_of("auto", Tok({}, "<think>")) == ""
    assert (
        reasoning_end_of("none", Tok({END: 5}, "<think>")) == "" and reasoning_end_of("<end>", Tok({}, "")) == "<end>"
    )
