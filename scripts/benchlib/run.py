"""The one concurrency model: a closed loop, c requests in flight, a finished one replaced by the next at once
(c = the number of requests: all sent at once). In process it is specgram's generate(engine, requests, c);
through tritonserver it is c client threads (closed_loop), each sending its next request (gRPC streaming) as
soon as its last one ended.

A run record (JSON-able; one system x configuration x concurrency; scripts/compare/vllm_worker.py writes the
same): system, config, guided, drafter, k, concurrency, wall_s, drafted, accepted (None = not reported),
requests: [{case, ids, text, ttft_s, latency_s, finish, drafted, accepted, ...}] (times from each request's
submission). In-process records also hold _run (specgram's Run) and _reqs (its Requests), left out of the JSON.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from . import REPO
from .workload import BENCH_ENGINE, make_requests

RUNS = itertools.count()  # a number for each run's own cache_salt


def peer_run(cases: list[dict], one, **fields) -> dict:
    """A peer worker's timed run (scripts/compare/*_worker.py, one request at a time): one(i, case) -> that
    request's record, for each case in turn -> the run record: fields (system, config, guided, drafter, k, dtype, ...),
    concurrency 1, the wall time of all, and drafted / accepted summed where every request reports them (else None:
    not reported). Standard library only: the workers run in the peers' own venvs."""
    t_start = time.perf_counter()
    reqs = [dict(case=i, **one(i, c)) for i, c in enumerate(cases)]
    wall = time.perf_counter() - t_start
    counted = bool(reqs) and all("drafted" in r for r in reqs)
    return dict(
        **fields,
        concurrency=1,
        wall_s=wall,
        drafted=sum(r["drafted"] for r in reqs) if counted else None,
        accepted=sum(r["accepted"] for r in reqs) if counted else None,
        requests=reqs,
    )


def with_salt(cases: list[dict], salt: str | None = None) -> list[dict]:
    """The cases with one cache_salt for the run (salt, else one of its own), unless a case names its own: the
    same prompts sent run after run, greedy, would otherwise have their answers drafted by the suffix store from
    an earlier run's (and their prompts found in the prefix cache)."""
    if any("cache_salt" in c for c in cases):
        return cases
    salt = salt or f"run-{next(RUNS)}"
    return [{**c, "cache_salt": salt} for c in cases]


# ---- in process ---------------------------------------------------------------------------------------------


def cpu_config(model: str, slots: int, max_seq_len: int, max_tokens: int = 128, **settings):
    """The engine settings of the in-process scenarios: fp32 on CPU, up to 8 drafts, BENCH_ENGINE."""
    from specgram.config import EngineConfig

    return EngineConfig(
        **{
            **dict(
                checkpoint=str(model),
                device="cpu",
                dtype="float32",
                max_slots=slots,
                max_seq_len=max_seq_len,
                max_draft_len=8,
                default_max_tokens=max_tokens,
            ),
            **BENCH_ENGINE,
            **settings,
        }
    )


def cpu_engine(model: str, slots: int, max_seq_len: int, max_tokens: int = 128, **settings):
    from specgram.engine.engine import Engine

    return Engine.from_config(cpu_config(model, slots, max_seq_len, max_tokens, **settings))


def scenario_engine(args, cases: list[dict], **settings):
    """cpu_engine sized for a scenario's run: a slot for each request in flight at the highest --concurrency,
    positions for the longest prompt, --max-tokens and 16 to spare."""
    longest = max(len(c["prompt_ids"]) for c in cases)
    return cpu_engine(args.model, max(args.concurrency), longest + args.max_tokens + 16, args.max_tokens, **settings)


def record(requests: list[dict], wall_s: float, concurrency: int, **meta) -> dict:
    """A run record; drafted / accepted: the requests' sums, None when no request reports them."""
    counted = [r for r in requests if r.get("drafted") is not None]
    return dict(
        system=meta.pop("system", ""),
        config=meta.pop("config", ""),
        guided=meta.pop("guided", False),
        drafter=meta.pop("drafter", None),
        k=meta.pop("k", 0),
        concurrency=concurrency,
        wall_s=wall_s,
        drafted=sum(r["drafted"] for r in counted) if counted else None,
        accepted=sum(r["accepted"] for r in counted) if counted else None,
        requests=requests,
        **meta,
    )


