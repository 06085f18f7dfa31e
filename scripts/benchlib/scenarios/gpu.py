"""GPU step costs and throughput, on random weights of realistic shapes (run by scripts/gpu_check.sh).

    python3 scripts/bench.py gpu --tokenizer <folder with SmolLM2's tokenizer files> --raw <dir>

No checkpoint needs to travel: a ~1B-shape Llama target (hidden 2048, 16 layers, 32/8 heads, MLP 8192) and
a 135M-shape draft (SmolLM2-135M's shape: hidden 576, 30 layers, 9/3 heads, MLP 1536) are built from random
weights in bf16, with SmolLM2's real tokenizer (vocabulary 49152), so forwards, lm_head and grammar masks cost
what they cost on real models of those sizes. Random weights say nothing about acceptance: draft rows use
either the random draft (acceptance ~0: pure overhead) or the target as its own draft (high acceptance, not
exactly 1: the draft runs 1-token and the verify (k+1)-token bf16 kernels, and random weights give near-flat
logits where argmax can flip; the measured acceptance is reported).

Writes <raw>/report.md and <raw>/gpu.json:
  forward ms  ModelRunner forwards, batch 1 and 8, 1 and k+1 tokens, eager vs CUDA graphs (median of CUDA-event
              timings) -> c = draft/target per token, v = verify(k+1)/decode(1), graph gain
  engine      Engine tok/s, ignore_eos, greedy: target only eager vs graphs; JSON-guided vs unguided; random
              draft k; self-draft k; all requests at once, batch 1 and 8
Each section is independent: a failure is written down and the next runs.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import traceback
from pathlib import Path

from .. import report

SHARED = {"max_tokens": 64}
QUICK = {"max_tokens": 16}
QUICK_HELP = "16 tokens per engine run"
ENGINE = False
SHAPES = {
    "target-1B": dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192
    ),
    "draft-135M": dict(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536
    ),
}


def add_options(ap) -> None:
    ap.add_argument("--tokenizer", required=True, help="folder with SmolLM2-135M-Instruct's tokenizer files")
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step in the speculative rows")


def build_checkpoint(root: Path, name: str, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = root / name
    cfg = AutoConfig.for_model(
        "llama",
        vocab_size=49152,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        **SHAPES[name],
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(path)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name in ("vocab.json", "merges.txt"):
            shutil.copy(f, path / f.name)
    return path


def cuda_ms(fn, repeats: int = 20) -> float:
    """Median ms of fn() by CUDA events, after 3 warm-ups."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def forward_costs(ckpts: dict[str, Path], k: int, context: int) -> list[dict]:
    import torch

    from specgram.model.choice import choose_for
    from specgram.model.runner import ModelRunner
    from specgram.model.source import open_source
    from specgram.model.whole import load_model

    rows = []
    for name, path in ckpts.items():
        for graphs in (False, True):
            m = load_model(open_source(path), torch.device("cuda"), torch.bfloat16)
            r = ModelRunner(m, 8, context + 64, choose_for(m, static_width=k + 1 if graphs else 0))
            for b in (1, 8):
                prompt = [[(7 * i + j) % 40000 + 100 for j in range(context)] for i in range(b)]
                r.forward_rows(prompt, list(range(b)), [0] * b, last_only=True)  # prefill (eager)
                for width in (1, k + 1):
                    toks = [[(i + j) % 40000 + 100 for j in range(width)] for i in range(b)]
                    ms = cuda_ms(
                        lambda r=r, toks=toks, b=b, width=width: r.forward_rows(
                            toks, list(range(b)), [context] * b, last_only=width == 1
                        )
                    )
                    rows.append(dict(model=name, graphs=graphs, batch=b, width=width, ms=ms))
                    report.log(f"forward {name} graphs={graphs} b={b} width={width}: {ms:.2f} ms")
            del r
            torch.cuda.empty_cache()
    return rows


