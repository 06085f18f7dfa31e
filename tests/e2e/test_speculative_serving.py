"""Speculation through the real tritonserver: exact greedy output, consistent statistics, metrics."""

import requests
from collect import errors_of, ids_of, last_value, stream_infer, total_of

EXTRACT = (
    "Copy this record as JSON with keys name, city, year: name Ada Lovelace, city London, year 1815. "
    "Then copy it again."
)


def run(server, k, max_tokens=40, **extra):
    return stream_infer(
        server.grpc_url,
        {
            "text_input": EXTRACT,
            "apply_chat_template": True,
            "stream": True,
            "max_tokens": max_tokens,
            "num_draft_tokens": k,
            **extra,
        },
    )


def test_greedy_output_identical_with_and_without_speculation(triton_server):
    plain = run(triton_server, 0)
    spec = run(triton_server, 4)
    assert not errors_of(plain) and not errors_of(spec)
    assert ids_of(spec) == ids_of(plain)
    drafted = last_value(spec, "spec_drafted_tokens")
    accepted = last_value(spec, "spec_accepted_tokens", 0)
    assert drafted > 0 and 0 <= accepted <= drafted
    assert abs(last_value(spec, "spec_acceptance_rate", 0.0) - accepted / drafted) < 1e-6
    assert total_of(spec, "num_output_tokens") == len(ids_of(spec))
    if accepted:  # accepted drafts arrive together: fewer responses than tokens
        assert len(spec) < len(plain)
        assert max(len(r["outputs"].get("output_ids", [])) for r in spec) > 1


def test_the_served_int8_copy_drafts_and_output_stays_exact(triton_server):
    """The served default on CPU (draft_quantization auto): the target's int8 copy as the draft model, alone
    (fixed k) and beside lookup (auto k) - the target's greedy tokens either way."""
    plain = run(triton_server, 0)
    for k in (3, -1):
        spec = run(triton_server, k, drafter="draft_model")
        assert not errors_of(spec) and ids_of(spec) == ids_of(plain), k
    fixed = run(triton_server, 3, drafter="draft_model")
    assert last_value(fixed, "spec_drafted_tokens") > 0 and last_value(fixed, "spec_accepted_tokens") > 0
    assert '"draft_model"' in last_value(fixed, "spec_detail")


def test_trees_of_drafts_on_and_off_give_the_same_tokens(triton_server):
    """tree_drafts (on by default) against lines only, for the int8 copy beside lookup (auto k), a fixed k, and
    lookup alone, guided and not: the target's greedy tokens every time."""
    guide = {"guided_decoding_guide_type": "json"}
    for extra in ({}, {"drafter": "ngram"}, guide):
        for k in (-1, 4):
            plain = run(triton_server, 0, **extra)
            trees, lines = (run(triton_server, k, tree_drafts=on, **extra) for on in (True, False))
            assert not errors_of(trees) and not errors_of(lines), (extra, k)
            assert ids_of(trees) == ids_of(lines) == ids_of(plain), (extra, k)
    assert '"branch_hist"' in last_value(trees, "spec_detail")


def test_penalties_and_logprobs_are_exact_under_speculation(triton_server):
    """vLLM's penalties and logprobs through the server: the same tokens and the same logprobs with speculation on
    (auto and k = 4) and off."""
    import json

    sp = json.dumps({"repetition_penalty": 1.3, "frequency_penalty": 0.3, "logit_bias": {"28": 2.0}, "logprobs": 2})
    runs = [run(triton_server, k, max_tokens=32, sampling_parameters=sp, return_logprobs=True) for k in (0, 4, -1)]
    assert not any(errors_of(r) for r in runs)
    plain = run(triton_server, 0, max_tokens=32)
    assert ids_of(runs[0]) != ids_of(plain), "the penalties change this output"
    logprobs = [
        [row for r in rs if "logprobs" in r["outputs"] for row in json.loads(r["outputs"]["logprobs"][0])]
        for rs in runs
    ]
    assert all(ids_of(r) == ids_of(runs[0]) for r in runs)
    native = 'kind="native"' in requests.get(triton_server.metrics_url, timeout=30).text  # bitwise there
    for lp in logprobs[1:]:
        assert [list(row) for row in lp] == [list(row) for row in logprobs[0]]  # the same tokens listed
        assert (
            lp == logprobs[0]
            if native
            else all(
                abs(row[t]["logprob"] - ref[t]["logprob"]) < 1e-4
                for row, ref in zip(lp, logprobs[0], strict=True)
                for t in row
            )
        )
    assert len(logprobs[0]) == len(ids_of(runs[0])) and last_value(runs[1], "spec_drafted_tokens") > 0


def test_speculation_metrics_on_the_metrics_port(triton_server):
    run(triton_server, 3, max_tokens=16)
    text = requests.get(triton_server.metrics_url, timeout=30).text
    for name in (
        "specgram_draft_tokens_total",
        "specgram_accepted_draft_tokens_total",
        "specgram_generated_tokens_total",
        "specgram_accepted_drafts_per_step_bucket",
        "specgram_time_to_first_token_seconds_count",
        "specgram_requests_total",
        "specgram_e2e_request_latency_seconds_count",
        "specgram_time_per_output_token_seconds_count",
        "specgram_request_queue_time_seconds_count",
    ):
        assert name in text, name
    drafted = [line for line in text.splitlines() if line.startswith("specgram_draft_tokens_total")]
    assert drafted and float(drafted[0].split()[-1]) > 0


def test_seeded_sampled_output_is_the_same_for_every_draft_length_and_batch(triton_server):
    """A seeded sampled request (guided and not) through the server: the same tokens alone without speculation,
    with k = 4 and auto, and with 7 other streams in flight; another seed gives other tokens."""
    from concurrent.futures import ThreadPoolExecutor

    guide = {
        "guided_decoding_guide_type": "json_schema",
        "guided_decoding_guide": '{"type": "object", "properties": '
        '{"name": {"type": "string"}, "city": {"type": "string"}, "year": {"type": "integer"}}}',
    }
    for extra in ({}, guide):
        sampled = dict(temperature=0.9, top_p=0.95, top_k=50, seed=20261201, ignore_eos=not extra, **extra)
        solo = run(triton_server, 0, max_tokens=32, **sampled)
        assert not errors_of(solo) and len(ids_of(solo)) > 4
        for k in (4, -1):
            assert ids_of(run(triton_server, k, max_tokens=32, **sampled)) == ids_of(solo), (k, extra)
        others = [dict(sampled, seed=i) for i in range(7)]
        with ThreadPoolExecutor(8) as pool:
            crowd = list(pool.map(lambda p: run(triton_server, -1, max_tokens=32, **p), [sampled] + others))
        assert ids_of(crowd[0]) == ids_of(solo), extra
        assert any(ids_of(c) != ids_of(solo) for c in crowd[1:]), "the seed must matter"
