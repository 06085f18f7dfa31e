"""Readiness that tells the truth, through the real tritonserver in explicit model-control mode (the mode the
fleet manifests run): once the engine stops on an internal error (injected here into its step), the model
reports not ready within a second, Triton's server readiness with it, new requests are refused at once, and a
load of the model brings a new instance that serves the same greedy output as before."""

import re
import time

import pytest
import requests
from collect import errors_of, ids_of, stream_infer
from triton_server import REPO, TritonServer, model_repository_with

REQUEST = {"text_input": "Name a colour.", "max_tokens": 8, "ignore_eos": True}
CLOSE = {"Connection": "close"}  # no idle HTTP connection for the server to wait out when it stops

# The served model.py with one change: its engine's step raises while the trigger file exists. The model
# repository is the test's own; nothing in the shipped model knows about it.
FAILING_MODEL = """
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("served_llm_model", {model!r})
_served = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_served)
TRIGGER = Path({trigger!r})


class TritonPythonModel(_served.TritonPythonModel):
    def initialize(self, args):
        super().initialize(args)
        step = self.engine.step

        def failing_step():
            if TRIGGER.exists():
                raise RuntimeError("injected engine failure")
            return step()

        self.engine.step = failing_step
"""


@pytest.fixture
def failing_server(tmp_path):
    """(an explicit-mode tritonserver whose model's engine fails while `trigger` exists, trigger)."""
    repo = model_repository_with({}, tmp_path / "repository")
    version = repo / "llm" / "1"
    version.unlink()  # a link to the served version folder: this one holds the failing model.py instead
    version.mkdir()
    trigger = tmp_path / "fail-the-engine"
    served = REPO / "model_repository" / "llm" / "1" / "model.py"
    (version / "model.py").write_text(FAILING_MODEL.format(model=str(served), trigger=str(trigger)))
    with TritonServer(
        model_repository=repo,
        log_path=tmp_path / "tritonserver.log",
        extra_args=["--model-control-mode=explicit", "--load-model=llm"],
    ) as server:
        yield server, trigger


def ready(server) -> tuple[int, int]:
    """(HTTP status of the model's readiness, of the server's)."""
    model = requests.get(f"{server.http_url}/v2/models/llm/ready", timeout=10, headers=CLOSE).status_code
    return model, requests.get(f"{server.http_url}/v2/health/ready", timeout=10, headers=CLOSE).status_code


def test_a_failed_engine_makes_the_model_unready_and_a_reload_serves_again(failing_server):
    server, trigger = failing_server
    first = stream_infer(server.grpc_url, REQUEST, timeout=60)
    assert not errors_of(first) and len(ids_of(first)) == 8
    assert ready(server) == (200, 200)

    trigger.touch()
    failed = stream_infer(server.grpc_url, REQUEST, timeout=60)
    failed_at = time.monotonic()
    assert "injected engine failure" in " ".join(errors_of(failed)), failed
    while ready(server)[0] == 200 and time.monotonic() - failed_at < 5:
        time.sleep(0.02)
    assert time.monotonic() - failed_at < 1.0, "the model still reported ready a second after its engine stopped"
    assert ready(server) == (400, 400)  # the model, and with it the server (Triton's strict readiness)

    t0 = time.monotonic()
    refused = stream_infer(server.grpc_url, REQUEST, timeout=60)
    assert time.monotonic() - t0 < 1.0 and not ids_of(refused)
    [error] = errors_of(refused)
    # refused by the model until Triton has unloaded it (UNAVAILABLE), by Triton itself after that
    assert "no available versions" in error or "engine stopped" in error, error
    generate = requests.post(
        f"{server.http_url}/v2/models/llm/generate",
        json={"text_input": "Hi", "max_tokens": 2},
        timeout=10,
        headers=CLOSE,
    )
    # HTTP says which: 503 (UNAVAILABLE) from the model, 404 (NOT_FOUND) from Triton once the model is unloaded
    assert generate.status_code in (503, 404), generate.text
    assert ("no available versions" if generate.status_code == 404 else "engine stopped") in generate.text

    trigger.unlink()
    r = requests.post(f"{server.http_url}/v2/repository/models/llm/load", timeout=300, headers=CLOSE)
    assert r.status_code == 200, r.text
    assert ready(server) == (200, 200)
    after = stream_infer(server.grpc_url, REQUEST, timeout=60)
    assert not errors_of(after) and ids_of(after) == ids_of(first)
    log = server.log_tail(400)
    assert "unloaded itself" in log and "successfully unloaded 'llm'" in log, log
    assert not re.search(r"Signal \((6|11)\)|Segfault|tcache|double free", log), log
