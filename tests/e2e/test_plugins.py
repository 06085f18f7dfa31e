"""Drafter plug-ins served by a real tritonserver: a config.pbtxt names tests/plugins' modules (a free drafter and a
forward one, outside the engine package, and the same two declared likely) in `drafter_plugins`. Requests that
name them are served with their drafts, tagged with their sources in `spec_detail` and counted under those
sources in the metrics; their declared priors are the ones in effect: under num_draft_tokens auto, once the step
costs are measured, the drafters declared never accepted (prior 0) get no draft verified and the same drafters
declared likely (0.9) do, though the request rejects every one of their drafts."""

from __future__ import annotations

import json
import os
import time

import pytest
import requests
from collect import errors_of, ids_of, last_value, stream_infer
from triton_server import REPO, TritonServer, metric_total, model_repository_with

from tests.plugins import TOKEN, forward, free, likely

NAMES = (free.NAME, forward.NAME)  # prior 0
LIKELY = (likely.FREE, likely.FORWARD)  # the same drafters, prior 0.9
PROMPT = "abcabc abcabc abc"
BAN = json.dumps({str(TOKEN): -100})  # every plug-in draft is then rejected
MAX_TOKENS = 12  # under 16: no probe of a drafter that drafted nothing (acceptance.PROBE_AFTER)


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins-e2e")
    # the served model, not a tiny one: its steps stream its weights, so that one more verify row costs a few
    # percent of a step and a likely draft pays (a tiny model's rows cost nearly what whole steps do: no prior
    # would make auto k draft); no copy of it (draft_quantization none): the plug-ins are the only models
    settings = {
        "drafter_plugins": "tests.plugins.free, tests.plugins.forward, tests.plugins.likely",
        "max_draft_len": "4",
        "draft_quantization": "none",
    }
    server = TritonServer(
        model_repository=model_repository_with(settings, root / "repo"), model="llm", log_path=root / "tritonserver.log"
    )
    with pytest.MonkeyPatch.context() as env:  # the plug-ins are importable where the server's Python looks
        env.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
        server.start()
    try:
        yield server
    finally:
        server.stop()


def _run(server, k: int, drafter: str | None = None):
    inputs = {"text_input": PROMPT, "stream": True, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    inputs.update(num_draft_tokens=k, sampling_parameters=json.dumps({"logit_bias": BAN}))
    if drafter is not None:
        inputs["drafter"] = drafter
    responses = stream_infer(server.grpc_url, inputs)
    assert not errors_of(responses), errors_of(responses)
    sources = json.loads(last_value(responses, "spec_detail"))["sources"]
    return ids_of(responses), sources


def _metric(server, name: str, source: str, at_least: float) -> float:
    """The model's counter of `source`, once it reaches at_least (the sender thread counts a request as it sends
    its final response), or as it stands after a few seconds."""
    deadline, value = time.monotonic() + 5, 0.0
    while time.monotonic() < deadline:
        value = metric_total(requests.get(server.metrics_url, timeout=10).text, name, model="llm", source=source)
        if value >= at_least:
            break
        time.sleep(0.1)
    return value


def test_plugin_drafters_serve_under_their_own_sources(plugin_server):
    plain, _ = _run(plugin_server, 0)
    for name in NAMES:
        ids, sources = _run(plugin_server, 3, name)  # a fixed k: every draft is verified
        assert ids == plain, name  # drafts change no token
        assert sources[name]["drafted"] > 0 and sources[name]["accepted"] == 0, (name, sources)
        drafted = _metric(plugin_server, "specgram_draft_tokens_by_source_total", name, sources[name]["drafted"])
        assert drafted >= sources[name]["drafted"], (name, drafted)


def test_plugin_priors_are_in_effect_under_auto(plugin_server):
    plain, _ = _run(plugin_server, 0)  # decode steps: the step costs are measured from here on
    drafted = {}
    for name in NAMES + LIKELY:
        ids, sources = _run(plugin_server, -1, name)
        assert ids == plain, name
        drafted[name] = sources.get(name, {}).get("drafted", 0)
    assert all(drafted[n] == 0 for n in NAMES) and all(drafted[n] > 0 for n in LIKELY), drafted
