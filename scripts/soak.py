#!/usr/bin/env python3
"""Soak: many concurrent streams for N minutes, mixed unguided, guided, cancelled, refused and greedy-check
requests, against a running tritonserver or one started here.

    python scripts/soak.py --minutes 3                       # starts a server (model_repository/) itself
    python scripts/soak.py --minutes 30 --grpc-url localhost:8001 --metrics-url http://localhost:8002/metrics \\
        --server-pid "$(pgrep -o tritonserver)"

Each of --streams workers sends one request after another until the time is up:
  free       unguided text, greedy or seeded sampling, random length
  guided     a JSON schema or a regex; a finished output must obey it
  cancelled  cut after a random number of responses or a random delay (the client goes away)
  refused    a bad request; it must get one error naming the field
  greedy     the reference prompt, greedy: must equal its solo run (taken before the soak starts)
Prints per minute: output tokens/s (tokens received), requests ended, outcomes by class; at the start and end
the resident memory of the server and of its model process (the Python-backend stub; with --server-pid, or
when the server was started here). Exits 1 on any unexpected outcome (an error, a timeout, an invalid or
inexact output, a bad request that got through) or when the stub's memory grew by more than
--max-rss-growth-mb from the start (measured after a warm-up that compiles every guide once).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))

from collect import StreamTimeout, cut_stream, errors_of, ids_of, last_value, stream_infer, text_of  # noqa: E402
from triton_server import TritonServer, metric_total, rss_bytes, stub_pids  # noqa: E402

PROMPTS = ["Write a short story about a robot.", "Explain how rainbows form.", "List ten fruits and their colors.",
           "Describe the water cycle.", "What makes a good cup of coffee?", "Give tips for learning to code."]
REFERENCE = {"text_input": "Tell me about lighthouses.", "apply_chat_template": True, "stream": True,
             "max_tokens": 32, "temperature": 0.0}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
GUIDES = [("json_schema", json.dumps(PERSON), "Give a person's name and age as JSON."),
          ("regex", r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])", "When did the first Moon landing happen?"),
          ("regex", "(yes|no)", "Is the sky blue? Answer yes or no.")]
BAD = [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1.0}, "temperature"),
       ({"sampling_parameters": "{oops"}, "sampling_parameters"),
       ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "("}, "regex guide")]
KINDS = {"free": 4, "guided": 3, "cancelled": 3, "refused": 1, "greedy": 1}
TIMEOUT_S = 600.0
EXPECTED = ("ok", "cancelled", "refused")


class Soak:
    def __init__(self, grpc_url: str, reference: list[int], t0: float):
        self.url, self.reference, self.t0 = grpc_url, reference, t0
        self.lock = threading.Lock()
        self.tokens: Counter = Counter()                     # minute -> output tokens received
        self.outcomes: dict[int, Counter] = defaultdict(Counter)   # minute -> outcome class -> requests
        self.unexpected: list[str] = []

    def minute(self) -> int:
        return int((time.perf_counter() - self.t0) // 60)

    def window_s(self, m: int, deadline: float) -> float:
        """Length of minute m of the soak (the last one may be shorter)."""
        return min(self.t0 + (m + 1) * 60, deadline) - (self.t0 + m * 60)

    def count_tokens(self, resp: dict) -> None:
        n = len(resp["outputs"].get("output_ids", []))
        with self.lock:
            self.tokens[self.minute()] += n

    def record(self, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.outcomes[self.minute()][outcome] += 1
            if outcome not in EXPECTED:
                self.unexpected.append(f"{outcome}: {detail}"[:300])

    # ---- one request of each kind -> (outcome class, detail) -------------------------------------------------

    def run(self, kind: str, rng: random.Random) -> tuple[str, str]:
        try:
            return getattr(self, kind)(rng)
        except StreamTimeout as e:
            return "timeout", str(e)[:200]

    def _stream(self, inputs: dict) -> list[dict]:
        return stream_infer(self.url, inputs, timeout=TIMEOUT_S, on_response=self.count_tokens)

    def free(self, rng):
        sampling = {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**32)} if rng.random() < 0.5 else {}
        r = self._stream({"text_input": rng.choice(PROMPTS), "apply_chat_template": True, "stream": True,
                          "max_tokens": rng.randint(8, 96), **sampling})
        return ("error", errors_of(r)[0]) if errors_of(r) else ("ok", "")

    def guided(self, rng):
        kind, guide, prompt = rng.choice(GUIDES)
        r = self._stream({"text_input": prompt, "apply_chat_template": True, "stream": True, "max_tokens": 64,
                          "guided_decoding_guide_type": kind, "guided_decoding_guide": guide})
        if errors_of(r):
            return "error", errors_of(r)[0]
        text = text_of(r)
        if last_value(r, "finish_reason") == "stop" and not _obeys(kind, guide, text):
            return "invalid_output", f"{guide[:60]} -> {text[:100]}"
        return "ok", ""

    def cancelled(self, rng):
        inputs = {"text_input": rng.choice(PROMPTS), "stream": True, "max_tokens": 256, "ignore_eos": True}
        if rng.random() < 0.5:
            r = cut_stream(self.url, inputs, after_responses=rng.randint(0, 4), after_seconds=TIMEOUT_S)
        else:
            r = cut_stream(self.url, inputs, after_seconds=rng.random())
        for resp in r:
            self.count_tokens(resp)
        return ("error", errors_of(r)[0]) if errors_of(r) else ("cancelled", "")

    def refused(self, rng):
        inputs, field = rng.choice(BAD)
        r = self._stream({"text_input": "Hi", "max_tokens": 4, **inputs})
        if len(r) == 1 and r[0]["error"] and field in r[0]["error"]:
            return "refused", ""
        return "wrong_refusal", f"{inputs} -> {r[-1]['error'] or text_of(r)[:60]}"

    def greedy(self, rng):
        r = self._stream(REFERENCE)
        if errors_of(r):
            return "error", errors_of(r)[0]
        return ("ok", "") if ids_of(r) == self.reference else ("inexact", f"{ids_of(r)} != {self.reference}")


def _obeys(kind: str, guide: str, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(guide, text) is not None
    try:
        jsonschema.validate(json.loads(text), json.loads(guide))
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def memory(server_pid: int | None) -> dict[str, int]:
    """MiB of the server and its model processes (empty without a server pid)."""
    if server_pid is None:
        return {}
    out = {"server": rss_bytes(server_pid) >> 20}
    for i, pid in enumerate(stub_pids(server_pid)):
        out[f"stub{i}"] = rss_bytes(pid) >> 20
    return out


def warm_up(url: str) -> list[int]:
    """Compile every guide once (the compiled-grammar cache is part of the start figure) and take the greedy
    reference alone."""
    for kind, guide, prompt in GUIDES:
        r = stream_infer(url, {"text_input": prompt, "max_tokens": 4, "guided_decoding_guide_type": kind,
                               "guided_decoding_guide": guide}, timeout=TIMEOUT_S)
        if errors_of(r):
            raise SystemExit(f"warm-up: {errors_of(r)[0]}")
    r = stream_infer(url, REFERENCE, timeout=TIMEOUT_S)
    if errors_of(r):
        raise SystemExit(f"warm-up: {errors_of(r)[0]}")
    return ids_of(r)


def soak(args, grpc_url: str, metrics_url: str | None, server_pid: int | None) -> int:
    reference = warm_up(grpc_url)
    mem_start = memory(server_pid)
    finished_start = _finished(metrics_url)
    t0 = time.perf_counter()
    deadline = t0 + args.minutes * 60
    state = Soak(grpc_url, reference, t0)
    kinds, weights = zip(*KINDS.items())

    def worker(w: int) -> None:
        rng = random.Random(args.seed * 1000 + w)
        while time.perf_counter() < deadline:
            state.record(*state.run(rng.choices(kinds, weights)[0], rng))

    print(f"soak: {args.streams} streams for {args.minutes:g} min against {grpc_url}; memory at start (MiB): "
          f"{mem_start or 'unknown (no --server-pid)'}", flush=True)
    with ThreadPoolExecutor(args.streams) as pool:
        futures = [pool.submit(worker, w) for w in range(args.streams)]
        for m in range(math.ceil(args.minutes)):
            time.sleep(max(0.0, min(t0 + (m + 1) * 60, deadline) - time.perf_counter()))
            report_minute(state, m, state.window_s(m, deadline), memory(server_pid))
        for f in futures:      # each worker ends its last request
            f.result()
    time.sleep(2.0)     # cancelled requests leave the engine within the adapter's polling interval
    mem_end = memory(server_pid)
    return summary(args, state, mem_start, mem_end, finished_start, _finished(metrics_url))


def report_minute(state: Soak, m: int, seconds: float, mem: dict) -> None:
    with state.lock:
        tokens, outcomes = state.tokens[m], dict(state.outcomes[m])
    print(f"minute {m + 1}: {tokens / seconds:.1f} tok/s, {sum(outcomes.values())} requests ended, {outcomes}, "
          f"memory (MiB) {mem}", flush=True)


def _finished(metrics_url: str | None) -> dict[str, float]:
    if not metrics_url:
        return {}
    import requests

    text = requests.get(metrics_url, timeout=30).text
    return {r: metric_total(text, "specgram_requests_total", finish_reason=r)
            for r in ("stop", "length", "cancelled", "error")}


def summary(args, state: Soak, mem_start: dict, mem_end: dict, fin_start: dict, fin_end: dict) -> int:
    minutes = range(math.ceil(args.minutes))
    totals = sum(state.outcomes.values(), Counter())      # with the requests that ended after the time was up
    print(f"total: {sum(state.tokens[m] for m in minutes) / (args.minutes * 60):.1f} tok/s, "
          f"outcomes {dict(totals)}")
    if fin_start:
        print(f"server finish reasons during the soak: { {k: fin_end[k] - fin_start[k] for k in fin_end} }")
    print(f"memory (MiB) start {mem_start or 'unknown'}, end {mem_end or 'unknown'}")
    failed = False
    if state.unexpected:
        failed = True
        print(f"UNEXPECTED ({len(state.unexpected)}):")
        for line in state.unexpected[:20]:
            print(f"  {line}")
    growth = {k: mem_end[k] - mem_start[k] for k in mem_start if k.startswith("stub") and k in mem_end}
    if any(g > args.max_rss_growth_mb for g in growth.values()):
        failed = True
        print(f"MEMORY GREW beyond {args.max_rss_growth_mb} MiB: {growth}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "minutes": args.minutes, "streams": args.streams,
            "tokens_per_minute": [state.tokens[m] for m in minutes],
            "outcomes_per_minute": [dict(state.outcomes[m]) for m in minutes],
            "memory_mib": {"start": mem_start, "end": mem_end}, "unexpected": state.unexpected,
            "server_finish_reasons": {k: fin_end[k] - fin_start[k] for k in fin_end} if fin_start else None},
            indent=1))
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--streams", type=int, default=16, help="concurrent streams (default %(default)s)")
    ap.add_argument("--grpc-url", help="a running server's gRPC endpoint host:port (default: start one here)")
    ap.add_argument("--metrics-url", help="its metrics endpoint, for the server's own finish-reason counts")
    ap.add_argument("--server-pid", type=int, help="its tritonserver process id, for the memory figures")
    ap.add_argument("--max-rss-growth-mb", type=int, default=256,
                    help="largest growth of the model process's resident memory (default %(default)s MiB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.grpc_url:
        return soak(args, args.grpc_url, args.metrics_url, args.server_pid)
    with TritonServer() as server:
        print(f"started tritonserver (log: {server.log_path})", flush=True)
        return soak(args, server.grpc_url, server.metrics_url, server.process.pid)


if __name__ == "__main__":
    sys.exit(main())
