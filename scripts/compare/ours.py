"""Our engine, two ways: in process (specgram.Engine driven directly) and through a real tritonserver (gRPC
streaming, the `llm` model). Same cases, same settings; both return benchlib run records."""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchlib import BENCH_ENGINE, REPO

# config name -> (drafter, k; -1 = auto). "grammar" = grammar-forced tokens only; every drafter also drafts
# forced tokens first under a guide. int8 = an int8 dynamic-quantized copy of the target as the draft model.
CONFIGS = {
    "target only": (None, 0),
    "ngram k4": ("ngram", 4),
    "ngram auto": ("ngram", -1),
    "int8 draft k2": ("draft_model", 2),
    "grammar-forced k4": ("grammar", 4),
}


def configs_for(guided: bool) -> list[str]:
    return [c for c in CONFIGS if guided or CONFIGS[c][0] != "grammar"]


def record(system, config, guided, concurrency, wall, reqs, drafted, accepted, dtype="float32") -> dict:
    drafter, k = CONFIGS[config]
    return dict(system=system, config=config, guided=guided, drafter=drafter, k=k, concurrency=concurrency,
                dtype=dtype, wall_s=wall, drafted=drafted, accepted=accepted, requests=reqs)


# ---------------------------------------------------------------------------------------------- in process

def make_engine(model: str, max_seq_len: int, max_tokens: int, slots: int):
    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine

    return Engine.from_config(EngineConfig(checkpoint=model, device="cpu", dtype="float32", max_slots=slots,
                                           max_seq_len=max_seq_len, max_draft_len=8, default_max_tokens=max_tokens,
                                           drafter="ngram", draft_quantization="int8", **BENCH_ENGINE))


def run_inprocess(engine, tok, cases, config, guided, concurrency, max_tokens) -> dict:
    """Closed loop: at most `concurrency` requests in the engine; a finished one is replaced by the next case
    before the next step (what `concurrency` clients that resend at once would do)."""
    from benchlib import make_requests

    from specgram.engine.generate import generate

    drafter, k = CONFIGS[config]
    reqs = make_requests(engine, [c["prompt_ids"] for c in cases], max_tokens, drafter, k,
                         [c["guide"] for c in cases] if guided else None)
    run = generate(engine, reqs, concurrency)
    if run.errors:
        raise RuntimeError(f"{config}: {run.errors[0]}")
    done = [dict(case=i, ids=g.token_ids, ttft_s=g.first_token_s, latency_s=g.latency_s, finish=g.final.finish_reason,
                 text=tok.decode(g.token_ids, skip_special_tokens=True)) for i, g in enumerate(run.generations)]
    return record("ours in-process", config, guided, concurrency, run.wall_s, done,
                  sum(g.spec.drafted for g in run.generations), sum(g.spec.accepted for g in run.generations))


# ---------------------------------------------------------------------------------------------- tritonserver

def bench_repository(model: str, max_seq_len: int, max_tokens: int, slots: int) -> Path:
    """A copy of model_repository/ whose `llm` loads the same engine settings as run_inprocess (int8 draft
    available, n-gram default; requests pick their drafter)."""
    root = Path(tempfile.mkdtemp(prefix="bench-repo-"))
    shutil.copytree(REPO / "model_repository" / "llm", root / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    cfg = root / "llm" / "config.pbtxt"
    text = cfg.read_text()
    for key, value in dict(checkpoint=str(Path(model).resolve()), dtype="float32", max_slots=str(slots),
                           max_seq_len=str(max_seq_len), default_max_tokens=str(max_tokens), drafter="ngram",
                           draft_quantization="int8", device="cpu", **BENCH_ENGINE).items():
        text, n = re.subn(rf'(key: "{key}", value: {{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        if n != 1:
            raise RuntimeError(f"config.pbtxt has no single parameter {key!r}")
    cfg.write_text(text)
    return root


def run_triton(url, cases, config, guided, concurrency, max_tokens) -> dict:
    from collect import errors_of, ids_of, last_value, stream_infer, text_of

    drafter, k = CONFIGS[config]

    def one(i: int) -> dict:
        case = cases[i]
        inputs = {"text_input": case["prompt"], "apply_chat_template": True, "stream": True, "max_tokens": max_tokens,
                  "num_draft_tokens": k, "drafter": drafter or "ngram"}
        if guided:
            inputs.update(guided_decoding_guide_type="json_schema", guided_decoding_guide=case["guide"])
        resps = stream_infer(url, inputs, timeout=600)
        if errors_of(resps):
            raise RuntimeError(f"{config}: {errors_of(resps)}")
        first = next(r["time"] for r in resps if r["outputs"].get("output_ids") is not None
                     and r["outputs"]["output_ids"].size)
        return dict(case=i, ids=ids_of(resps), text=text_of(resps), ttft_s=first, latency_s=resps[-1]["time"],
                    finish=last_value(resps, "finish_reason"),
                    drafted=int(last_value(resps, "spec_drafted_tokens", 0)),
                    accepted=int(last_value(resps, "spec_accepted_tokens", 0)))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        reqs = list(pool.map(one, range(len(cases))))
    wall = time.perf_counter() - t0
    drafted, accepted = sum(r.pop("drafted") for r in reqs), sum(r.pop("accepted") for r in reqs)
    return record("ours via Triton", config, guided, concurrency, wall, reqs, drafted, accepted)

