"""A fleet: tritonserver replicas with LoRA adapters behind an endpoint picker that reads only their metrics,
against round robin, one run.

    python scripts/bench.py fleet                  # 2 replicas, 3 adapters + base, 48 requests at c = 12, 2 rounds
    python scripts/bench.py fleet --replicas 3 --concurrency 16
    python scripts/bench.py fleet --rate 1.2        # an open loop: Poisson arrivals, 1.2 requests/s
    python scripts/bench.py fleet --quick

Replicas: --replicas tritonservers on this machine, started one after the other (each binds the free ports it
chose before the next chooses), each serving the model with REPLICA's settings (4 slots, no speculation: light
enough for several on a small CPU; no bound on waiting requests, so none is refused), --replica-threads torch
threads (default: the cores shared out) and the same --adapters random PEFT LoRA adapters (rank --rank, made as
the lora scenario makes them).

Load: --prompts requests per round, a seeded sequence (--seed, then --seed + 1, ... for the following rounds):
chat prompts, each naming an adapter or none (the base) by the weights of MIX, each asking for a long answer
(--long tokens, LONG_SHARE of them) or a short one (--short; ignore_eos, so the lengths are exact). A closed loop
at --concurrency (above the fleet's slots, so queues form) or, with --rate, an open loop: Poisson arrivals at that
rate (seeded too). Rounds interleaved: picker, round robin, picker, ... (--repeat of each); each round of one
policy is answered by a round of the other on the same sequence (the same prompts, adapters, lengths and arrival
times), each from idle replicas (their gauges read no request). A p95 over one sequence is its two or three
longest answers; over several sequences it is the load's.

The picker (a test harness, not a router; the Gateway API Inference Extension's endpoint picker scores the same
metrics, see docs/operating.md, "Running as one replica of a fleet"). Per request it takes a scrape of every
replica's metrics port (Prometheus text) no older than MAX_AGE_S, else scrapes again, reading
specgram_requests_waiting, specgram_kv_cache_usage and specgram_lora_requests_info (the series with the largest
value: its running_lora_adapters and waiting_lora_adapters). The rule, each step narrowing the replicas:
  1. the fewest waiting requests;
  2. a replica with a free KV slot (usage < 1) before a full one;
  3. a request naming an adapter: the replicas whose running or waiting requests already name it, if their KV
     usage is at most the lowest usage left + --affinity-kv (default AFFINITY_KV: one slot of four), and if
     there are any (a negative --affinity-kv skips this step);
  4. the lowest KV usage;
  5. a tie: the first in turn after the replica picked last.
It knows nothing else (not its own recent picks). Round robin sends the i-th request picked to replica i mod n. A server
sets its gauges at most every 0.5 s, so the picker sees each replica up to half a second late, as a picker in a
cluster does.

Report per policy: requests and each adapter's requests per replica, each replica's mean waiting and mean
distinct adapters running (sampled every SAMPLE_S), latency and TTFT p50 / p95 over all its rounds' requests
(times from the pick; and the latency p95 of the short and of the long answers), output tok/s (median of rounds),
and picker ÷ round robin.
"""

from __future__ import annotations

import os
import random
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .. import DEFAULT_MODEL, report
from ..run import closed_loop, stream_request, triton_inputs
from ..workload import BENCH_ENGINE, CHAT_PROMPTS, pct

SHARED = {"prompts": 48, "concurrency": [12], "repeat": 2}
QUICK = {"prompts": 8, "concurrency": [4], "repeat": 1, "short": [4, 8], "long": [16, 24]}
QUICK_HELP = "8 requests at c = 4, one round of each policy, 4-24 tokens"
ENGINE = False

