"""GPU step costs and throughput, on random weights of realistic shapes (run by scripts/gpu_check.sh).

    python3 scripts/bench_gpu.py --tokenizer <folder with SmolLM2's tokenizer files> --out <dir>

No checkpoint needs to travel: a ~1B-shape Llama target (hidden 2048, 16 layers, 32/8 heads, MLP 8192) and
a 135M-shape draft (SmolLM2-135M's shape: hidden 576, 30 layers, 9/3 heads, MLP 1536) are built from random
weights in bf16, with SmolLM2's real tokenizer (vocabulary 49152), so forwards, lm_head and grammar masks cost
what they cost on real models of those sizes. Random weights say nothing about acceptance: draft rows use
either the random draft (acceptance ~0: pure overhead) or the target as its own draft (high acceptance, not
exactly 1: the draft runs 1-token and the verify (k+1)-token bf16 kernels, and random weights give near-flat
logits where argmax can flip; the measured acceptance is reported).

Writes <out>/gpu_bench.json and <out>/gpu_bench.md:
  forward ms  ModelRunner forwards, batch 1 and 8, 1 and k+1 tokens, eager vs CUDA graphs (median of CUDA-event
              timings) -> c = draft/target per token, v = verify(k+1)/decode(1), graph gain
  engine      Engine tok/s, ignore_eos, greedy: target only eager vs graphs; JSON-guided vs unguided; random
              draft k=3; self-draft k=3; batch 1 and 8
Each section is independent: a failure is written down and the next runs.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from benchlib import machine, versions

SHAPES = {
    "target-1B": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=8192),
    "draft-135M": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       intermediate_size=1536),
}


def build_checkpoint(root: Path, name: str, tokenizer_dir: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    path = root / name
    cfg = AutoConfig.for_model("llama", vocab_size=49152, max_position_embeddings=8192, bos_token_id=1,
                               eos_token_id=2, tie_word_embeddings=True, torch_dtype="bfloat16", **SHAPES[name])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "vocab.json" or f.name == "merges.txt":
            shutil.copy(f, path / f.name)
    return path


def cuda_ms(fn, repeats: int = 20) -> float:
    """Median ms of fn() by CUDA events, after 3 warm-ups."""
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
    from specgram.model.runner import ModelRunner

    rows = []
    dev = torch.device("cuda")
    for name, path in ckpts.items():
        for graphs in (False, True):
            r = ModelRunner.from_pretrained(path, 8, context + 64, dev, torch.bfloat16, k + 1 if graphs else 0)
            for b in (1, 8):
                prompt = [[(7 * i + j) % 40000 + 100 for j in range(context)] for i in range(b)]
                r.forward_rows(prompt, list(range(b)), [0] * b, last_only=True)            # prefill (eager)
                for width in (1, k + 1):
                    toks = [[(i + j) % 40000 + 100 for j in range(width)] for i in range(b)]
                    ms = cuda_ms(lambda r=r, toks=toks, b=b, width=width:
                                 r.forward_rows(toks, list(range(b)), [context] * b, last_only=width == 1))
                    rows.append(dict(model=name, graphs=graphs, batch=b, width=width, ms=ms))
                    print(f"# forward {name} graphs={graphs} b={b} width={width}: {ms:.2f} ms", flush=True)
            del r
            torch.cuda.empty_cache()
    return rows


def engine_runs(ckpts: dict[str, Path], max_tokens: int, k: int) -> list[dict]:
    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine
    from specgram.engine.generate import generate
    from specgram.request import SamplingParams

    target = str(ckpts["target-1B"])
    configs = [  # name, engine settings, request settings
        ("target only, eager", dict(cuda_graphs=False), dict(num_draft_tokens=0)),
        ("target only, CUDA graphs", dict(cuda_graphs=True), dict(num_draft_tokens=0)),
        ("JSON-guided, eager", dict(cuda_graphs=False), dict(num_draft_tokens=0, guide_type="json", guide="")),
        ("JSON-guided, CUDA graphs", dict(cuda_graphs=True), dict(num_draft_tokens=0, guide_type="json", guide="")),
        (f"random 135M draft k={k}, graphs", dict(cuda_graphs=True, draft_checkpoint=str(ckpts["draft-135M"])),
         dict(num_draft_tokens=k, drafter="draft_model")),
        (f"self-draft k={k} (target as its own draft), graphs", dict(cuda_graphs=True, draft_checkpoint=target),
         dict(num_draft_tokens=k, drafter="draft_model")),
    ]
    prompts = [[(13 * i + j) % 40000 + 100 for j in range(200)] for i in range(8)]
    rows = []
    for name, eng_kw, req_kw in configs:
        eng = Engine.from_config(EngineConfig(checkpoint=target, device="cuda", dtype="bfloat16", max_slots=8,
                                              max_seq_len=512, max_draft_len=8, **eng_kw))
        for b in (1, 8):
            def run(n_tokens, eng=eng, req_kw=req_kw, b=b):   # bound now: called within this iteration
                reqs = [eng.make_request(SamplingParams(max_tokens=n_tokens, ignore_eos=not req_kw.get("guide_type"),
                                                        **req_kw), prompt_ids=p) for p in prompts[:b]]
                t0 = time.perf_counter()
                generate(eng, reqs)
                torch.cuda.synchronize()
                return time.perf_counter() - t0, sum(len(r.output_ids) for r in reqs), reqs
            run(8)                                                              # warm-up, graph captures
            dt, n, reqs = run(max_tokens)
            drafted = sum(r.spec.drafted for r in reqs)
            acc = sum(r.spec.accepted for r in reqs) / drafted if drafted else None
            rows.append(dict(config=name, batch=b, tok_s=n / dt, tokens=n, seconds=dt, acceptance=acc))
            print(f"# engine {name} b={b}: {n / dt:.1f} tok/s ({n} tokens)", flush=True)
        del eng
        torch.cuda.empty_cache()
    return rows


def report(res: dict, k: int) -> str:
    L = [f"# GPU check: {res['env']}", "", f"Command: `{res['command']}`", ""]
    f = res.get("forward")
    if isinstance(f, list):
        L += ["## Forward cost (ms, median of 20, CUDA events; bf16, context 512)", "",
              "| model | batch | width | eager ms | CUDA graphs ms | graph gain |", "|---|---|---|---|---|---|"]
        idx = {(r["model"], r["graphs"], r["batch"], r["width"]): r["ms"] for r in f}
        for (m, g, b, w), ms in idx.items():
            if not g and (m, True, b, w) in idx:
                graphed = idx[(m, True, b, w)]
                L.append(f"| {m} | {b} | {w} | {ms:.2f} | {graphed:.2f} | {ms / graphed:.2f}× |")
        for b in (1, 8):
            for g in (False, True):
                t1, tk = idx.get(("target-1B", g, b, 1)), idx.get(("target-1B", g, b, k + 1))
                d1 = idx.get(("draft-135M", g, b, 1))
                if t1 and tk and d1:
                    L.append(f"\nbatch {b}, {'graphs' if g else 'eager'}: c = draft/target = {d1 / t1:.2f}, "
                             f"v = verify({k + 1})/decode(1) = {tk / t1:.2f}")
    else:
        L += [f"Forward costs failed: `{f}`"]
    e = res.get("engine")
    if isinstance(e, list):
        L += ["", "## Engine throughput (greedy, random weights)", "", "| config | batch | tok/s | acceptance |",
              "|---|---|---|---|"]
        for r in e:
            acc = "–" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
            L.append(f"| {r['config']} | {r['batch']} | {r['tok_s']:.1f} | {acc} |")
    else:
        L += ["", f"Engine runs failed: `{e}`"]
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="folder with SmolLM2-135M-Instruct's tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = dict(command="python3 " + " ".join(sys.argv),
               env=f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}; {machine()}; {versions()}")
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = {n: build_checkpoint(Path(tmp), n, Path(args.tokenizer)) for n in SHAPES}
        for section, fn in (("forward", lambda: forward_costs(ckpts, args.k, 512)),
                            ("engine", lambda: engine_runs(ckpts, args.max_tokens, args.k))):
            try:
                res[section] = fn()
            except Exception as e:  # noqa: BLE001 - record it, go on with the next section
                traceback.print_exc()
                res[section] = repr(e)
            (out / "gpu_bench.json").write_text(json.dumps(res, indent=1))
            (out / "gpu_bench.md").write_text(report(res, args.k))
    print(report(res, args.k))


if __name__ == "__main__":
    main()
