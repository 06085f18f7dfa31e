"""Soak: many concurrent streams for N minutes, mixed unguided, guided, cancelled, refused and greedy-check
requests, against a running tritonserver or one started here (model_repository/ as it is).

    python scripts/bench.py soak --minutes 3                  # starts a server itself
    python scripts/bench.py soak --minutes 30 --url localhost:8001 --metrics-url http://localhost:8002/metrics \\
        --server-pid "$(pgrep -o tritonserver)"
    python scripts/bench.py soak --quick                      # 0.5 min, 4 streams

A closed loop of --concurrency streams (default 16): each sends one request after another until the time is up:
  free       unguided text, greedy or seeded sampling, random length
  guided     a JSON schema or a regex; a finished output must obey it
  cancelled  cut after a random number of responses or a random delay (the client goes away)
  refused    a bad request; it must get one error naming the field
  greedy     the reference prompt, greedy: must equal its solo run (taken before the soak starts)
  sampled    a seeded sampled reference (unguided or JSON-schema guided) with a random draft length (0, 2, 4 or
             auto): must equal its solo run without speculation, token for token
Prints per minute: output tokens/s (tokens received), requests ended, outcomes by class; at the start and end
the resident memory of the server and of its model process (the Python-backend stub; with --server-pid, or
when the server was started here). Exits 1 on any unexpected outcome (an error, a timeout, an invalid or
inexact output, a bad request that got through) or when the stub's memory grew by more than
--max-rss-growth-mb from the start (measured after a warm-up that compiles every guide once).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import threading
import time
from collections import Counter, defaultdict

from .. import report
from ..run import closed_loop, served
from ..workload import CHAT_PROMPTS

SHARED = {"concurrency": [16]}
QUICK = {"concurrency": [4], "minutes": 0.5}
QUICK_HELP = "0.5 minutes, 4 streams"
ENGINE = False
REFERENCE = {
    "text_input": "Tell me about lighthouses.",
    "apply_chat_template": True,
    "stream": True,
    "max_tokens": 32,
    "temperature": 0.0,
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
GUIDES = [
    ("json_schema", json.dumps(PERSON), "Give a person's name and age as JSON."),
    ("regex", r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])", "When did the first Moon landing happen?"),
    ("regex", "(yes|no)", "Is the sky blue? Answer yes or no."),
]
BAD = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"sampling_parameters": "{oops"}, "sampling_parameters"),
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "("}, "regex guide"),
]
# seeded sampled references: their tokens depend on the prompt, the settings and the seed alone
SAMPLED = [
    dict(REFERENCE, temperature=0.9, top_p=0.95, top_k=50, seed=7),
    dict(
        REFERENCE,
        text_input=GUIDES[0][2],
        guided_decoding_guide_type=GUIDES[0][0],
        guided_decoding_guide=GUIDES[0][1],
        max_tokens=48,
        temperature=0.8,
        seed=11,
    ),
]
KINDS = {"free": 4, "guided": 3, "cancelled": 3, "refused": 1, "greedy": 1, "sampled": 1}
TIMEOUT_S = 600.0
EXPECTED = ("ok", "cancelled", "refused")


def add_options(ap) -> None:
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--url", default="", help="a running server's gRPC endpoint host:port (default: start one)")
    ap.add_argument("--metrics-url", help="its metrics endpoint, for the server's own finish-reason counts")
    ap.add_argument("--server-pid", type=int, help="its tritonserver process id, for the memory figures")
    ap.add_argument(
        "--max-rss-growth-mb",
        type=int,
        default=256,
        help="largest growth of the model process's resident memory (default %(default)s MiB)",
    )
    ap.add_argument("--seed", type=int, default=0)


def obeys(kind: str, guide: str, text: str) -> bool:
    import jsonschema

    if kind == "regex":
        return re.fullmatch(guide, text) is not None
    try:
        jsonschema.validate(json.loads(text), json.loads(guide))
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


class Soak:
    def __init__(self, url: str, references: dict[str, list], t0: float):
        self.url, self.references, self.t0 = url, references, t0
        self.lock = threading.Lock()
        self.tokens: Counter = Counter()  # minute -> output tokens received
        self.outcomes: dict[int, Counter] = defaultdict(Counter)  # minute -> outcome class -> requests
        self.unexpected: list[str] = []
        self.sampled_checks = 0  # seeded sampled requests compared

    def minute(self) -> int:
        return int((time.perf_counter() - self.t0) // 60)

    def count_tokens(self, resp: dict) -> None:
        with self.lock:
            self.tokens[self.minute()] += len(resp["outputs"].get("output_ids", []))

    def one(self, rng: random.Random) -> None:
        """One request of a random kind, its outcome recorded."""
        from collect import StreamTimeout

        try:
            outcome, detail = getattr(self, rng.choices(list(KINDS), list(KINDS.values()))[0])(rng)
        except StreamTimeout as e:
            outcome, detail = "timeout", str(e)[:200]
        with self.lock:
            self.outcomes[self.minute()][outcome] += 1
            if outcome not in EXPECTED:
                self.unexpected.append(f"{outcome}: {detail}"[:300])

    def _stream(self, inputs: dict) -> list[dict]:
        from collect import stream_infer

        return stream_infer(self.url, inputs, timeout=TIMEOUT_S, on_response=self.count_tokens)

    def free(self, rng):
        from collect import errors_of

        sampling = {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**32)} if rng.random() < 0.5 else {}
        r = self._stream(
            {
                "text_input": rng.choice(CHAT_PROMPTS),
                "apply_chat_template": True,
                "stream": True,
                "max_tokens": rng.randint(8, 96),
                **sampling,
            }
        )
        return ("error", errors_of(r)[0]) if errors_of(r) else ("ok", "")

    def guided(self, rng):
        from collect import errors_of, last_value, text_of

        kind, guide, prompt = rng.choice(GUIDES)
        r = self._stream(
            {
                "text_input": prompt,
                "apply_chat_template": True,
                "stream": True,
                "max_tokens": 64,
                "guided_decoding_guide_type": kind,
                "guided_decoding_guide": guide,
            }
        )
        if errors_of(r):
            return "error", errors_of(r)[0]
        if last_value(r, "finish_reason") == "stop" and not obeys(kind, guide, text_of(r)):
            return "invalid_output", f"{guide[:60]} -> {text_of(r)[:100]}"
        return "ok", ""

    def cancelled(self, rng):
        from collect import cut_stream, errors_of

        inputs = {"text_input": rng.choice(CHAT_PROMPTS), "stream": True, "max_tokens": 256, "ignore_eos": True}
        if rng.random() < 0.5:
            r = cut_stream(self.url, inputs, after_responses=rng.randint(0, 4), after_seconds=TIMEOUT_S)
        else:
            r = cut_stream(self.url, inputs, after_seconds=rng.random())
        for resp in r:
            self.count_tokens(resp)
        return ("error", errors_of(r)[0]) if errors_of(r) else ("cancelled", "")

    def refused(self, rng):
        from collect import text_of

        inputs, field = rng.choice(BAD)
        r = self._stream({"text_input": "Hi", "max_tokens": 4, **inputs})
        if len(r) == 1 and r[0]["error"] and field in r[0]["error"]:
            return "refused", ""
        return "wrong_refusal", f"{inputs} -> {r[-1]['error'] or text_of(r)[:60]}"

    def greedy(self, rng):
        from collect import errors_of, ids_of

        r = self._stream(REFERENCE)
        if errors_of(r):
            return "error", errors_of(r)[0]
        want = self.references["greedy"]
        return ("ok", "") if ids_of(r) == want else ("inexact", f"{ids_of(r)} != {want}")

    def sampled(self, rng):
        from collect import errors_of, ids_of

        i, k = rng.randrange(len(SAMPLED)), rng.choice([0, 2, 4, -1])
        r = self._stream(dict(SAMPLED[i], num_draft_tokens=k))
        if errors_of(r):
            return "error", errors_of(r)[0]
        want = self.references["sampled"][i]
        with self.lock:
            self.sampled_checks += 1
        return ("ok", "") if ids_of(r) == want else ("inexact_sampled", f"k={k}: {ids_of(r)} != {want}")


def memory(server_pid: int | None) -> dict[str, int]:
    """MiB of the server and its model processes (empty without a server pid)."""
    from triton_server import rss_bytes, stub_pids

    if server_pid is None:
        return {}
    return {
        "server": rss_bytes(server_pid) >> 20,
        **{f"stub{i}": rss_bytes(pid) >> 20 for i, pid in enumerate(stub_pids(server_pid))},
    }


def warm_up(url: str) -> dict[str, list]:
    """Compile every guide once (the compiled-grammar cache is part of the start figure) and take the greedy and
    the sampled references alone, without speculation."""
    from collect import errors_of, ids_of, stream_infer

    def alone(inputs: dict) -> list[int]:
        r = stream_infer(url, inputs, timeout=TIMEOUT_S)
        if errors_of(r):
            raise SystemExit(f"warm-up: {errors_of(r)[0]}")
        return ids_of(r)

    for k, g, p in GUIDES:
        alone({"text_input": p, "max_tokens": 4, "guided_decoding_guide_type": k, "guided_decoding_guide": g})
    return {"greedy": alone(REFERENCE), "sampled": [alone(dict(x, num_draft_tokens=0)) for x in SAMPLED]}


def finished(metrics_url: str | None) -> dict[str, float]:
    if not metrics_url:
        return {}
    import requests
    from triton_server import metric_total

    text = requests.get(metrics_url, timeout=30).text
    return {
        r: metric_total(text, "specgram_requests_total", finish_reason=r)
        for r in ("stop", "length", "cancelled", "error")
    }


def run(args) -> int:
    with served(args.url, log_path=report.raw_dir(args) / "tritonserver.log", bench=False) as (url, server):
        pid = server.process.pid if server else args.server_pid
        return soak(args, url, server.metrics_url if server else args.metrics_url, pid)


def soak(args, url: str, metrics_url: str | None, pid: int | None) -> int:
    streams = args.concurrency[0]
    state = Soak(url, warm_up(url), 0.0)
    mem_start, fin_start = memory(pid), finished(metrics_url)
    state.t0 = time.perf_counter()
    deadline = state.t0 + args.minutes * 60
    rngs = (random.Random(args.seed * 1_000_003 + i) for i in itertools.count())
    todo = itertools.takewhile(lambda _: time.perf_counter() < deadline, rngs)
    print(
        f"soak: {streams} streams for {args.minutes:g} min against {url}; memory at start (MiB): "
        f"{mem_start or 'unknown (no --server-pid)'}",
        flush=True,
    )
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            closed_loop(state.one, todo, streams)
        except BaseException as e:  # noqa: BLE001 - raised below, in the main thread
            errors.append(e)

    loop = threading.Thread(target=drive)
    loop.start()
    minutes = range(math.ceil(args.minutes))
    for m in minutes:
        end = min(state.t0 + (m + 1) * 60, deadline)
        time.sleep(max(0.0, end - time.perf_counter()))
        with state.lock:
            tokens, outcomes = state.tokens[m], dict(state.outcomes[m])
        print(
            f"minute {m + 1}: {tokens / (end - state.t0 - m * 60):.1f} tok/s, {sum(outcomes.values())} requests "
            f"ended, {outcomes}, memory (MiB) {memory(pid)}",
            flush=True,
        )
    loop.join()  # each stream ends its last request
    if errors:
        raise errors[0]
    time.sleep(2.0)  # cancelled requests leave the engine within the adapter's polling interval
    mem_end, fin_end = memory(pid), finished(metrics_url)
    totals = sum(state.outcomes.values(), Counter())  # with the requests that ended after the time was up
    growth = {k: mem_end[k] - mem_start[k] for k in mem_start if k.startswith("stub") and k in mem_end}
    grew = any(g > args.max_rss_growth_mb for g in growth.values())
    fin = {k: fin_end[k] - fin_start[k] for k in fin_end} if fin_start else None
    lines = report.header(
        "Soak",
        args,
        f"{streams} streams (closed loop), {args.minutes:g} min, mixed requests "
        f"{KINDS}; {'server at ' + args.url if args.url else 'own server (model_repository/)'}",
        ("tritonclient", "nvidia-pytriton"),
    )
    mismatches = sum(u.startswith("inexact_sampled") for u in state.unexpected)
    lines += [
        f"Total: {sum(state.tokens[m] for m in minutes) / (args.minutes * 60):.1f} tok/s, outcomes {dict(totals)}  ",
        f"Seeded sampled requests checked against their solo runs: {state.sampled_checks}, mismatches: {mismatches}  ",
        *([f"Server finish reasons during the soak: {fin}  "] if fin else []),
        f"Memory (MiB): start {mem_start or 'unknown'}, end {mem_end or 'unknown'}",
        "",
    ]
    if state.unexpected:
        lines += [f"UNEXPECTED ({len(state.unexpected)}):", *(f"- {u}" for u in state.unexpected[:20]), ""]
    if grew:
        lines += [f"MEMORY GREW beyond {args.max_rss_growth_mb} MiB: {growth}", ""]
    failed = bool(state.unexpected) or grew
    report.write(
        args,
        lines + ["FAIL" if failed else "PASS"],
        dict(
            minutes=args.minutes,
            streams=streams,
            tokens_per_minute=[state.tokens[m] for m in minutes],
            outcomes_per_minute=[dict(state.outcomes[m]) for m in minutes],
            memory_mib=dict(start=mem_start, end=mem_end),
            unexpected=state.unexpected,
            server_finish_reasons=fin,
            sampled_checks=state.sampled_checks,
            sampled_mismatches=mismatches,
        ),
    )
    return 1 if failed else 0