REPLICA = {
    "device": "cpu",
    "max_slots": "4",
    "max_seq_len": "512",
    "max_waiting_requests": "0",
    "drafter": "ngram",
    "draft_quantization": "none",
    "default_num_draft_tokens": "0",
    "default_num_draft_tokens_guided": "0",
    "enable_lora": "1",
}
MIX = (0.25, 0.4, 0.2, 0.15)  # the base, then adapter a0, a1, ... (one popular adapter, a long tail)
LONG_SHARE = 0.3  # requests asking for a long answer
MAX_AGE_S = 0.05  # the oldest scrape the picker uses
AFFINITY_KV = 0.25
SAMPLE_S = 0.1
POLICIES = ("picker", "round robin")


def add_options(ap) -> None:
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="checkpoint folder (default %(default)s)")
    ap.add_argument("--replicas", type=int, default=2, help="tritonservers (default %(default)s)")
    ap.add_argument("--replica-threads", type=int, default=0, help="torch threads per replica (0: cores / replicas)")
    ap.add_argument("--adapters", type=int, default=3, help="LoRA adapters (default %(default)s)")
    ap.add_argument("--rank", type=int, default=16, help="the adapters' rank (default %(default)s)")
    ap.add_argument("--short", type=int, nargs=2, default=[8, 32], help="a short answer's tokens, from..to")
    ap.add_argument("--long", type=int, nargs=2, default=[96, 192], help="a long answer's tokens, from..to")
    ap.add_argument(
        "--affinity-kv", type=float, default=AFFINITY_KV, help="the picker's LoRA affinity margin (< 0: none)"
    )
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s of an open loop (0: the closed loop)")
    ap.add_argument("--seed", type=int, default=0, help="the request sequence's seed (default %(default)s)")


# ---- the picker's view of a replica ------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class View:
    """What a replica's metrics say: waiting and running requests, KV usage (0-1), the adapters of its running
    and waiting requests, and the adapters it has loaded (max_lora)."""

    waiting: float = 0.0
    running: float = 0.0
    kv: float = 0.0
    running_adapters: frozenset = frozenset()
    waiting_adapters: frozenset = frozenset()
    max_lora: int = 0

    @property
    def adapters(self) -> frozenset:
        return self.running_adapters | self.waiting_adapters


def parse_metrics(text: str, model: str = "llm") -> View:
    """A View from a metrics port's Prometheus text: the model's series (summed over instances); of the LoRA
    info series, the one with the largest value (the latest labels)."""
    sums = {"specgram_requests_waiting": 0.0, "specgram_requests_running": 0.0, "specgram_kv_cache_usage": 0.0}
    lora, lora_at = {}, float("-inf")
    for name, labels, value in _SAMPLE.findall(text):
        have = dict(_LABEL.findall(labels))
        if have.get("model", model) != model:
            continue
        if name in sums:
            sums[name] += float(value)
        elif name == "specgram_lora_requests_info" and float(value) > lora_at:
            lora, lora_at = have, float(value)

    def names(key: str) -> frozenset:
        return frozenset(n for n in lora.get(key, "").split(",") if n)

    return View(
        waiting=sums["specgram_requests_waiting"],
        running=sums["specgram_requests_running"],
        kv=sums["specgram_kv_cache_usage"],
        running_adapters=names("running_lora_adapters"),
        waiting_adapters=names("waiting_lora_adapters"),
        max_lora=int(lora.get("max_lora", 0)),
    )


def pick(views: list[View], adapter: str | None, last: int, affinity_kv: float = AFFINITY_KV) -> int:
    """The replica the picker sends a request naming `adapter` (None: the base) to, by the module's rule; last:
    the replica picked last (ties go to the first after it in turn); affinity_kv < 0: no adapter affinity."""
    n = len(views)
    fewest = min(v.waiting for v in views)
    left = [i for i in range(n) if views[i].waiting == fewest]
    left = [i for i in left if views[i].kv < 1] or left
    if adapter is not None and affinity_kv >= 0:
        lowest = min(views[i].kv for i in left)
        left = [i for i in left if adapter in views[i].adapters and views[i].kv <= lowest + affinity_kv] or left
    lowest = min(views[i].kv for i in left)
    return min((i for i in left if views[i].kv == lowest), key=lambda i: (i - last - 1) % n)


