"""Operating the served model through the real tritonserver: Triton's per-request timeout, the load gauges on
the metrics port, and stopping the server (the last test of a session: it stops the session's server)."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from collect import errors_of, ids_of, last_value, stream_infer, total_of
from stream_client import build_inputs
from triton_server import metric_total

LONG = {"text_input": "Tell a long story.", "stream": True, "ignore_eos": True}


def gauges(server) -> dict[str, float]:
    """The specgram gauges on the metrics port: name -> value."""
    text = requests.get(server.metrics_url, timeout=30).text
    return {
        line.split("{")[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(
            ("specgram_requests_waiting", "specgram_requests_running", "specgram_kv_slots", "specgram_engine_up")
        )
    }


def test_triton_request_timeout_ends_the_stream_with_finish_reason_timeout(triton_server):
    """1500 tokens of the default model on CPU take far longer than the request's 1.5 s."""
    t0 = time.monotonic()
    resps = stream_infer(
        triton_server.grpc_url, {**LONG, "max_tokens": 1500}, request_timeout_us=1_500_000, timeout=120
    )
    assert not errors_of(resps) and resps[-1]["final"]
    assert last_value(resps, "finish_reason") == "timeout"
    assert len(ids_of(resps)) == total_of(resps, "num_output_tokens") < 1500
    assert time.monotonic() - t0 >= 1.5


def wait_for_gauge(server, name, value):
    """The gauges follow the load within 50 ms: poll for up to a minute."""
    for _ in range(240):
        if gauges(server)[name] == value:
            return
        time.sleep(0.25)
    assert gauges(server)[name] == value


def test_load_gauges_on_the_metrics_port(triton_server):
    import tritonclient.grpc as grpcclient

    before = gauges(triton_server)
    assert before["specgram_kv_slots"] == 8 and before["specgram_engine_up"] == 1  # max_slots in config.pbtxt
    text = requests.get(triton_server.metrics_url, timeout=30).text
    kinds = {k for k in ("native", "torch") if metric_total(text, "specgram_forward", kind=k) == 1}
    assert len(kinds) == 1, text  # exactly one forward implementation is reported, with value 1
    wait_for_gauge(triton_server, "specgram_requests_running", 0)  # an earlier test's request may just be ending
    assert gauges(triton_server)["specgram_requests_waiting"] == 0
    client, started = grpcclient.InferenceServerClient(triton_server.grpc_url), threading.Event()
    client.start_stream(callback=lambda result, error: started.set())
    try:
        client.async_stream_infer("llm", build_inputs({**LONG, "max_tokens": 1500}))
        assert started.wait(120)
        wait_for_gauge(triton_server, "specgram_requests_running", 1)  # 1500 tokens: far longer than that
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    wait_for_gauge(triton_server, "specgram_requests_running", 0)


@pytest.mark.stops_server
def test_stopping_the_server_mid_stream_finishes_the_stream_and_exits_cleanly(triton_server):
    """SIGTERM with a stream open: Triton lets it finish, then unloads the model; finalize() must leave the stub
    nothing that crashes on exit (its custom metrics)."""
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(
            stream_infer,
            triton_server.grpc_url,
            {**LONG, "max_tokens": 24},
            timeout=120,
            on_response=lambda r: started.set(),
        )
        assert started.wait(120)
        triton_server.stop()
        resps = stream.result()
    assert not errors_of(resps) and last_value(resps, "finish_reason") == "length" and len(ids_of(resps)) == 24
    log = Path(triton_server.log_path).read_text(errors="replace")
    assert "successfully unloaded 'llm'" in log
    for crash in ("Segfault", "Segmentation fault", "Signal (11)", "Signal (6)"):
        assert crash not in log, crash
