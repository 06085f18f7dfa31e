"""The compare scenario's OpenVINO GenAI peer: openvino_genai.LLMPipeline on int4 IR exported by optimum-intel from
the same float32 folder; runs inside build/peers/openvino (scripts/compare/setup_openvino.sh), never in the project
venv, standalone. Reads a job JSON, writes run records (scripts/benchlib/run.py) as JSON, as
scripts/compare/llamacpp_worker.py does:

    build/peers/openvino/bin/python scripts/compare/openvino_worker.py job.json out.json

job: {ir: path, draft_ir: path | "", label, bits, max_tokens, threads, lookup: k, draft: k, guided: [false, true],
      eos: [..], cases: [{name, guide, prompt_ids}]}
Rows, system "OpenVINO GenAI <label>": target only; prompt lookup (k drafts, n-grams up to 4, the pipeline built
with prompt_lookup=True); the draft model (draft_ir, k drafts a step, the pipeline built with draft_model=...).
LLMPipeline decodes one prompt at a time here, so every run is concurrency 1: the cases one after another. Each
request feeds the prompt's token ids (TokenizedInputs), greedy, max_new_tokens, stops at EOS; the pipeline keeps no
state between generate() calls (no chat mode), so no request reuses an earlier one's prompt. A streamer takes the
token ids as they come (time to first token). guided: StructuredOutputConfig(json_schema=...), OpenVINO GenAI's own
structured output. drafted / accepted: the pipeline's own counts (its extended perf metrics'
get_num_draft_tokens and get_num_accepted_tokens) where it reports them, else none.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchlib.workload: stdlib-only at import


def streamer_class():
    import openvino_genai as ov

    class Collect(ov.StreamerBase):
        """Keeps the token ids as the pipeline commits them and the time of the first."""

        def __init__(self) -> None:
            super().__init__()
            self.ids: list[int] = []
            self.first: float | None = None

        def write(self, token):
            if self.first is None:
                self.first = time.perf_counter()
            self.ids.extend([int(t) for t in token] if isinstance(token, (list, tuple)) else [int(token)])
            return ov.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    return Collect


def config(mode: str, k: int, max_tokens: int, eos: list[int], guide: str | None):
    import openvino_genai as ov

    c = ov.GenerationConfig()
    c.max_new_tokens = max_tokens
    c.do_sample = False
    c.stop_token_ids = set(eos)
    if mode == "prompt lookup":
        c.num_assistant_tokens, c.max_ngram_size = k, 4  # n-grams up to 4, as llama.cpp's and vLLM's rows
    elif mode == "draft model":
        c.num_assistant_tokens = k
    if guide is not None:
        c.structured_output_config = ov.StructuredOutputConfig(json_schema=guide)
    return c


def one_request(pipe, case: dict, cfg, eos: set[int], collect) -> dict:
    import numpy as np
    import openvino as ov_core
    import openvino_genai as ov
    from benchlib.workload import trim_at_eos

    ids = np.array([case["prompt_ids"]], dtype=np.int64)
    inputs = ov.TokenizedInputs(ov_core.Tensor(ids), ov_core.Tensor(np.ones_like(ids)))
    streamer = collect()
    t0 = time.perf_counter()
    res = pipe.generate(inputs, cfg, streamer)
    latency = time.perf_counter() - t0
    out = [int(t) for t in res.tokens[0]] if res.tokens else streamer.ids
    gen = trim_at_eos(out, eos)
    text = pipe.get_tokenizer().decode(gen, skip_special_tokens=True)
    first = streamer.first - t0 if streamer.first is not None else latency
    finish = "stop" if len(gen) < len(out) or (len(out) < cfg.max_new_tokens) else "length"
    out = dict(ids=gen, text=text, ttft_s=first, latency_s=latency, finish=finish)
    counts = spec_counts(res)
    if counts is not None:
        out["drafted"], out["accepted"] = counts
    return out


def spec_counts(res) -> tuple[int, int] | None:
    """(draft tokens, accepted ones) as the pipeline counts them for this generate(); None where it does not."""
    metrics = getattr(res, "extended_perf_metrics", None)
    try:
        return int(metrics.get_num_draft_tokens()), int(metrics.get_num_accepted_tokens())
    except AttributeError:  # plain perf metrics (no speculation, or a mode that counts none)
        return None


def run(pipe, cases, mode, k, guided, max_tokens, eos, label, bits, collect) -> dict:
    from benchlib.run import peer_run

    def one(_i: int, c: dict) -> dict:
        cfg = config(mode, k, max_tokens, sorted(eos), c["guide"] if guided else None)
        return one_request(pipe, c, cfg, eos, collect)

    return peer_run(
        cases,
        one,
        system=f"OpenVINO GenAI {label}",
        config=f"{mode} k{k}" if mode != "target only" else mode,
        guided=guided,
        drafter=None if mode == "target only" else mode,
        k=0 if mode == "target only" else k,
        dtype=label,
        bits=bits,
    )


def main() -> None:
    job = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    import openvino_genai as ov

    eos = set(job["eos"])
    cases, label = job["cases"], job["label"]
    collect = streamer_class()
    modes = [("target only", 0, {}), ("prompt lookup", job["lookup"], {"prompt_lookup": True})]
    if job.get("draft_ir"):
        modes.append(("draft model", job["draft"], {"draft_model": ov.draft_model(job["draft_ir"], "CPU")}))
    props = {"INFERENCE_NUM_THREADS": job["threads"]}
    results = []
    for mode, k, extra in modes:
        t0 = time.perf_counter()
        pipe = ov.LLMPipeline(job["ir"], "CPU", **extra, **props)
        print(
            f"# openvino-genai {ov.__version__} {label} {mode}: ready in {time.perf_counter() - t0:.1f} s", flush=True
        )
        for guided in job["guided"]:
            run(pipe, cases[:2], mode, k, guided, 8, eos, label, job["bits"], collect)  # warm-up
            r = run(pipe, cases, mode, k, guided, job["max_tokens"], eos, label, job["bits"], collect)
            toks = sum(len(q["ids"]) for q in r["requests"])
            print(f"# {r['system']} {r['config']} guided={guided} c=1: {toks / r['wall_s']:.1f} tok/s", flush=True)
            results.append(r)
            json.dump(dict(openvino=ov.__version__, results=results), open(out_path, "w"))
        del pipe


if __name__ == "__main__":
    main()