class Fleet:
    """The replicas' metrics urls, a shared scrape no older than a given age, and the two policies."""

    def __init__(self, metrics_urls: list[str], affinity_kv: float = AFFINITY_KV):
        self.urls, self.lock, self.affinity_kv = metrics_urls, threading.Lock(), affinity_kv
        self.views: list[View] = []
        self.scraped_at = float("-inf")
        self.last = -1
        self.turn = 0

    def scrape(self, max_age: float) -> list[View]:
        with self.lock:
            if time.perf_counter() - self.scraped_at > max_age:
                texts = [urllib.request.urlopen(u, timeout=5).read().decode() for u in self.urls]
                self.views, self.scraped_at = [parse_metrics(t) for t in texts], time.perf_counter()
            return self.views

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every replica's gauges read no request: a round's first picks would otherwise see the last
        round's tail (the gauges lag up to 0.5 s) and all go to the replica that looked idlest."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if all(v.waiting == v.running == v.kv == 0 for v in self.scrape(0.0)):
                return
            time.sleep(SAMPLE_S)

    def choose(self, policy: str, adapter: str | None) -> int:
        if policy == "round robin":
            with self.lock:
                self.turn += 1
                return (self.turn - 1) % len(self.urls)
        views = self.scrape(MAX_AGE_S)
        with self.lock:
            self.last = pick(views, adapter, self.last, self.affinity_kv)
            return self.last


# ---- the load --------------------------------------------------------------------------------------------------


def requests(args, seed: int) -> list[dict]:
    """The request sequence both policies send in a round: prompt, adapter (None: the base), max_tokens,
    arrival (s)."""
    # arrivals drawn apart: the same seed's mix whatever the rate
    rng, clock = random.Random(seed), random.Random(f"{seed} arrivals")
    names = [None] + [f"a{i}" for i in range(args.adapters)]
    weights = list(MIX[: len(names)]) + [MIX[-1]] * max(0, len(names) - len(MIX))
    out, at = [], 0.0
    for i in range(args.prompts):
        span = args.long if rng.random() < LONG_SHARE else args.short
        out.append(
            dict(
                prompt=CHAT_PROMPTS[i % len(CHAT_PROMPTS)],
                adapter=rng.choices(names, weights)[0],
                max_tokens=rng.randint(*span),
                at=at,
            )
        )
        at += clock.expovariate(args.rate) if args.rate else 0.0
    return out


