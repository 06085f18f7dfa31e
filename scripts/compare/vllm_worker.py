"""The compare scenario's vLLM peer: vLLM's CPU build on the same cases; runs inside build/peers/vllm
(scripts/compare/setup_vllm.sh), never in the project venv, standalone. Reads a job JSON, writes run records
(scripts/benchlib/run.py) as JSON:

    build/peers/vllm/bin/python scripts/compare/vllm_worker.py job.json out.json

job: {model, dtype, max_tokens, concurrency: [..], speculative: [null | k], guided: [false, true],
      cases: [{name, guide, prompt_ids}]}
One LLM engine per (dtype, speculative) setting (an engine takes 75-110 s to start here). Requests are driven
step by step through llm.llm_engine (add_request / step) so that TTFT and finish times are seen per request;
a closed loop keeps `concurrency` requests in flight. Draft/accept counts come from vLLM's own Prometheus
counters (vllm:spec_decode_num_draft_tokens / _num_accepted_tokens), read before and after each run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchlib.workload: stdlib-only at import

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def counters(llm) -> dict[str, float]:
    out = {}
    for m in llm.get_metrics():
        if m.name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            out[m.name] = out.get(m.name, 0) + getattr(m, "value", 0)
    return out


def run(llm, tok, eos, cases, guided, k, concurrency, max_tokens, dtype) -> dict:
    from benchlib.workload import trim_at_eos
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    engine = llm.llm_engine
    before = counters(llm)
    todo = list(range(len(cases)))
    live: dict[str, dict] = {}
    done = []
    t_start = time.perf_counter()
    while todo or live:
        while todo and len(live) < concurrency:
            i = todo.pop(0)
            so = StructuredOutputsParams(json=cases[i]["guide"]) if guided else None
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=so)
            rid = f"r{i}-{time.perf_counter_ns()}"
            live[rid] = dict(case=i, t0=time.perf_counter(), ttft_s=None)
            engine.add_request(rid, {"prompt_token_ids": cases[i]["prompt_ids"]}, params)
        for out in engine.step():
            r = live.get(out.request_id)
            if r is None:
                continue
            now = time.perf_counter()
            ids = list(out.outputs[0].token_ids)
            if ids and r["ttft_s"] is None:
                r["ttft_s"] = now - r["t0"]
            if out.finished:
                gen = trim_at_eos(ids, eos)
                r.update(
                    ids=gen,
                    text=tok.decode(gen, skip_special_tokens=True),
                    latency_s=now - r.pop("t0"),
                    finish=out.outputs[0].finish_reason,
                )
                done.append(live.pop(out.request_id))
    wall = time.perf_counter() - t_start
    after = counters(llm)
    drafted = after.get("vllm:spec_decode_num_draft_tokens", 0) - before.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = after.get("vllm:spec_decode_num_accepted_tokens", 0) - before.get(
        "vllm:spec_decode_num_accepted_tokens", 0
    )
    config = "target only" if not k else f"ngram k{k}"
    return dict(
        system=f"vLLM-CPU {dtype}",
        config=config,
        guided=guided,
        drafter="ngram" if k else None,
        k=k or 0,
        concurrency=concurrency,
        dtype=dtype,
        wall_s=wall,
        drafted=int(drafted) if k else None,
        accepted=int(accepted) if k else None,
        requests=sorted(done, key=lambda r: r["case"]),
    )


def main() -> None:
    job = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    import vllm
    from transformers import AutoTokenizer
    from vllm import LLM

    tok = AutoTokenizer.from_pretrained(job["model"])
    eos = set(job["eos"])
    results = []
    max_len = max(len(c["prompt_ids"]) for c in job["cases"]) + job["max_tokens"] + 16
    for k in job["speculative"]:
        spec = (
            None
            if not k
            else {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
        )
        t0 = time.perf_counter()
        # Prefix caching off, as in our runs (benchlib.workload.BENCH_ENGINE): every run repeats the same prompts, and
        # vLLM's default (on, 128-token blocks on CPU) would let a later run skip prefills an earlier one paid.
        llm = LLM(
            model=job["model"],
            dtype=job["dtype"],
            max_model_len=max_len,
            seed=0,
            speculative_config=spec,
            disable_log_stats=False,
            max_num_seqs=max(job["concurrency"]),
            enable_prefix_caching=False,
        )
        print(
            f"# vLLM {vllm.__version__} {job['dtype']} speculative={k}: engine ready in "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        for guided in job["guided"]:
            run(llm, tok, eos, job["cases"][:2], guided, k, 2, 8, job["dtype"])  # warm-up
            for c in job["concurrency"]:
                r = run(llm, tok, eos, job["cases"], guided, k, c, job["max_tokens"], job["dtype"])
                toks = sum(len(q["ids"]) for q in r["requests"])
                print(
                    f"# {r['system']} {r['config']} guided={guided} c={c}: {toks / r['wall_s']:.1f} tok/s", flush=True
                )
                results.append(r)
                json.dump(dict(vllm=vllm.__version__, results=results), open(out_path, "w"))
        del llm
        import gc

        gc.collect()


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    main()
