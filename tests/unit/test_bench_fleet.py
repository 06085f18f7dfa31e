"""The fleet scenario's pure parts: reading a replica's metrics port (Prometheus text), the picker's rule, the two
policies, the request sequence both policies send, and the report from run records."""

import statistics
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench  # noqa: E402
from benchlib.scenarios import fleet  # noqa: E402
from benchlib.scenarios.fleet import View, parse_metrics, pick  # noqa: E402

LABELS = 'instance="llm_0_0",model="llm",version="1"'
METRICS = f"""# HELP specgram_requests_waiting Requests waiting for a KV slot (bounded by max_waiting_requests)
# TYPE specgram_requests_waiting gauge
specgram_requests_waiting{{{LABELS}}} 3
specgram_requests_waiting{{instance="x_0_0",model="other",version="1"}} 9
# TYPE specgram_requests_running gauge
specgram_requests_running{{{LABELS}}} 4
specgram_kv_cache_usage{{{LABELS}}} 1
specgram_kv_slots{{{LABELS}}} 4
# TYPE specgram_lora_requests_info gauge
specgram_lora_requests_info{{{LABELS},max_lora="3",running_lora_adapters="a1",waiting_lora_adapters="a0"}} 1.7649e+09
specgram_lora_requests_info{{{LABELS},max_lora="3",running_lora_adapters="a0,a2",waiting_lora_adapters=""}} 1.76491e+09
specgram_lora_requests_info{{{LABELS},max_lora="3",running_lora_adapters="",waiting_lora_adapters=""}} 1.7648e+09
nv_inference_count{{model="llm",version="1"}} 12
"""


def test_parse_metrics_reads_the_models_gauges_and_the_latest_lora_labels():
    v = parse_metrics(METRICS)
    assert (v.waiting, v.running, v.kv, v.max_lora) == (3, 4, 1, 3)  # the other model's 9 waiting left out
    assert v.running_adapters == {"a0", "a2"} and v.waiting_adapters == frozenset()  # the largest value's labels
    assert v.adapters == {"a0", "a2"}
    assert parse_metrics(METRICS, model="other").waiting == 9
    two = METRICS + f"specgram_requests_waiting{{{LABELS.replace('llm_0_0', 'llm_1_0')}}} 2\n"
    assert parse_metrics(two).waiting == 5  # instances add up
    bare = parse_metrics("specgram_requests_waiting 2\n")  # no labels, no LoRA series: an empty adapter set
    assert (bare.waiting, bare.adapters, bare.max_lora) == (2, frozenset(), 0)


def test_the_picker_takes_the_shortest_queue_then_a_free_slot_then_the_least_kv():
    assert pick([View(waiting=1, kv=0.25), View(waiting=0, kv=1.0)], None, -1) == 1  # the queue first
    assert pick([View(kv=1.0), View(kv=0.75)], None, -1) == 1
    assert pick([View(kv=0.5), View(kv=0.25), View(kv=0.75)], None, -1) == 1


def test_the_picker_prefers_a_replica_with_the_adapter_only_when_the_kv_is_close():
    warm = frozenset({"a0"})
    near = [View(kv=0.25), View(kv=0.5, running_adapters=warm)]
    assert pick(near, "a0", -1) == 1  # one slot more held: affinity wins
    assert pick(near, "a1", -1) == 0 and pick(near, None, -1) == 0  # another adapter, the base: the least KV
    assert pick([View(kv=0.25), View(kv=0.5, waiting_adapters=warm)], "a0", -1) == 1  # waiting ones count too
    assert pick([View(kv=0.0), View(kv=0.5, running_adapters=warm)], "a0", -1) == 0  # two slots more: too far
    assert pick([View(kv=0.75), View(kv=1.0, running_adapters=warm)], "a0", -1) == 0  # never a full one
    assert pick([View(waiting=0), View(waiting=1, running_adapters=warm)], "a0", -1) == 0  # nor a longer queue
    assert pick(near, "a0", -1, affinity_kv=-1) == 0  # affinity off


def test_the_picker_breaks_ties_in_turn_after_the_last_pick():
    same = [View(kv=0.5)] * 3
    assert [pick(same, None, last) for last in (-1, 0, 1, 2)] == [0, 1, 2, 0]
    assert pick([View(kv=0.5), View(kv=0.25), View(kv=0.25)], None, 1) == 2


def test_round_robin_turns_and_the_picker_scrapes_at_most_every_max_age(monkeypatch):
    texts = {"u0": METRICS, "u1": "specgram_requests_waiting 0\nspecgram_kv_cache_usage 0.5\n"}
    calls = []

    class Body:
        def __init__(self, url):
            calls.append(url)
            self.text = texts[url]

        def read(self):
            return self.text.encode()

    monkeypatch.setattr(fleet.urllib.request, "urlopen", lambda url, timeout: Body(url))
    f = fleet.Fleet(["u0", "u1"])
    assert [f.choose("round robin", None) for _ in range(3)] == [0, 1, 0] and not calls
    assert f.choose("picker", "a0") == 1 and calls == ["u0", "u1"]  # u0 has 3 waiting
    assert f.choose("picker", None) == 1 and len(calls) == 2  # the scrape is fresh: used again
    f.scraped_at -= 1.0
    f.choose("picker", None)
    assert len(calls) == 4
    texts["u0"] = "specgram_requests_waiting 0\n"
    f.settle(timeout=0.5)  # u1 still holds KV: waits it out
    assert len(calls) > 6
    texts["u1"] = texts["u0"]
    before = len(calls)
    f.settle(timeout=5.0)
    assert len(calls) == before + 2  # idle at once: one scrape