def engine_runs(ckpts: dict[str, Path], max_tokens: int, k: int) -> list[dict]:
    import torch

    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine
    from specgram.engine.generate import generate
    from specgram.request import SamplingParams

    target = str(ckpts["target-1B"])
    guided = dict(num_draft_tokens=0, guide_type="json", guide="")
    configs = [  # name, engine settings, request settings
        ("target only, eager", dict(cuda_graphs=False), dict(num_draft_tokens=0)),
        ("target only, CUDA graphs", dict(cuda_graphs=True), dict(num_draft_tokens=0)),
        ("JSON-guided, eager", dict(cuda_graphs=False), guided),
        ("JSON-guided, CUDA graphs", dict(cuda_graphs=True), guided),
        (
            f"random 135M draft k={k}, graphs",
            dict(cuda_graphs=True, draft_checkpoint=str(ckpts["draft-135M"])),
            dict(num_draft_tokens=k, drafter="draft_model"),
        ),
        (
            f"self-draft k={k} (target as its own draft), graphs",
            dict(cuda_graphs=True, draft_checkpoint=target),
            dict(num_draft_tokens=k, drafter="draft_model"),
        ),
    ]
    prompts = [[(13 * i + j) % 40000 + 100 for j in range(200)] for i in range(8)]
    rows = []
    for name, eng_kw, req_kw in configs:
        eng = Engine.from_config(
            EngineConfig(
                checkpoint=target,
                device="cuda",
                dtype="bfloat16",
                max_slots=8,
                max_seq_len=512,
                max_draft_len=8,
                **eng_kw,
            )
        )
        for b in (1, 8):

            def timed(n_tokens, eng=eng, req_kw=req_kw, b=b):  # bound now: called within this iteration
                reqs = [
                    eng.make_request(
                        SamplingParams(max_tokens=n_tokens, ignore_eos=not req_kw.get("guide_type"), **req_kw),
                        prompt_ids=p,
                    )
                    for p in prompts[:b]
                ]
                t0 = time.perf_counter()
                generate(eng, reqs)
                torch.cuda.synchronize()
                return time.perf_counter() - t0, sum(len(r.output_ids) for r in reqs), reqs

            timed(8)  # warm-up, graph captures
            dt, n, reqs = timed(max_tokens)
            drafted = sum(r.spec.drafted for r in reqs)
            acc = sum(r.spec.accepted for r in reqs) / drafted if drafted else None
            rows.append(dict(config=name, batch=b, tok_s=n / dt, tokens=n, seconds=dt, acceptance=acc))
            report.log(f"engine {name} b={b}: {n / dt:.1f} tok/s ({n} tokens)")
        del eng
        torch.cuda.empty_cache()
    return rows


def render(args, res: dict) -> list[str]:
    k = args.k
    L = report.header(f"GPU check: {res.get('device', '?')}", args)
    f = res.get("forward")
    if isinstance(f, list):
        idx = {(r["model"], r["graphs"], r["batch"], r["width"]): r["ms"] for r in f}
        L += [
            "## Forward cost (ms, median of 20, CUDA events; bf16, context 512)",
            "",
            *report.table(
                ["model", "batch", "width", "eager ms", "CUDA graphs ms", "graph gain"],
                (
                    [m, b, w, f"{ms:.2f}", f"{idx[(m, True, b, w)]:.2f}", f"{ms / idx[(m, True, b, w)]:.2f}×"]
                    for (m, g, b, w), ms in idx.items()
                    if not g and (m, True, b, w) in idx
                ),
            ),
        ]
        for b in (1, 8):
            for g in (False, True):
                t1, tk, d1 = (
                    idx.get(key)
                    for key in (("target-1B", g, b, 1), ("target-1B", g, b, k + 1), ("draft-135M", g, b, 1))
                )
                if t1 and tk and d1:
                    L.append(
                        f"\nbatch {b}, {'graphs' if g else 'eager'}: c = draft/target = {d1 / t1:.2f}, "
                        f"v = verify({k + 1})/decode(1) = {tk / t1:.2f}"
                    )
    else:
        L += [f"Forward costs failed: `{f}`"]
    e = res.get("engine")
    if isinstance(e, list):
        L += [
            "",
            "## Engine throughput (greedy, random weights)",
            "",
            *report.table(
                ["config", "batch", "tok/s", "acceptance"],
                ([r["config"], r["batch"], f"{r['tok_s']:.1f}", report.cell(r["acceptance"], "{:.0%}")] for r in e),
            ),
        ]
    else:
        L += ["", f"Engine runs failed: `{e}`"]
    return L


def run(args) -> int:
    import torch

    res = dict(device=f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = {n: build_checkpoint(Path(tmp), n, Path(args.tokenizer)) for n in SHAPES}
        for section, fn in (
            ("forward", lambda: forward_costs(ckpts, args.k, 512)),
            ("engine", lambda: engine_runs(ckpts, args.max_tokens, args.k)),
        ):
            try:
                res[section] = fn()
            except Exception as e:  # noqa: BLE001 - record it, go on with the next section
                traceback.print_exc()
                res[section], failed = repr(e), True
            report.write(args, render(args, res), res, quiet=True)
    report.write(args, render(args, res), res)
    return 1 if failed else 0
