"""The endpoint picker's metrics (serving/gateway.py) from the engine's load: the KV cache's share in use, and
the LoRA info series in the label form the picker parses (vLLM's): only the current label set's, however many
label sets the load goes through."""

import random
import time
from collections import deque
from types import SimpleNamespace

from specgram.request import RequestOutput
from specgram.serving.gateway import GatewayMetrics
from specgram.serving.loop import Load
from specgram.serving.metrics import Metrics
from specgram.wire import FinishReason

from . import fake_pb_utils as pb


def series(name, model):
    """The series of `name` on the metrics port with label model=`model`."""
    return [m for m in pb.on_port(name) if m.labels.get("model") == model]


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
    [now] = series("specgram_lora_requests_info", model)  # the superseded label set's series is gone
    assert now.labels["running_lora_adapters"] == "chat" and now.value() > set_at
    time.sleep(0.01)
    g.publish(busy)  # a label set seen before is current again: a series of its own again, with the newest time
    [again] = series("specgram_lora_requests_info", model)
    assert again.labels == info.labels and again.value() > now.value()


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


ADAPTERS = ["sql", "chat", "json", "code", "math"]


def lora_traffic(n_requests: int, slots: int, seed: int = 0):
    """A mixed-adapter workload's load changes: each of n_requests arrives (adapter index, or -1 for the base
    model), waits for one of `slots` slots, runs and finishes, in a random interleaving. Yields (Load, the
    request that just finished or None) after every arrival and every end."""
    rng = random.Random(seed)
    waiting: deque[tuple[int, int]] = deque()  # (request id, adapter)
    running: list[tuple[int, int]] = []
    arrived = 0
    while arrived < n_requests or waiting or running:
        ended = None
        if arrived < n_requests and (not running or rng.random() < 0.55):
            waiting.append((arrived, rng.randrange(-1, len(ADAPTERS))))
            arrived += 1
        else:
            ended = running.pop(rng.randrange(len(running)))
        while waiting and len(running) < slots:
            running.append(waiting.popleft())
        load = Load(
            waiting=len(waiting),
            running=len(running),
            running_adapters=frozenset(a for _, a in running if a >= 0),
            waiting_adapters=frozenset(a for _, a in waiting if a >= 0),
        )
        yield load, ended


def test_a_thousand_mixed_adapter_requests_leave_one_lora_info_series():
    """The LoRA info holds the current label set only: through 1,000 requests of five adapters and the base model
    (dozens of label sets, hundreds of changes between them), the family keeps one series on the port, naming
    exactly the adapters that run and wait, newer with each change; the per-adapter counters count every
    request."""
    model = "lora-bounded"
    metrics = Metrics(pb.MetricFamily, {"model": model}, 4, 8, "native", ADAPTERS)
    label_sets, current, changes, last_value = set(), None, 0, 0.0
    finished = {a: 0 for a in ["none", *ADAPTERS]}
    for load, ended in lora_traffic(1000, slots=8):
        metrics.publish(load, up=True)
        [info] = series("specgram_lora_requests_info", model)
        named = {k: set(filter(None, info.labels[f"{k}_lora_adapters"].split(","))) for k in ("running", "waiting")}
        assert named["running"] == {ADAPTERS[a] for a in load.running_adapters}
        assert named["waiting"] == {ADAPTERS[a] for a in load.waiting_adapters}
        assert info.value() >= last_value
        last_value = info.value()
        labels = (info.labels["running_lora_adapters"], info.labels["waiting_lora_adapters"])
        changes += bool(label_sets) and labels != current
        current = labels
        label_sets.add(labels)
        if ended is not None:
            adapter = ADAPTERS[ended[1]] if ended[1] >= 0 else None
            st = SimpleNamespace(lora_name=adapter, arrived=time.monotonic(), first_token_at=None)
            out = RequestOutput(ended[0], [7], "x", finished=True, finish_reason=FinishReason.LENGTH)
            metrics.record(st, out)
            finished[adapter or "none"] += 1
    # the labels must change often for the bound to mean anything (a series per label set would be dozens)
    assert len(label_sets) > 50 and changes > 300
    assert sum(finished.values()) == 1000
    for adapter, count in finished.items():
        [counter] = [m for m in series("specgram_lora_requests_total", model) if m.labels["adapter"] == adapter]
        assert counter.value() == count
    [idle] = series("specgram_lora_requests_info", model)
    assert idle.labels["running_lora_adapters"] == idle.labels["waiting_lora_adapters"] == ""
    metrics.release()
    assert not series("specgram_lora_requests_info", model)
