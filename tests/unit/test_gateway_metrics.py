"""The endpoint picker's metrics (serving/gateway.py) from the engine's load: the KV cache's share in use, and
the LoRA info series in the label form the picker parses (vLLM's), the current one with the largest value."""

import time

from specgram.serving.gateway import GatewayMetrics
from specgram.serving.loop import Load

from . import fake_pb_utils as pb


def series(name, model):
    return [m for m in pb.MetricFamily.registry.get(name, []) if m.labels.get("model") == model]


def picked(model):
    """The LoRA series the picker reads: of those naming an adapter, the one with the largest value."""
    named = [
        m
        for m in series("specgram_lora_requests_info", model)
        if m.labels["running_lora_adapters"] or m.labels["waiting_lora_adapters"]
    ]
    return max(named, key=lambda m: m.value())


def test_kv_cache_usage_is_the_share_of_slots_held():
    g = GatewayMetrics(pb.MetricFamily, {"model": "kv"}, max_slots=8)
    for running, waiting in ((0, 0), (3, 0), (8, 5), (1, 0)):
        g.publish(Load(waiting=waiting, running=running))
        assert g.kv_usage.value() == running / 8
    assert not series("specgram_lora_requests_info", "kv")  # a model without adapters has no LoRA series


def test_lora_info_names_the_running_and_waiting_adapters():
    model = "lora"
    g = GatewayMetrics(pb.MetricFamily, {"model": model}, max_slots=4, adapters=["sql", "chat", "json"])
    t0 = time.time()
    g.publish(Load())
    [first] = series("specgram_lora_requests_info", model)
    assert first.labels == {"model": model, "max_lora": "3", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert t0 <= first.value() <= time.time()
    busy = Load(waiting=2, running=3, running_adapters=frozenset({2, 0}), waiting_adapters=frozenset({1}))
    g.publish(busy)
    info = picked(model)
    assert info.labels["running_lora_adapters"] == "json,sql"  # sorted, no spaces: the picker splits on ","
    assert info.labels["waiting_lora_adapters"] == "chat"
    set_at = info.value()
    g.publish(busy)  # nothing changed: not set again
    assert info.value() == set_at
    time.sleep(0.01)
    g.publish(Load(running=1, running_adapters=frozenset({1})))
    assert picked(model).labels["running_lora_adapters"] == "chat" and picked(model).value() > set_at
    time.sleep(0.01)
    g.publish(busy)  # a label set seen before is current again: its own series, with the newest time
    assert picked(model) is info and info.value() > set_at
    assert len(series("specgram_lora_requests_info", model)) == 3


def test_lora_info_names_adapters_as_requests_name_them():
    """Behind the OpenAI frontend a request's model is llm_lora_<adapter>: the picker matches it to these names."""
    g = GatewayMetrics(pb.MetricFamily, {"model": "prefixed"}, max_slots=2, adapters=["sql"], lora_prefix="llm_lora_")
    g.publish(Load(waiting=1, running=2, running_adapters=frozenset({0}), waiting_adapters=frozenset({0})))
    labels = picked("prefixed").labels
    assert (labels["running_lora_adapters"], labels["waiting_lora_adapters"], labels["max_lora"]) == (
        "llm_lora_sql",
        "llm_lora_sql",
        "1",
    )
