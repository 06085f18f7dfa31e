"""Readiness that tells the truth, through a real tritonserver. Explicit model control (the mode the fleet manifests
run): once the engine stops on an internal error (injected here into its step), the model reports not ready within a
second, Triton's server readiness with it, new requests are refused at once, and a load of the model brings a new
instance that serves the same greedy output as before. Default model control (none), where a model cannot unload
itself and stays READY: a stopped engine, and grammar compile workers that cannot restart, each get every new
request refused within a second (UNAVAILABLE, naming what failed) and specgram_engine_up 0, and the server lives
on."""

import re
import time

import pytest
import requests
from collect import errors_of, ids_of, stream_infer
from triton_server import REPO, TritonServer, metric_total, model_repository_with

REQUEST = {"text_input": "Name a colour.", "max_tokens": 8, "ignore_eos": True}
CLOSE = {"Connection": "close"}  # no idle HTTP connection for the server to wait out when it stops

# The served model.py with two changes: its engine's step raises while the trigger file exists, and its grammar
# compile pool reports what it reports once its workers keep failing to start while the grammar trigger exists.
# The model repository is the test's own; nothing in the shipped model knows about it.
FAILING_MODEL = """
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("served_llm_model", {model!r})
_served = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_served)
TRIGGER = Path({trigger!r})
GRAMMAR_TRIGGER = Path({grammar_trigger!r})


class TritonPythonModel(_served.TritonPythonModel):
    def initialize(self, args):
        super().initialize(args)
        step = self.engine.step

        def failing_step():
            if TRIGGER.exists():
                raise RuntimeError("injected engine failure")
            return step()

        self.engine.step = failing_step
        pool = self.engine.grammar.pool
        served_pool = type(pool)

        class BreakablePool(served_pool):
            @property
            def broken(self):
                if GRAMMAR_TRIGGER.exists():
                    return "grammar compile workers keep failing to start (see the server log)"
                return served_pool.broken.fget(self)

        pool.__class__ = BreakablePool
"""


def failing_repository(tmp_path):
    """(a model repository whose model fails on the triggers, the engine's trigger, the grammar pool's trigger)."""
    repo = model_repository_with({}, tmp_path / "repository")
    version = repo / "llm" / "1"
    version.unlink()  # a link to the served version folder: this one holds the failing model.py instead
    version.mkdir()
    trigger, grammar_trigger = tmp_path / "fail-the-engine", tmp_path / "break-the-grammar-workers"
    served = REPO / "model_repository" / "llm" / "1" / "model.py"
    (version / "model.py").write_text(
        FAILING_MODEL.format(model=str(served), trigger=str(trigger), grammar_trigger=str(grammar_trigger))
    )
    return repo, trigger, grammar_trigger


@pytest.fixture
def failing_server(tmp_path):
    """(an explicit-mode tritonserver whose model's engine fails while `trigger` exists, trigger)."""
    repo, trigger, _ = failing_repository(tmp_path)
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
    # HTTP says which: 400 from the model (the generate endpoint answers any error a model sends with 400, its
    # code aside), 404 (NOT_FOUND) from Triton once the model is unloaded
    assert generate.status_code in (400, 404), generate.text
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


def engine_up(server) -> float:
    return metric_total(requests.get(server.metrics_url, timeout=10, headers=CLOSE).text, "specgram_engine_up")


def wait_for_engine_up(server, value: float, since: float) -> None:
    """specgram_engine_up reads `value` within a second of `since` (the gauges follow within 50 ms)."""
    while engine_up(server) != value and time.monotonic() - since < 5:
        time.sleep(0.02)
    assert engine_up(server) == value, f"specgram_engine_up never read {value}"
    assert time.monotonic() - since < 1.0, f"specgram_engine_up read {value} only after a second"


def assert_refused_at_once(server, needle: str) -> None:
    """A new request, plain or guided, is refused within a second naming `needle`, over a gRPC stream and over
    HTTP's generate endpoint (which answers any error a model sends with 400: the error's code, UNAVAILABLE, is
    the adapter's, tested in tests/unit/test_triton_adapter.py)."""
    guided = {**REQUEST, "guided_decoding_guide_type": "regex", "guided_decoding_guide": "[ab]+"}
    for inputs in (REQUEST, guided):
        t0 = time.monotonic()
        refused = stream_infer(server.grpc_url, inputs, timeout=60)
        assert time.monotonic() - t0 < 1.0 and not ids_of(refused), refused
        [error] = errors_of(refused)
        assert needle in error, error
    t0 = time.monotonic()
    generate = requests.post(
        f"{server.http_url}/v2/models/llm/generate",
        json={"text_input": "Hi", "max_tokens": 2},
        timeout=10,
        headers=CLOSE,
    )
    assert time.monotonic() - t0 < 1.0 and generate.status_code == 400 and needle in generate.text, generate.text


def test_without_model_control_a_failed_engine_stays_ready_refusing_at_once_with_engine_up_0(tmp_path):
    """Default model control: the model cannot unload itself, so it does not ask (a refused unload can crash the
    server) and stays READY; the refusals and specgram_engine_up are what a load balancer sees: broken grammar
    workers first (taken back, to go on), then a stopped engine."""
    repo, trigger, grammar_trigger = failing_repository(tmp_path)
    with TritonServer(model_repository=repo, log_path=tmp_path / "tritonserver.log") as server:
        first = stream_infer(server.grpc_url, REQUEST, timeout=60)
        assert not errors_of(first) and len(ids_of(first)) == 8
        wait_for_engine_up(server, 1, time.monotonic())

        grammar_trigger.touch()
        wait_for_engine_up(server, 0, time.monotonic())
        assert_refused_at_once(server, "grammar compile workers keep failing to start")
        assert ready(server) == (200, 200)  # Triton's view: the model stays READY outside explicit control

        grammar_trigger.unlink()  # the injection taken back: the same test says up again
        wait_for_engine_up(server, 1, time.monotonic())
        again = stream_infer(server.grpc_url, REQUEST, timeout=60)
        assert not errors_of(again) and ids_of(again) == ids_of(first)

        trigger.touch()
        failed = stream_infer(server.grpc_url, REQUEST, timeout=60)
        failed_at = time.monotonic()
        assert "injected engine failure" in " ".join(errors_of(failed)), failed
        wait_for_engine_up(server, 0, failed_at)
        assert_refused_at_once(server, "engine stopped")
        assert ready(server) == (200, 200)

        log = server.log_tail(400)
        assert "grammar compile workers keep failing to start" in log and "restart the server" in log, log
        assert "unloaded itself" not in log and "unload is not allowed" not in log, log
    assert not re.search(r"Signal \((6|11)\)|Segfault|tcache|double free", server.log_tail(400))
