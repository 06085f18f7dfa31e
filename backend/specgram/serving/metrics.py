"""The Prometheus metrics a model instance exports on the server's metrics port (next to Triton's own nv_*).

Triton's metric API comes in as an argument, so that this package never imports Triton.
"""

from __future__ import annotations

import gc
import time

from ..request import RequestOutput
from ..wire import BRANCH_SOURCES, ErrorKind, FinishReason, draft_sources
from .gateway import GatewayMetrics
from .loop import Load

_TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
_LATENCY_BUCKETS = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0]
_TPOT_BUCKETS = [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0]


class BySource(dict):
    """source -> its counter, made on first use: a drafter's tag declared after the metrics were built counts too."""

    def __init__(self, make):
        super().__init__()
        self.make = make  # source -> a new counter series

    def __missing__(self, source: str):
        self[source] = series = self.make(source)
        return series


class Metrics:
    """Custom Prometheus metrics on the server's metrics port (next to Triton's own nv_* metrics)."""

    def __init__(
        self, metric_family, labels: dict, max_draft_len: int, max_slots: int, forward: str, adapters=(), lora_prefix=""
    ):
        """metric_family: Triton's pb_utils.MetricFamily (passed in: this package never imports Triton).
        forward: the target's forward implementation ("native" C kernels or "torch"), exported as a gauge so that
        a silent fall-back to the slower path shows on the metrics port. adapters: the LoRA adapters' names, each
        with its own request and token counters (and a gauge listing it); lora_prefix: before each adapter's name in
        the LoRA info an inference gateway's picker reads (gateway.py)."""
        F = metric_family
        self._families = []  # a MetricFamily must outlive its Metrics: keep every family referenced

        def family(name, doc, kind):
            self._families.append(F(name=name, description=doc, kind=kind))
            return self._families[-1]

        counter = lambda name, doc: family(name, doc, F.COUNTER).Metric(labels=labels)  # noqa: E731
        self.drafted = counter("specgram_draft_tokens_total", "Draft tokens proposed to the target")
        self.accepted = counter("specgram_accepted_draft_tokens_total", "Draft tokens the target accepted")
        self.generated = counter("specgram_generated_tokens_total", "Output tokens committed")
        self.prompt = counter("specgram_prompt_tokens_total", "Prompt tokens of finished requests")
        self.reused = counter(
            "specgram_prompt_tokens_reused_total",
            "Prompt tokens of finished requests whose KV was reused from the cache (prefix_cache)",
        )
        finished = family("specgram_requests_total", "Finished requests by finish reason", F.COUNTER)
        self.requests = {
            reason: finished.Metric(labels={**labels, "finish_reason": reason.value}) for reason in FinishReason
        }
        errors = family(
            "specgram_request_errors_total",
            "Requests that ended with an error, by kind (invalid: the "
            "request's fault; unavailable: refused at capacity or shutting down; internal: a server "
            "failure)",
            F.COUNTER,
        )
        self.errors = {kind: errors.Metric(labels={**labels, "kind": kind.value}) for kind in ErrorKind}

        def by_source(name, doc):  # source -> counter: every source declared now, a later one's on first use
            fam = family(name, doc, F.COUNTER)
            series = BySource(lambda s: fam.Metric(labels={**labels, "source": s}))
            for s in draft_sources() + BRANCH_SOURCES:
                series[s] = series.make(s)
            return series

        self.drafted_by = by_source(
            "specgram_draft_tokens_by_source_total", "Draft tokens proposed to the target, by source"
        )
        self.accepted_by = by_source(
            "specgram_accepted_draft_tokens_by_source_total", "Draft tokens the target accepted, by source"
        )

        def histogram(name, doc, buckets):
            return family(name, doc, F.HISTOGRAM).Metric(labels=labels, buckets=buckets)

        per_step = [float(k) for k in range(max_draft_len + 1)]  # 0 .. max_draft_len draft tokens
        self.draft_len = histogram(
            "specgram_draft_tokens_per_step",
            "Draft tokens verified per decode step (0 included: the chosen k)",
            per_step,
        )
        self.accepted_len = histogram(
            "specgram_accepted_drafts_per_step", "Draft tokens accepted per speculative verify step", per_step
        )
        self.branches = histogram(  # trees of drafts (speculation/trees.py)
            "specgram_tree_branch_drafts_per_step", "Branch drafts (off the line) per speculative step", per_step
        )
        deep = [float(d) for d in range(2 * max_draft_len + 1)]
        self.depth = histogram("specgram_tree_depth_per_step", "Deepest draft per speculative step", deep)
        self.branch_taken = counter(
            "specgram_tree_branch_taken_total", "Speculative steps whose accepted drafts left the line for a branch"
        )
        self.ttft = histogram(
            "specgram_time_to_first_token_seconds",
            "Time from request arrival to its first output token",
            _TTFT_BUCKETS,
        )
        self.latency = histogram(
            "specgram_e2e_request_latency_seconds",
            "Time from request arrival to its final response (requests that produced output)",
            _LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            "specgram_time_per_output_token_seconds",
            "Per request: time from its first output token to its last, over the tokens after the first",
            _TPOT_BUCKETS,
        )
        self.queue = histogram(
            "specgram_request_queue_time_seconds",
            "Time from request arrival to its KV slot (requests that got one)",
            _LATENCY_BUCKETS,
        )
        gauge = lambda name, doc: family(name, doc, F.GAUGE).Metric(labels=labels)  # noqa: E731
        self.gauges = (  # in the order of publish()'s values
            gauge("specgram_requests_waiting", "Requests waiting for a KV slot (bounded by max_waiting_requests)"),
            gauge("specgram_requests_running", "Requests holding a KV slot (KV slots in use)"),
            gauge("specgram_requests_compiling_grammar", "Waiting requests whose grammar is still compiling"),
            gauge(
                "specgram_engine_up",
                "1 while the engine serves; 0 once it cannot (it stopped on an internal error, or its grammar "
                "compile workers cannot restart): every new request is then refused",
            ),
        )
        self.published: tuple | None = None

        def by_adapter(name, doc):  # adapter name ("none": the base model) -> counter
            fam = family(name, doc, F.COUNTER)
            return {a: fam.Metric(labels={**labels, "adapter": a}) for a in ["none", *adapters]}

        self.lora_requests = by_adapter(
            "specgram_lora_requests_total", "Finished requests by LoRA adapter (none: the base)"
        )
        self.lora_tokens = by_adapter("specgram_lora_generated_tokens_total", "Output tokens committed by LoRA adapter")
        listed = family(
            "specgram_lora_adapter", "1 for each LoRA adapter this model serves (adapter: its name)", F.GAUGE
        )
        self.lora_listed = [listed.Metric(labels={**labels, "adapter": a}) for a in adapters]
        for m in self.lora_listed:
            m.set(1)
        gauge("specgram_kv_slots", "KV cache slots (max_slots): the most requests that run at once").set(max_slots)
        self.gateway = GatewayMetrics(F, labels, max_slots, adapters, lora_prefix)  # what a gateway's picker reads
        family(
            "specgram_forward", "1 for the forward implementation the target runs (kind: native or torch)", F.GAUGE
        ).Metric(labels={**labels, "kind": forward}).set(1)

    def publish(self, load: Load, up: bool) -> None:
        """Set the gauges whose value changed. up: whether the engine can serve (not EngineLoop.down())."""
        values = (load.waiting, load.running, load.compiling, int(up))
        for gauge, value, before in zip(self.gauges, values, self.published or (None,) * len(values), strict=True):
            if value != before:
                gauge.set(value)
        self.published = values
        self.gateway.publish(load)

    def release(self) -> None:
        """Destroy every metric and family now. Left to the end of the process, the stub destroys them inside its
        own destructor, after its shared memory is gone, and crashes (a segfault at every server stop)."""
        vars(self).clear()
        gc.collect()

    def record(self, st, out: RequestOutput) -> None:
        """st: the request's stream state (`arrived`, `first_token_at`: monotonic seconds, the second set here;
        `lora_name`: its adapter, None for the base model)."""
        adapter = st.lora_name or "none"
        if out.token_ids:
            self.generated.increment(len(out.token_ids))
            if adapter in self.lora_tokens:
                self.lora_tokens[adapter].increment(len(out.token_ids))
            if st.first_token_at is None:
                st.first_token_at = time.monotonic()
                self.ttft.observe(st.first_token_at - st.arrived)
        if out.finished:
            if st.first_token_at is not None:  # it produced output (not refused, failed or cut first)
                now = time.monotonic()
                self.latency.observe(now - st.arrived)
                if out.num_output_tokens > 1:
                    self.tpot.observe((now - st.first_token_at) / (out.num_output_tokens - 1))
            if out.queue_s is not None:
                self.queue.observe(out.queue_s)
            reason = out.finish_reason or FinishReason.ERROR
            self.requests[reason].increment(1)
            if adapter in self.lora_requests:  # an unknown name's request was refused: not counted by name
                self.lora_requests[adapter].increment(1)
            if reason == FinishReason.ERROR:
                self.errors[out.error_kind or ErrorKind.INTERNAL].increment(1)
            self.prompt.increment(out.num_input_tokens)
            self.reused.increment(out.num_cached_tokens)
            spec = out.spec
            if spec is not None and spec.drafted:
                self.drafted.increment(spec.drafted)
                self.accepted.increment(spec.accepted)
                for accepted, steps in enumerate(spec.accepted_hist):
                    for _ in range(steps):
                        self.accepted_len.observe(float(accepted))
                for source, (drafted, accepted) in spec.by_source.items():
                    self.drafted_by[source].increment(drafted)
                    self.accepted_by[source].increment(accepted)
                for hist, counts in ((self.branches, spec.branch_hist), (self.depth, spec.depth_hist)):
                    for value, steps in enumerate(counts):
                        for _ in range(steps):
                            hist.observe(float(value))
                self.branch_taken.increment(spec.branch_taken)
            if spec is not None:
                for k, steps in enumerate(spec.k_hist):
                    for _ in range(steps):
                        self.draft_len.observe(float(k))