def run_engine(
    engine,
    cases: list[dict],
    max_tokens: int,
    concurrency: int = 0,
    drafter: str | None = None,
    k: int = 0,
    guided: bool = False,
    tok=None,
    params: dict | None = None,
    cache_salt: str | None = None,
    **meta,
) -> dict:
    """One timed closed-loop run of the cases in process (concurrency 0 = all at once) -> its record (text
    decoded when tok is given). params: make_requests' (greedy without them). Grammars compile before the clock
    starts; raises on a request's error. cache_salt: the run's requests' (their prefix-cache and suffix-store
    scope); by default one of the run's own (with_salt), unless params or the cases name one."""
    from specgram.engine.generate import generate

    params = params or {}
    if "cache_salt" not in params:
        cases = with_salt(cases, cache_salt)
    reqs = make_requests(engine, cases, max_tokens, drafter, k, guided, **params)
    run = generate(engine, reqs, concurrency or len(reqs))
    if run.errors:
        raise RuntimeError(f"{meta.get('config', '')}: {run.errors[0]}")
    out = [
        dict(
            case=i,
            ids=g.token_ids,
            ttft_s=g.first_token_s,
            latency_s=g.latency_s,
            finish=g.final.finish_reason,
            drafted=g.spec.drafted,
            accepted=g.spec.accepted,
            steps=g.spec.steps,
            reused=r.cached_prompt_tokens,
            **({"text": tok.decode(g.token_ids, skip_special_tokens=True)} if tok is not None else {}),
        )
        for i, (g, r) in enumerate(zip(run.generations, reqs, strict=True))
    ]
    return record(
        out, run.wall_s, concurrency or len(reqs), drafter=drafter, k=k, guided=guided, _run=run, _reqs=reqs, **meta
    )


# ---- through tritonserver -------------------------------------------------------------------------------------


def closed_loop(fn, items, concurrency: int) -> tuple[list, float]:
    """`concurrency` threads; each takes the next item, runs fn(item), and takes the next as soon as that ends,
    until `items` (any iterable, also an endless one that stops by itself) is used up. -> the results in item
    order, wall seconds. The first exception stops the loop and is raised."""
    it, lock, results, failed = enumerate(items), threading.Lock(), {}, []

    def worker() -> None:
        while not failed:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            try:
                results[nxt[0]] = fn(nxt[1])
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
                failed.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return [results[i] for i in sorted(results)], time.perf_counter() - t0


def stream_request(url: str, inputs: dict, timeout: float = 600.0) -> dict:
    """One request over gRPC streaming -> {ids, text, ttft_s, latency_s, finish, drafted, accepted, sources} (times
    from its submission; ttft = the first response carrying tokens; sources: spec_detail's drafted and accepted per
    draft source, {} where the server sent none). Raises on an error response."""
    from collect import errors_of, ids_of, last_value, stream_infer, text_of

    resps = stream_infer(url, inputs, timeout=timeout)
    if errors_of(resps):
        raise RuntimeError(errors_of(resps))
    first = next(
        (r["time"] for r in resps if r["outputs"].get("output_ids") is not None and r["outputs"]["output_ids"].size),
        resps[-1]["time"],
    )
    return dict(
        ids=ids_of(resps),
        text=text_of(resps),
        ttft_s=first,
        latency_s=resps[-1]["time"],
        finish=last_value(resps, "finish_reason"),
        drafted=int(last_value(resps, "spec_drafted_tokens", 0)),
        accepted=int(last_value(resps, "spec_accepted_tokens", 0)),
        sources=json.loads(last_value(resps, "spec_detail", "{}")).get("sources", {}),
    )


