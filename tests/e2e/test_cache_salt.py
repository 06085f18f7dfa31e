"""cache_salt through the real tritonserver: requests with different salts never share the prefix cache's keys and
values nor the suffix store's outputs (the mechanisms behind a faster first token and more accepted drafts), and
output never depends on either."""

import json
import uuid

from collect import errors_of, ids_of, last_value, stream_infer

PROMPT = "Name three colours of the sea at dawn, one per line."


def run(server, salt, k, **extra):
    return stream_infer(
        server.grpc_url,
        {
            "text_input": PROMPT,
            "apply_chat_template": True,
            "stream": True,
            "max_tokens": 32,
            "num_draft_tokens": k,
            "cache_salt": salt,
            **extra,
        },
    )


def suffix_counts(responses) -> tuple[int, int]:
    counts = json.loads(last_value(responses, "spec_detail"))["sources"].get("suffix", {})
    return counts.get("drafted", 0), counts.get("accepted", 0)


def test_salts_keep_the_prefix_cache_and_the_suffix_store_apart(triton_server):
    a, b = (f"{name}-{uuid.uuid4().hex}" for name in ("tenant-a", "tenant-b"))  # no other test's traffic has them
    first = run(triton_server, a, 0)  # tenant a's prompt enters the prefix cache, its output the suffix store
    other = run(triton_server, b, 4, drafter="suffix")
    again = run(triton_server, a, 4, drafter="suffix")
    assert not errors_of(first) and not errors_of(other) and not errors_of(again)
    assert ids_of(other) == ids_of(again) == ids_of(first)
    assert suffix_counts(other) == (0, 0)  # tenant b never drafts from tenant a's output
    assert suffix_counts(again)[1] > 0  # tenant a does, from its own
    assert last_value(other, "num_cached_tokens") == 0  # nor reuses its prompt's keys and values
    assert last_value(again, "num_cached_tokens") > 0
    repeat = run(triton_server, b, 4, drafter="suffix")  # tenant b's own traffic serves tenant b
    assert ids_of(repeat) == ids_of(first) and suffix_counts(repeat)[1] > 0


def test_a_bad_salt_fails_its_request_alone(triton_server):
    bad = run(triton_server, "x" * 300, 0)
    assert errors_of(bad) and "cache_salt" in errors_of(bad)[0]
    assert not errors_of(run(triton_server, "fine", 0))
