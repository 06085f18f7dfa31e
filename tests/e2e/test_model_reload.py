"""Model management in explicit model-control mode: reloading the model while the server runs (the new instance
loads before the old one unloads) serves the requests after it and stops cleanly, twice in a row. Metrics keep
one series per instance, so the old instance's unload frees nothing the new one uses."""

import re
import time

import pytest
import requests
from collect import errors_of, ids_of, stream_infer
from triton_server import TritonServer, model_repository_with

REQUEST = {"text_input": "Name a colour.", "max_tokens": 8, "ignore_eos": True}
CLOSE = {"Connection": "close"}  # no idle HTTP connection for the server to wait out when it stops


def instances(server) -> set[str]:
    """The instance labels of the token counter's series on the metrics port."""
    metrics = requests.get(server.metrics_url, timeout=30, headers=CLOSE).text
    return set(re.findall(r'specgram_generated_tokens_total\{[^}]*instance="([^"]+)"', metrics))


def wait_for(condition, polls: int = 600) -> bool:
    """condition() within polls x 0.1 s (the old instance unloads after the load call returns)."""
    for _ in range(polls):
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def explicit_server(tmp_path):
    repo = model_repository_with({}, tmp_path / "repository")
    with TritonServer(
        model_repository=repo,
        log_path=tmp_path / "tritonserver.log",
        extra_args=["--model-control-mode=explicit", "--load-model=llm"],
    ) as server:
        yield server, repo


def test_reloading_the_model_serves_on_and_stops_cleanly(explicit_server):
    server, repo = explicit_server
    first = stream_infer(server.grpc_url, REQUEST, timeout=60)
    assert not errors_of(first) and len(ids_of(first)) == 8
    config = repo / "llm" / "config.pbtxt"
    for i in range(2):
        # a changed setting: load reloads the model
        config.write_text(
            re.sub(
                r'(key: "max_waiting_requests", value: \{ string_value: ")[^"]*', rf"\g<1>{40 + i}", config.read_text()
            )
        )
        r = requests.post(f"{server.http_url}/v2/repository/models/llm/load", timeout=300, headers=CLOSE)
        assert r.status_code == 200, r.text
        after = stream_infer(server.grpc_url, REQUEST, timeout=60)
        assert not errors_of(after) and ids_of(after) == ids_of(first)
        assert wait_for(lambda: len(instances(server)) == 1), instances(server)  # the old one's left with it
    process = server.process
    server.stop()
    log = server.log_tail(400)
    assert process.returncode == 0, log
    assert not re.search(r"Signal \((6|11)\)|tcache|double free", log), log
    assert log.count("successfully unloaded 'llm'") >= 2, log