def triton_inputs(
    case: dict, max_tokens: int, drafter: str | None = None, k: int = 0, guided: bool = False, **extra
) -> dict:
    """The `llm` model's inputs for a case: its prompt text, chat template, streaming, greedy."""
    inputs = {
        "text_input": case["prompt"],
        "apply_chat_template": True,
        "stream": True,
        "max_tokens": max_tokens,
        "num_draft_tokens": k,
        "drafter": drafter or "ngram",
        **({"cache_salt": case["cache_salt"]} if "cache_salt" in case else {}),
        **extra,
    }
    if guided:
        inputs.update(guided_decoding_guide_type="json_schema", guided_decoding_guide=case["guide"])
    return inputs


def run_triton(
    url: str,
    cases: list[dict],
    max_tokens: int,
    concurrency: int,
    drafter: str | None = None,
    k: int = 0,
    guided: bool = False,
    extra: dict | None = None,
    **meta,
) -> dict:
    """One timed closed-loop run of the cases through a server -> its record. The run's requests share a
    cache_salt of its own unless the cases name theirs (with_salt)."""
    cases = with_salt(cases)

    def one(i: int) -> dict:
        # extra last: it may also replace (or, as None, drop) the drafter and num_draft_tokens inputs
        return dict(
            case=i, **stream_request(url, {**triton_inputs(cases[i], max_tokens, drafter, k, guided), **(extra or {})})
        )

    reqs, wall = closed_loop(one, range(len(cases)), concurrency)
    return record(reqs, wall, concurrency, drafter=drafter, k=k, guided=guided, **meta)


def bench_server(settings: dict | None = None, log_path: Path | None = None):
    """A TritonServer (not started) serving model_repository/'s `llm` with BENCH_ENGINE and `settings`."""
    from triton_server import TritonServer, model_repository_with

    repo = model_repository_with(
        {**BENCH_ENGINE, **(settings or {})}, Path(tempfile.mkdtemp(prefix="bench-repo-")), REPO / "model_repository"
    )
    return TritonServer(model_repository=repo, log_path=log_path)


@contextmanager
def served(url: str = "", settings: dict | None = None, log_path: Path | None = None, bench: bool = True):
    """-> (gRPC url, the TritonServer started here or None): the running server at `url`, or one started for the
    duration of the block: bench_server's (BENCH_ENGINE + settings), or with bench=False model_repository/ as is."""
    if url:
        yield url, None
        return
    from triton_server import TritonServer

    from .report import log

    with bench_server(settings, log_path) if bench else TritonServer(log_path=log_path) as server:
        log(f"tritonserver ready ({server.grpc_url}), log {server.log_path}")
        yield server.grpc_url, server


# ---- measures of a record ---------------------------------------------------------------------------------


def tok_s(rec: dict) -> float:
    """Output tokens of all requests / wall seconds of the run."""
    return sum(len(r["ids"]) for r in rec["requests"]) / rec["wall_s"]


def ids(rec: dict) -> list[list[int]]:
    return [r["ids"] for r in rec["requests"]]


def ttft_ms(rec: dict, how=statistics.median) -> float:
    return 1e3 * how(r["ttft_s"] for r in rec["requests"])


def acceptance(rec: dict) -> float | None:
    return rec["accepted"] / rec["drafted"] if rec.get("drafted") else None


def tok_per_step(rec: dict) -> float:
    """Tokens committed per speculative verify step: 1 + accepted drafts (1.0 when nothing was drafted)."""
    steps = sum(r.get("steps", 0) for r in rec["requests"])
    return (steps + (rec["accepted"] or 0)) / steps if steps else 1.0


def ttft_cells(recs: list[dict], reference: list) -> list[str]:
    """Report cells of one setting's repeated runs: median TTFT p50 and mean (ms), median output tok/s, and
    whether every run's output ids equal `reference`."""
    return [
        f"{statistics.median(ttft_ms(r) for r in recs):.0f}",
        f"{statistics.median(ttft_ms(r, statistics.mean) for r in recs):.0f}",
        f"{statistics.median(map(tok_s, recs)):.1f}",
        "yes" if all(ids(r) == reference for r in recs) else "NO",
    ]
