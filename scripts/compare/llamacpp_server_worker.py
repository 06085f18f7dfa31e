"""The compare scenario's llama.cpp draft-model peer: llama.cpp's own server (llama-server, built by
scripts/compare/setup_llamacpp_server.sh from the same source as the llama-cpp-python rows) with a draft GGUF;
standard library only, standalone. Reads a job JSON, writes run records (scripts/benchlib/run.py) as JSON, as
scripts/compare/llamacpp_worker.py does:

    python3 scripts/compare/llamacpp_server_worker.py job.json out.json

job: {server: path, gguf: {label: path}, draft: path, k, max_tokens, threads, guided: [false, true], eos: [..],
      cases: [{name, guide, prompt_ids}]}
Per GGUF, two llama-servers on localhost, one slot and no prompt cache each (--cache-ram 0), one after the other,
system "llama.cpp <label> (llama-server)": the target alone, row "target only", which also sets the server against
llama-cpp-python on the same file; then with the draft model (--spec-type draft-simple: a separate draft model;
--spec-draft-model, --spec-draft-n-max k, the rest its defaults; this build takes no speculative settings per
request), row "draft model k<k>". Each server's log goes next to out.json. Every run is concurrency 1 (the cases one
after another). Each request: POST /completion with the prompt's token ids, greedy (temperature 0, top_k 1),
n_predict max_tokens, cache_prompt false (no request reuses an earlier one's prompt prefix, as in every other row),
streamed (time to first token), return_tokens (the ids); guided: json_schema, which the server turns into its
grammar (a schema it rejects: the case runs without one, named in no_grammar). drafted / accepted: the server's own
counts (timings.draft_n, draft_n_accepted).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchlib.workload: stdlib-only at import


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(job: dict, gguf: str, n_ctx: int, k: int, log: Path):
    """llama-server for gguf, with the job's draft model drafting k tokens a step where k > 0 (none where 0), its
    log to `log`; yields its port once /health answers 200, and stops it on leaving (killed if it does not stop)."""
    port = free_port()
    t = str(job["threads"])
    cmd = [job["server"], "-m", gguf, "-t", t, "-tb", t, "-c", str(n_ctx), "-np", "1", "--no-webui"]
    cmd += ["--cache-ram", "0"]  # no prompt cache in RAM either: every request prefills its prompt, as elsewhere
    if k:
        cmd += ["--spec-type", "draft-simple", "--spec-draft-model", job["draft"], "--spec-draft-n-max", str(k)]
        cmd += ["-td", t, "-tbd", t]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_ready(proc, port, log)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_ready(proc: subprocess.Popen, port: int, log: Path, limit_s: float = 600) -> None:
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama-server did not become ready in {limit_s:.0f} s")


def complete(port: int, body: dict) -> tuple[list[int], str, float, float, dict]:
    """One streamed /completion -> (ids, text, ttft_s, latency_s, the last event: stop reason, timings). Raises
    ValueError on an HTTP error (a rejected schema), RuntimeError on an error event, a stream that ends without
    its last event, or fewer ids than the server says it decoded (an id it held back and never streamed)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise ValueError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ids: list[int] = []
    text: list[str] = []
    ttft, last = None, None
    for raw in resp:  # server-sent events: "data: {...}" lines
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"llama-server: {str(event['error'])[:300]}")
        if event.get("tokens"):
            ttft = time.perf_counter() - t0 if ttft is None else ttft
            ids.extend(int(t) for t in event["tokens"])
        text.append(event.get("content", ""))
        if event.get("stop"):
            last = event
            break
    latency = time.perf_counter() - t0
    if last is None:
        raise RuntimeError(f"llama-server: the stream ended without its last event ({len(ids)} ids)")
    if body.get("return_tokens") and len(ids) != last.get("tokens_predicted", len(ids)):
        raise RuntimeError(f"llama-server: {len(ids)} ids streamed of {last['tokens_predicted']} decoded")
    return ids, "".join(text), ttft if ttft is not None else latency, latency, last


def one_request(port: int, case: dict, k: int, max_tokens: int, eos: set[int], schema) -> dict:
    from benchlib.workload import trim_at_eos

    body = dict(
        prompt=case["prompt_ids"],
        n_predict=max_tokens,
        temperature=0.0,
        top_k=1,
        cache_prompt=False,
        stream=True,
        return_tokens=True,
    )
    if schema is not None:
        body["json_schema"] = schema
    ids, text, ttft, latency, last = complete(port, body)
    gen = trim_at_eos(ids, eos)
    timings = last.get("timings", {})
    finish = "stop" if last.get("stop_type") in ("eos", "word") or len(gen) < len(ids) else "length"
    out = dict(ids=gen, text=text, ttft_s=ttft, latency_s=latency, finish=finish)
    if k:  # a server with the draft model
        out["drafted"], out["accepted"] = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    return out


def run(port, cases, schemas, k, guided, max_tokens, eos, label) -> dict:
    from benchlib.run import peer_run

    return peer_run(
        cases,
        lambda i, c: one_request(port, c, k, max_tokens, eos, schemas[i] if guided else None),
        system=f"llama.cpp {label} (llama-server)",
        config=f"draft model k{k}" if k else "target only",
        guided=guided,
        drafter="draft model" if k else None,
        k=k,
        dtype=label,
    )


def accepted_schemas(port: int, cases: list[dict]) -> tuple[list, dict]:
    """Each case's schema (parsed), or None where the server rejects it (no_grammar: case -> its error), tried with
    a 1-token request before any timing."""
    schemas, no_grammar = [], {}
    for c in cases:
        schema = json.loads(c["guide"])
        try:
            complete(
                port, dict(prompt=c["prompt_ids"][:8], n_predict=1, json_schema=schema, cache_prompt=False, stream=True)
            )
            schemas.append(schema)
        except ValueError as e:
            schemas.append(None)
            no_grammar[c["name"]] = str(e)[:160]
    return schemas, no_grammar


def main() -> None:
    job = json.load(open(sys.argv[1]))
    out_path = Path(sys.argv[2])
    eos = set(job["eos"])
    cases = job["cases"]
    n_ctx = max(len(c["prompt_ids"]) for c in cases) + job["max_tokens"] + 64  # + room for a last draft
    results, no_grammar, schemas = [], {}, [None] * len(cases)
    for label, path in job["gguf"].items():
        for k in (0, job["k"]):  # the server alone, then with the draft model (a server's speculation is fixed)
            t0 = time.perf_counter()
            with serving(job, path, n_ctx, k, out_path.with_suffix(f".server-k{k}.log")) as port:
                print(f"# llama-server ({job['source']}) {label} k={k}: ready in {time.perf_counter() - t0:.1f} s")
                if any(job["guided"]) and not k:
                    schemas, no_grammar = accepted_schemas(port, cases)
                for guided in job["guided"]:
                    run(port, cases[:2], schemas, k, guided, 8, eos, label)  # warm-up
                    r = run(port, cases, schemas, k, guided, job["max_tokens"], eos, label)
                    toks = sum(len(q["ids"]) for q in r["requests"])
                    print(f"# {r['system']} {r['config']} guided={guided} c=1: {toks / r['wall_s']:.1f} tok/s")
                    results.append(r)
                    out_path.write_text(json.dumps(dict(results=results, no_grammar=no_grammar)))


if __name__ == "__main__":
    main()
