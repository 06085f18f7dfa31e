"""Guided decoding through the real tritonserver with the default model: JSON-schema outputs on JME schemas
parse and validate (jsonschema), regex, EBNF and json outputs match, bad guides (a keyword the grammar engine would
not enforce among them) fail alone. Every guide here compiles in the server's worker processes."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
from collect import errors_of, ids_of, last_value, stream_infer, text_of
from jme import load_jme


def guided(server, prompt, kind, guide, max_tokens=200, **extra):
    return stream_infer(
        server.grpc_url,
        {
            "text_input": prompt,
            "apply_chat_template": True,
            "stream": True,
            "max_tokens": max_tokens,
            "guided_decoding_guide_type": kind,
            "guided_decoding_guide": guide,
            **extra,
        },
    )


def test_json_schema_outputs_validate(triton_server):
    cases = [(c["name"], c["schema"], c["instance"]) for c in load_jme(6)]
    assert len(cases) == 6 and all(data is not None for _, _, data in cases)

    def one(case):
        name, schema, data = case
        prompt = (
            f"Extract the record as JSON matching the schema.\nRecord: {json.dumps(data)}\nSchema: {json.dumps(schema)}"
        )
        return guided(triton_server, prompt, "json_schema", json.dumps(schema), 256)

    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(one, cases))
    finished = 0
    for (name, schema, _), resps in zip(cases, results, strict=True):
        assert not errors_of(resps), (name, errors_of(resps))
        if last_value(resps, "finish_reason") == "stop":
            finished += 1
            jsonschema.validate(json.loads(text_of(resps)), schema)
    assert finished >= len(cases) // 2, f"only {finished}/{len(cases)} finished within max_tokens"


def test_regex_and_ebnf_outputs_match(triton_server):
    regex = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
    r = guided(triton_server, "When did the first Moon landing happen? Answer with a date.", "regex", regex, 30)
    assert last_value(r, "finish_reason") == "stop" and re.fullmatch(regex, text_of(r)), (text_of(r), ids_of(r))
    ebnf = 'root ::= "[" color (", " color)? (", " color)? "]"\ncolor ::= "red" | "green" | "blue" | "yellow"'
    e = guided(triton_server, "List three colors.", "ebnf", ebnf, 40)
    assert last_value(e, "finish_reason") == "stop", text_of(e)
    assert re.fullmatch(r"\[(red|green|blue|yellow)(, (red|green|blue|yellow)){0,2}\]", text_of(e)), text_of(e)
    j = guided(
        triton_server,
        'Repeat this JSON object exactly: {"name": "Tom", "animal": "cat"}',
        "json",
        "",
        60,
        num_draft_tokens=0,
    )
    assert last_value(j, "finish_reason") == "stop", text_of(j)
    assert isinstance(json.loads(text_of(j)), dict), text_of(j)


def test_speculation_under_a_grammar_is_exact(triton_server):
    regex = r'\{"city": "[A-Z][a-z]{2,12}", "country": "[A-Z][a-z]{2,12}"\}'
    prompt = "Paris is the capital of France. Give city and country as JSON."
    plain = guided(triton_server, prompt, "regex", regex, 40, num_draft_tokens=0)
    forced = guided(triton_server, prompt, "regex", regex, 40, num_draft_tokens=6, drafter="grammar")
    lookup = guided(triton_server, prompt, "regex", regex, 40, num_draft_tokens=4, drafter="ngram")
    assert ids_of(forced) == ids_of(plain) == ids_of(lookup)
    assert last_value(forced, "spec_drafted_tokens") > 0
    assert last_value(forced, "spec_accepted_tokens") == last_value(forced, "spec_drafted_tokens")


def test_bad_guides_fail_alone_next_to_a_good_stream(triton_server):
    good_inputs = {"text_input": "Name a fruit.", "apply_chat_template": True, "stream": True, "max_tokens": 16}
    solo = ids_of(stream_infer(triton_server.grpc_url, good_inputs))
    bad = [
        ("json_schema", '{"type": "nonsense"}', "nonsense"),
        ("regex", "([a-z", "regex"),
        ("yaml", "a: b", "yaml"),
        ("json_schema", "{not json", "JSON"),
        ("json_schema", '{"type": "array", "items": {}, "uniqueItems": true}', "uniqueItems"),
    ]
    with ThreadPoolExecutor(len(bad) + 1) as pool:
        good = pool.submit(stream_infer, triton_server.grpc_url, good_inputs)
        futures = [pool.submit(guided, triton_server, "hi", kind, guide, 10) for kind, guide, _ in bad]
        results = [f.result() for f in futures]
        assert ids_of(good.result()) == solo
    for (kind, _guide, needle), r in zip(bad, results, strict=True):
        # the message names what is wrong; its code (INVALID_ARG) reaches no client here: a gRPC stream carries
        # only the message and HTTP generate answers 400 for any error (test_triton_adapter checks the code)
        assert len(r) == 1 and r[0]["error"] and needle in r[0]["error"], (kind, r)


def test_choice_guides_answer_with_one_of_the_choices(triton_server):
    """A choice guide, as a guide type and as vLLM's structured_outputs / guided_decoding spell it."""
    choices = ["Paris", "Lyon", "Marseille"]
    prompt = "What is the capital of France?"
    by_type = guided(triton_server, prompt, "choice", json.dumps(choices), 20)
    for name in ("structured_outputs", "guided_decoding"):
        by_dict = stream_infer(
            triton_server.grpc_url,
            {
                "text_input": prompt,
                "apply_chat_template": True,
                "stream": True,
                "sampling_parameters": json.dumps({"max_tokens": 20, name: {"choice": choices, "backend": "xgrammar"}}),
            },
        )
        assert ids_of(by_dict) == ids_of(by_type)
    assert last_value(by_type, "finish_reason") == "stop" and text_of(by_type) in choices, text_of(by_type)


def test_hot_sampling_writes_strict_json(triton_server):
    """At temperature 1.5 the model samples far from what it favours; whatever it samples, a JSON output that
    finishes is one a strict parser takes (no raw control character inside a string) and its schema validates,
    and free whitespace cannot fill max_tokens. A schema with length-bounded strings (xgrammar's own rule for them
    admits raw control characters) by guide type, and vLLM's json_object in the compact layout."""
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "maxLength": 8},
            "note": {"type": "string", "maxLength": 40},
            "count": {"type": "integer"},
        },
        "required": ["code", "note", "count"],
        "additionalProperties": False,
    }
    prompt = "Give a product code, a short note and a count as JSON."
    hot = {"temperature": 1.5, "max_tokens": 128}
    compact = {"json_object": True, "disable_any_whitespace": True}

    def by_schema(seed):
        return guided(triton_server, prompt, "json_schema", json.dumps(schema), seed=seed, **hot)

    def by_object(seed):
        inputs = {"text_input": prompt, "apply_chat_template": True, "stream": True}
        params = {**hot, "seed": seed, "structured_outputs": compact}
        return stream_infer(triton_server.grpc_url, {**inputs, "sampling_parameters": json.dumps(params)})

    with ThreadPoolExecutor(8) as pool:
        schema_runs = list(pool.map(by_schema, range(4)))
        object_runs = list(pool.map(by_object, range(4)))
    finished = 0
    for runs, validate in ((schema_runs, schema), (object_runs, {"type": ["object", "array"]})):
        for r in runs:
            assert not errors_of(r), errors_of(r)
            if last_value(r, "finish_reason") == "stop":
                finished += 1
                jsonschema.validate(json.loads(text_of(r)), validate)  # json.loads is strict
    assert finished >= 4, f"only {finished}/8 finished within max_tokens"