def open_loop(fn, times: list[float]) -> tuple[list, float]:
    """fn(i) started in a thread of its own at times[i] seconds -> the results in order, wall seconds. The first
    exception is raised once every thread has ended."""
    results, failed, threads, t0 = {}, [], [], time.perf_counter()

    def one(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
            failed.append(e)

    for i, at in enumerate(times):
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        threads.append(threading.Thread(target=one, args=(i,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return [results[i] for i in sorted(results)], time.perf_counter() - t0


def one_round(fleet: Fleet, grpc: list[str], policy: str, reqs: list[dict], c: int, rate: float = 0.0) -> dict:
    """One round of the sequence under a policy (closed loop at c, or the open loop's arrivals at `rate`), the
    replicas sampled meanwhile -> its record."""
    fleet.settle()
    fleet.turn, fleet.last, start = 0, -1, time.perf_counter()
    samples, done = [], threading.Event()

    def sampler() -> None:
        while not done.wait(SAMPLE_S):
            samples.append([(v.waiting, len(v.running_adapters)) for v in fleet.scrape(0.0)])

    def send(i: int) -> dict:
        r, t0 = reqs[i], time.perf_counter()
        replica = fleet.choose(policy, r["adapter"])
        picked = time.perf_counter() - t0
        extra = {"ignore_eos": True, **({"lora_name": r["adapter"]} if r["adapter"] else {})}
        got = stream_request(grpc[replica], {**triton_inputs(r, r["max_tokens"]), **extra})
        return dict(
            case=i,
            start_s=t0 - start,
            replica=replica,
            adapter=r["adapter"] or "base",
            tokens=len(got["ids"]),
            pick_ms=1e3 * picked,
            ttft_s=picked + got["ttft_s"],
            latency_s=picked + got["latency_s"],
        )

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    try:
        if rate:
            out, wall = open_loop(send, [r["at"] for r in reqs])
        else:
            out, wall = closed_loop(send, range(len(reqs)), c)
    finally:
        done.set()
        watcher.join()
    load = f"{rate:g} req/s" if rate else f"c {c}"
    return dict(policy=policy, load=load, wall_s=wall, requests=out, samples=samples)


# ---- the run -----------------------------------------------------------------------------------------------


def _adapters(args, folder: Path) -> Path:
    from .lora import _adapters as make

    return make(args.model, folder, args.rank, args.adapters, 0.0)


def _start(args, listing: Path, folder: Path, raw: Path) -> tuple[list, int]:
    """The replicas (their model repositories in `folder`), started one after the other, each with its share of
    the cores."""
    from triton_server import TritonServer, model_repository_with

    threads = args.replica_threads or max(1, (os.cpu_count() or 1) // args.replicas)
    settings = {**BENCH_ENGINE, **REPLICA, "checkpoint": str(Path(args.model).absolute()), "lora_adapters": listing}
    servers, before = [], os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the servers copy the environment; torch reads it at start
    try:
        for i in range(args.replicas):
            repo = model_repository_with({k: str(v) for k, v in settings.items()}, folder / f"repo{i}")
            server = TritonServer(model_repository=repo, log_path=raw / f"replica{i}.log")
            servers.append(server)
            server.start()
            report.log(f"replica {i} ready: {server.grpc_url}, {server.metrics_url}")
    except BaseException:
        for s in servers:
            s.stop()
        raise
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before
    return servers, threads


def run(args) -> None:
    raw = report.raw_dir(args)
    rounds = [requests(args, args.seed + r) for r in range(args.repeat)]
    with tempfile.TemporaryDirectory() as tmp:
        listing = _adapters(args, Path(tmp))
        servers, threads = _start(args, listing, Path(tmp), raw)
        try:
            grpc = [s.grpc_url for s in servers]
            fleet = Fleet([s.metrics_url for s in servers], args.affinity_kv)
            warm = [dict(r, max_tokens=4) for r in rounds[0][: 2 * args.replicas]]
            one_round(fleet, grpc, "round robin", warm, args.replicas)
            recs = []
            for c in [0] if args.rate else args.concurrency:
                for r, reqs in enumerate(rounds):
                    for policy in POLICIES:
                        recs.append(dict(one_round(fleet, grpc, policy, reqs, c, args.rate), round=r))
                        report.log(f"{recs[-1]['load']} round {r + 1} {policy}: {summary(recs[-1])}")
        finally:
            for s in servers:
                s.stop()
    write_report(args, rounds, recs, threads)


def summary(rec: dict) -> str:
    lat = [q["latency_s"] for q in rec["requests"]]
    return f"p95 latency {pct(lat, 95):.2f} s, {tok_s(rec):.1f} tok/s"


def tok_s(rec: dict) -> float:
    return sum(q["tokens"] for q in rec["requests"]) / rec["wall_s"]


def write_report(args, sequences: list[list[dict]], recs: list[dict], threads: int) -> None:
    """sequences: each round's requests (a record's `round` indexes them)."""
    names = ["base"] + [f"a{i}" for i in range(args.adapters)]
    rows, replica_rows, ratio_rows = [], [], []
    for c in dict.fromkeys(r["load"] for r in recs):
        figs = {}
        for policy in POLICIES:
            rounds = [r for r in recs if r["load"] == c and r["policy"] == policy]
            qs = [q for r in rounds for q in r["requests"]]
            lat, ttft = [q["latency_s"] for q in qs], [q["ttft_s"] for q in qs]
            asked = [sequences[r["round"]][q["case"]]["max_tokens"] for r in rounds for q in r["requests"]]
            long = [n >= args.long[0] for n in asked]
            split = [pct([x for x, lg in zip(lat, long, strict=True) if lg == want], 95) for want in (False, True)]
            figs[policy] = (pct(lat, 95), pct(ttft, 95), statistics.median(map(tok_s, rounds)))
            rows.append(
                [
                    c,
                    policy,
                    f"{pct(lat, 50):.2f} / {pct(lat, 95):.2f}",
                    f"{pct(ttft, 50):.2f} / {pct(ttft, 95):.2f}",
                    " / ".join(report.cell(x, "{:.2f}") for x in split),
                    f"{figs[policy][2]:.1f}",
                    " / ".join(f"{pct([q['latency_s'] for q in r['requests']], 95):.2f}" for r in rounds),
                    f"{statistics.mean(q['pick_ms'] for q in qs):.2f}",
                ]
            )
            for i in range(args.replicas):
                mine = [q for q in qs if q["replica"] == i]
                seen = [s[i] for r in rounds for s in r["samples"]]
                replica_rows.append(
                    [
                        c,
                        policy,
                        i,
                        len(mine),
                        *(sum(q["adapter"] == a for q in mine) for a in names),
                        sum(q["tokens"] for q in mine),
                        report.cell(statistics.mean(w for w, _ in seen) if seen else None, "{:.2f}"),
                        report.cell(statistics.mean(a for _, a in seen) if seen else None, "{:.2f}"),
                    ]
                )
        (p95, t95, tok), (rr95, rrt95, rrtok) = figs["picker"], figs["round robin"]
        ratio_rows.append([c, f"{p95 / rr95:.2f}×", f"{t95 / rrt95:.2f}×", f"{tok / rrtok:.2f}×"])
    every = [r for reqs in sequences for r in reqs]
    long_n = sum(r["max_tokens"] >= args.long[0] for r in every)
    mix = ", ".join(f"{n} {sum((r['adapter'] or 'base') == n for r in every)}" for n in names)
    loop = f"an open loop at {args.rate:g} req/s" if args.rate else "closed loop"
    settings = ", ".join(f"{k} {v}" for k, v in {**BENCH_ENGINE, **REPLICA}.items())
    lines = report.header(
        "A fleet of replicas: endpoint picker against round robin",
        args,
        f"{args.prompts} chat prompts per round, {len(sequences)} sequences (seeds {args.seed}-"
        f"{args.seed + len(sequences) - 1}; over all: {mix}; {long_n} long answers of {args.long[0]}-{args.long[1]} "
        f"tokens, the rest {args.short[0]}-{args.short[1]}; ignore_eos, greedy), {loop}, rounds interleaved "
        f"(picker, round robin on the same sequence) x {args.repeat}. "
        f"{args.replicas} replicas, each a tritonserver with {threads} torch thread(s), {settings}; "
        f"{args.adapters} random LoRA adapters of rank {args.rank} on every projection. The picker's rule "
        f"(affinity margin {args.affinity_kv}): "
        f"scenario fleet's docstring (`python scripts/bench.py fleet --help`), scrapes at most "
        f"{1e3 * MAX_AGE_S:.0f} ms old",
        ("tritonclient", "nvidia-pytriton"),
    )
    lines += ["Latency and TTFT over all requests of a policy's rounds, from the pick (seconds):", ""]
    header = ["load", "policy", "latency p50 / p95", "TTFT p50 / p95", "latency p95 short / long"]
    header += ["output tok/s (median)", "latency p95 per round"]
    lines += report.table(header + ["pick ms (mean)"], rows)
    lines += ["", "Picker ÷ round robin:", ""]
    lines += report.table(["load", "latency p95", "TTFT p95", "output tok/s"], ratio_rows)
    lines += ["", f"Per replica, over a policy's rounds (waiting, adapters running: sampled every {SAMPLE_S} s):", ""]
    header = ["load", "policy", "replica", "requests", *names, "output tokens", "mean waiting", "mean adapters running"]
    lines += report.table(header, replica_rows)
    report.write(args, lines, dict(requests=sequences, records=recs))