def test_both_policies_get_one_seeded_mixed_sequence_per_round():
    args = bench.parse(["fleet", "--prompts", "400"])
    reqs = fleet.requests(args, 0)
    assert reqs == fleet.requests(args, 0) and reqs != fleet.requests(args, 1)
    share = {a: sum(r["adapter"] == a for r in reqs) / 400 for a in (None, "a0", "a1", "a2")}
    assert all(abs(share[a] - w) < 0.08 for a, w in zip(share, fleet.MIX, strict=True)), share
    long = [r for r in reqs if r["max_tokens"] >= args.long[0]]
    assert abs(len(long) / 400 - fleet.LONG_SHARE) < 0.08
    assert all(args.short[0] <= r["max_tokens"] <= args.short[1] for r in reqs if r not in long)


def _round(policy, replica_of, latency, tokens=10):
    requests = [
        dict(
            case=i,
            replica=r,
            adapter="a0" if i % 2 else "base",
            tokens=tokens,
            pick_ms=0.1,
            ttft_s=lat / 4,
            latency_s=lat,
        )
        for i, (r, lat) in enumerate(zip(replica_of, latency, strict=True))
    ]
    return dict(policy=policy, load="c 2", wall_s=2.0, requests=requests, samples=[[(1, 1), (0, 2)]], round=0)


def test_the_report_shows_each_policy_per_replica_and_the_ratios(tmp_path):
    args = bench.parse(["fleet", "--quick", "--adapters", "1", "--concurrency", "2", "--raw", str(tmp_path)])
    recs = [
        _round("picker", [0, 1, 0, 1], [1.0, 1.0, 1.0, 1.0]),
        _round("round robin", [0, 0, 0, 1], [1.0, 2.0, 2.0, 2.0], tokens=5),
    ]
    reqs = [dict(prompt="p", adapter=None, max_tokens=args.short[0])] * 3 + [
        dict(prompt="p", adapter="a0", max_tokens=20)
    ]
    fleet.write_report(args, [reqs], recs, threads=1)
    text = (tmp_path / "report.md").read_text()
    assert "| c 2 | picker | 1.00 / 1.00 | 0.25 / 0.25 | 1.00 / 1.00 | 20.0 | 1.00 | 0.10 |" in text
    assert "| c 2 | round robin | 2.00 / 2.00 | 0.50 / 0.50 | 2.00 / 2.00 | 10.0 | 2.00 | 0.10 |" in text
    assert "| c 2 | 0.50× | 0.50× | 2.00× |" in text  # picker ÷ round robin
    assert "| c 2 | picker | 0 | 2 | 2 | 0 | 20 | 1.00 | 1.00 |" in text  # requests, base, a0, tokens, sampled
    assert "| c 2 | round robin | 0 | 3 | 2 | 1 | 15 | 1.00 | 1.00 |" in text
    assert "| c 2 | round robin | 1 | 1 | 0 | 1 | 5 | 0.00 | 2.00 |" in text
    assert "base 3, a0 1; 1 long answers of 16-24 tokens" in text
    assert (tmp_path / "fleet.json").exists()


@pytest.mark.parametrize("argv", [["fleet"], ["fleet", "--quick"]])
def test_fleet_options(argv):
    args = bench.parse(argv)
    assert args.replicas == 2 and args.adapters == 3 and args.short[0] < args.short[1] < args.long[0] < args.long[1]


def test_the_open_loop_sends_each_request_at_its_time_and_arrivals_follow_the_rate():
    starts, t0 = {}, time.perf_counter()

    def square(i: int) -> int:
        starts[i] = time.perf_counter() - t0
        return i * i

    results, wall = fleet.open_loop(square, [0, 0.1, 0.2])
    assert results == [0, 1, 4] and wall >= 0.2
    assert [round(starts[i], 1) for i in range(3)] == [0.0, 0.1, 0.2]
    with pytest.raises(ZeroDivisionError):
        fleet.open_loop(lambda i: 1 / (i - 1), [0, 0])
    closed = fleet.requests(bench.parse(["fleet", "--prompts", "400"]), 0)
    reqs = fleet.requests(bench.parse(["fleet", "--prompts", "400", "--rate", "2"]), 0)
    assert {r["at"] for r in closed} == {0.0} and [dict(r, at=0.0) for r in reqs] == closed  # the same mix
    gaps = [b["at"] - a["at"] for a, b in zip(reqs, reqs[1:], strict=False)]
    assert min(gaps) >= 0 and abs(statistics.mean(gaps) - 0.5) < 0.1
