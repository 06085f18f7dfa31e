"""The metrics an inference gateway's endpoint picker reads to choose a replica (the Gateway API Inference
Extension's model-server protocol), beside the waiting and running gauges that metrics.py sets.

- KV-cache utilization: the share of the KV cache's slots that requests hold (0..1). The cache is one row of
  max_seq_len positions per slot, reserved whole for the request in it whatever its length, so a slot is the
  unit of capacity: a new request runs at once exactly when a slot is free. Slots of finished requests that
  still hold a reusable prompt prefix (prefix_cache) count as free: the next request may take them.
- LoRA info: one series whose labels name the adapters of the running and of the waiting requests
  (comma-separated, no spaces: the picker splits on ","), and max_lora, the adapters a batch can mix (every
  loaded adapter: all of them stay resident, so none ever waits to be loaded). Its value is the Unix time at
  which those labels became current (the picker reads the series with the largest value). Only the current
  label set has a series: a mix of adapters makes a new label set at nearly every admission, and a series kept
  for each (as vLLM keeps them) would grow the metrics port without bound. Only a model that serves adapters
  has it.

Triton's metric API comes in as an argument, so that this package never imports Triton.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from .loop import Load


class _LoraInfo(NamedTuple):
    """The current LoRA info series, with the family that alone can delete it."""

    family: object  # pb_utils.MetricFamily
    series: object  # its one Metric
    key: tuple[frozenset[int], frozenset[int]]  # (running, waiting) adapter ids its labels name


class GatewayMetrics:
    def __init__(self, metric_family, labels: dict, max_slots: int, adapters=(), lora_prefix: str = ""):
        """metric_family: Triton's pb_utils.MetricFamily; adapters: the loaded LoRA adapters' names by id, each
        named in the LoRA info as lora_prefix + name (the name a request's `model` gives the picker)."""
        F = metric_family
        self._labels, self._max_slots = labels, max_slots
        self._adapters = [lora_prefix + a for a in adapters]
        self._kv_family = F(
            name="specgram_kv_cache_usage",
            description="Share of the KV cache's slots held by running requests (0..1)",
            kind=F.GAUGE,
        )
        self.kv_usage = self._kv_family.Metric(labels=labels)
        self._kv_published: float | None = None
        self._family = F
        self._lora: _LoraInfo | None = None

    def lora_labels(self, load: Load) -> dict:
        def names(ids) -> str:
            return ",".join(sorted(self._adapters[i] for i in ids))

        return {
            **self._labels,
            "max_lora": str(len(self._adapters)),
            "running_lora_adapters": names(load.running_adapters),
            "waiting_lora_adapters": names(load.waiting_adapters),
        }

    def publish(self, load: Load) -> None:
        """Set what changed (each set is a round trip to the server process)."""
        usage = load.running / self._max_slots
        if usage != self._kv_published:
            self.kv_usage.set(usage)
            self._kv_published = usage
        if not self._adapters:
            return
        key = (load.running_adapters, load.waiting_adapters)
        if self._lora is not None and self._lora.key == key:
            return
        # Triton's Python backend deletes a series only with its family (a family holds every series it made), so
        # each label set gets a family of its own. The new series is set before the old family goes: the port never
        # lacks a current series (for that moment it holds two, and the newer has the larger value).
        family = self._family(
            name="specgram_lora_requests_info",
            description="LoRA adapters of the running and waiting requests (labels); value: time of the change",
            kind=self._family.GAUGE,
        )
        series = family.Metric(labels=self.lora_labels(load))
        series.set(time.time())
        self._lora = _LoraInfo(family, series, key)  # the old family, unreferenced now, deletes its series as it goes
