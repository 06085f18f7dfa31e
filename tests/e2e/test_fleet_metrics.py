"""The metrics an inference gateway's endpoint picker reads, scraped off the real tritonserver's metrics port
under load: requests waiting, requests running and the KV cache's share in use must match what the engine holds
(max_slots requests running, the rest waiting), and fall back to 0 once the load is gone."""

import threading
import time

import requests
from stream_client import build_inputs
from triton_server import metric_total

LONG = {"text_input": "Tell a long story.", "stream": True, "ignore_eos": True, "max_tokens": 1500}
SLOTS = 8  # max_slots in config.pbtxt
EXTRA = 3  # requests beyond the slots: they wait
PICKER = ("specgram_requests_waiting", "specgram_requests_running", "specgram_kv_cache_usage")


def scrape(server) -> tuple[dict[str, float], str]:
    text = requests.get(server.metrics_url, timeout=30, headers={"Connection": "close"}).text
    return {name: metric_total(text, name, model="llm") for name in PICKER}, text


def wait_for(server, expected: dict[str, float]) -> str:
    """The gauges follow the load within 50 ms: poll for up to two minutes; -> the last scrape."""
    for _ in range(480):
        values, text = scrape(server)
        if values == expected:
            return text
        time.sleep(0.25)
    assert scrape(server)[0] == expected


def test_a_loaded_server_reports_waiting_running_and_kv_cache_usage(triton_server):
    import tritonclient.grpc as grpcclient

    idle = wait_for(triton_server, {PICKER[0]: 0, PICKER[1]: 0, PICKER[2]: 0})  # an earlier test's may be ending
    assert "specgram_lora_requests_info" not in idle  # the served model has no LoRA adapters
    client, lock = grpcclient.InferenceServerClient(triton_server.grpc_url), threading.Lock()
    responded, errors = set(), []

    def callback(result, error):  # the errors of the cancellation at the end come here too
        with lock:
            if error is not None:
                errors.append(error)
            else:
                responded.add(result.get_response().id)

    client.start_stream(callback=callback)
    try:
        for i in range(SLOTS + EXTRA):
            client.async_stream_infer("llm", build_inputs(LONG), request_id=str(i))
        text = wait_for(triton_server, {PICKER[0]: EXTRA, PICKER[1]: SLOTS, PICKER[2]: 1.0})
        assert metric_total(text, "specgram_kv_slots", model="llm") == SLOTS
        for _ in range(100):  # the gauges may be set just before the last first tokens are sent
            with lock:
                if len(responded) >= SLOTS:
                    break
            time.sleep(0.05)
        with lock:
            assert not errors and len(responded) == SLOTS, (errors, responded)  # only those holding a slot stream
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    wait_for(triton_server, {PICKER[0]: 0, PICKER[1]: 0, PICKER[2]: 0})
