"""How far each weight form is from float32, and what it costs: top-1 agreement and perplexity over a text, bytes and
decode time.

    python scripts/bench.py weight_forms --model models/Qwen2.5-Coder-1.5B-Instruct \
        --gguf models/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

One process, one model at a time (native CPU forward): --model in float32 (the reference) and in each of --forms
(int8-blocks: int8 weights x int8 activations, a scale per block of 256 inputs, what `weights int8` serves on VNNI;
int8-dynamic: x int16 activations per row, the int8 draft copy's; int4: 4-bit groups x int8 activations per 256),
and --gguf as served (its own forms: int4 where Q4_K, int8 elsewhere) and in int4 throughout. Each reads the same
--tokens tokens of English text (Python's own reference text, pydoc_data.topics) in chunks of 256, teacher-forced:
per position, whether its top-1 token is the reference's, and the log-probability of the text's next token
(perplexity = exp of their negative mean). Then --decode single-token steps at one stream: the median step beside
the memory bound (the matmul weights' bytes over a plain read's bandwidth, same process). A checkpoint de-quantized
from a GGUF file (scripts/fetch_model.py) is that file's values in float32: against it, a form's error is that of
re-quantizing those values, and the GGUF as served differs only where its blocks are not Q4_K (int8 there) and by
its quantized activations."""

from __future__ import annotations

import json
import time

from .. import report

SHARED = {}
QUICK = {"tokens": 256, "decode": 4}
QUICK_HELP = "256 tokens, 4 decode steps"


def add_options(ap) -> None:
    ap.add_argument("--gguf", default="", help="a GGUF file of the same model: served as it comes, and in int4")
    ap.add_argument("--forms", nargs="+", default=["int8-blocks", "int8-dynamic", "int4"], help="runner forms")
    ap.add_argument("--tokens", type=int, default=1024, help="text tokens scored")
    ap.add_argument("--decode", type=int, default=16, help="single-token decode steps timed")


def _text_ids(tokenizer, n: int) -> list[int]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return tokenizer(text[: n * 8]).input_ids[:n]


def _runner(path: str, form: str, positions: int):
    import torch

    from specgram.engine.loading import model_of
    from specgram.model.choice import choose
    from specgram.model.runner import ModelRunner
    from specgram.model.source import open_source

    model, tensors = model_of(open_source(path), torch.device("cpu"), torch.float32, True)
    forward = choose(model.config, torch.device("cpu"), torch.float32, "native", form)
    return ModelRunner(model, 1, positions, forward, tensors=tensors)


def _score(runner, ids: list[int], chunk: int = 256):
    """-> (top-1 ids [T - 1], log-probabilities of ids[1:] [T - 1]) teacher-forced."""
    import torch

    tops, logp = [], []
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start : min(start + chunk, len(ids) - 1)]
        logits = runner.forward_rows([piece], [0], [start], last_only=False)[0].float()
        nxt = torch.tensor(ids[start + 1 : start + 1 + len(piece)])
        tops.append(logits.argmax(-1))
        logp.append(torch.log_softmax(logits, -1).gather(1, nxt[:, None])[:, 0])
    return torch.cat(tops), torch.cat(logp)


def _decode(runner, ids: list[int], steps: int) -> tuple[float, float, int]:
    """-> (median decode step s, memory bound s, matmul weight bytes)."""
    import torch

    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        runner.forward_rows([[ids[i]]], [0], [len(ids) - 1 + i], last_only=True)
        times.append(time.perf_counter() - t)
    buf, best = torch.ones(64 * 2**20), float("inf")
    for _ in range(4):
        t = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t)
    weights = sum(b.numel() * b.element_size() for m in runner.linear_layers() for b in m.buffers() if b is not None)
    steps_s = sorted(times[2:])
    return steps_s[len(steps_s) // 2], weights / (buf.numel() * 4 / best), weights


def run(args) -> None:
    import gc
    import math

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from specgram.model.source import open_source

    ids = _text_ids(open_source(args.model).tokenizer(), args.tokens)
    positions = len(ids) + args.decode + 8
    settings = [("float32", args.model, "auto")] + [(f, args.model, f) for f in args.forms]
    if args.gguf:
        settings += [("GGUF as served", args.gguf, "gguf"), ("GGUF in int4", args.gguf, "int4")]
    ref_top, rows, raw = None, [], []
    for label, path, form in settings:
        t0 = time.perf_counter()
        runner = _runner(path, form, positions)
        load_s = time.perf_counter() - t0
        top, logp = _score(runner, ids)
        step, bound, nbytes = _decode(runner, ids, args.decode)
        if ref_top is None:
            ref_top, ref_ppl = top, math.exp(-logp.mean().item())
        agree, ppl = (top == ref_top).float().mean().item(), math.exp(-logp.mean().item())
        r = dict(setting=label, path=path, form=form, agree=agree, ppl=ppl, step_s=step, bound_s=bound,
                 weight_bytes=nbytes, load_s=load_s)  # fmt: skip
        raw.append(r)
        report.log(json.dumps(r))
        rows.append([label, form, f"{nbytes / 2**30:.2f}", f"{agree * 100:.1f}%", f"{ppl:.3f}",
                     f"{(ppl / ref_ppl - 1) * 100:+.2f}%", f"{step * 1e3:.0f}", f"{step / bound:.2f}×",
                     f"{load_s:.1f}"])  # fmt: skip
        del runner
        gc.collect()
    lines = report.header("Weight forms", args, f"{args.model}, {len(ids)} text tokens, {args.decode} decode steps")
    lines += report.table(
        ["setting", "runner form", "matmul weights GiB", "top-1 = float32", "perplexity", "Δ perplexity",
         "decode ms/step", "× bound", "load s"],
        rows,
    )  # fmt: skip
    report.write(args, lines, dict(rows=raw))
