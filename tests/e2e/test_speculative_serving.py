"""Speculation through the real tritonserver: exact greedy output, consistent statistics, metrics."""
import requests
from collect import errors_of, ids_of, last_value, stream_infer

EXTRACT = ("Copy this record as JSON with keys name, city, year: name Ada Lovelace, city London, year 1815. "
           "Then copy it again.")


def run(server, k, max_tokens=40, **extra):
    return stream_infer(server.grpc_url, {"text_input": EXTRACT, "apply_chat_template": True, "stream": True,
                                          "max_tokens": max_tokens, "num_draft_tokens": k, **extra})


def test_greedy_output_identical_with_and_without_speculation(triton_server):
    plain = run(triton_server, 0)
    spec = run(triton_server, 4)
    assert not errors_of(plain) and not errors_of(spec)
    assert ids_of(spec) == ids_of(plain)
    drafted = last_value(spec, "spec_drafted_tokens")
    accepted = last_value(spec, "spec_accepted_tokens", 0)
    assert drafted > 0 and 0 <= accepted <= drafted
    assert abs(last_value(spec, "spec_acceptance_rate", 0.0) - accepted / drafted) < 1e-6
    assert last_value(spec, "num_output_tokens") == len(ids_of(spec))
    if accepted:   # accepted drafts arrive together: fewer responses than tokens
        assert len(spec) < len(plain)
        assert max(len(r["outputs"].get("output_ids", [])) for r in spec) > 1


def test_speculation_metrics_on_the_metrics_port(triton_server):
    run(triton_server, 3, max_tokens=16)
    text = requests.get(triton_server.metrics_url, timeout=30).text
    for name in ("specgram_draft_tokens_total", "specgram_accepted_draft_tokens_total",
                 "specgram_generated_tokens_total", "specgram_accepted_drafts_per_step_bucket",
                 "specgram_time_to_first_token_seconds_count", "specgram_requests_total"):
        assert name in text, name
    drafted = [line for line in text.splitlines() if line.startswith("specgram_draft_tokens_total")]
    assert drafted and float(drafted[0].split()[-1]) > 0
