"""Check a checkpoint as this engine serves it: `python -m specgram.check_model PATH [--draft PATH] [--lora FILE]
[--set key=value ...]`.

It loads the checkpoint with the served defaults (and the settings given), then reports in one table:
  load         peak and resident memory of the engine's load, beside the checkpoint's bytes
  logits       per forward (native, PyTorch) and checkpoint (target, draft): prefill, decode and verify rows of a
               ragged batch against transformers' own forward of each sequence (max abs diff, top-1 agreement)
  greedy       the served greedy ids for a few prompts against transformers' greedy continuation
  exact        the same ids at draft lengths 0, 4 and auto, and all prompts in one batch (with each adapter)
  guided       a JSON-schema request (compact layout) finishes and validates
  speed        a decode step at one stream against the memory bound (weight bytes / a plain read's bandwidth)
It exits 1 on a mismatch, naming the first differing position and what to try, and 2 where the server could not
load the checkpoint (saying why). A lossy weight form (int8) is compared with transformers for information only;
its exactness with itself is checked as for any form.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ModelLoadError

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three facts about the Moon:\n1."]
TOKENS = 16  # generated per prompt in the id checks
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "ok", "n"],
    "additionalProperties": False,
}
# logits' max abs diff, relative to their largest magnitude, by the dtype a forward computes in (the reference:
# transformers in float32; the native forward computes in float32 whatever its weights' dtype)
TOL = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}
SERVED_DEFAULTS = dict(  # model_repository/llm/config.pbtxt's engine parameters that differ from EngineConfig's
    device="auto", drafter="auto", draft_quantization="auto", prefix_cache="auto",
    default_num_draft_tokens="auto", default_num_draft_tokens_guided="auto",
)  # fmt: skip


@dataclass
class Row:
    check: str
    what: str
    ok: bool | None  # None: reported, not judged
    detail: str
    hint: str = ""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _checkpoint_bytes(path: str) -> int:
    """The weight files' bytes (safetensors, else PyTorch .bin)."""
    files = list(Path(path).glob("*.safetensors")) or list(Path(path).glob("*.bin")) if path else []
    return sum(f.stat().st_size for f in files)


def _ids(engine, prompt_ids, k: int, drafter=None, lora=None, guide: str | None = None, max_tokens: int = TOKENS):
    """Each prompt's greedy ids through the engine, all submitted together -> (ids, final outputs, texts).
    Unguided requests run to max_tokens (ignore_eos); a guided one ends where its grammar does."""
    from .engine.generate import generate
    from .request import SamplingParams

    params = dict(max_tokens=max_tokens, num_draft_tokens=k, drafter=drafter, lora_name=lora)
    if guide is None:
        params["ignore_eos"] = True
    else:
        params.update(guide_type="json_schema", guide=guide, guide_options=(("json_any_whitespace", False),))
    reqs = [engine.make_request(SamplingParams(**params), prompt_ids=list(p)) for p in prompt_ids]
    run = generate(engine, reqs)
    gens = run.generations
    return [g.token_ids for g in gens], [g.final for g in gens], [g.text for g in gens]


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def check_engine(engine, prompt_ids: list[list[int]], adapters: list[str]) -> tuple[list[Row], list[list[int]]]:
    """The engine's own exactness (draft lengths, batch, adapters), a guided answer, and a decode's speed."""
    rows, base = [], None
    drafter = "draft_model" if "draft_model" in engine.drafters else None
    for lora in [None, *adapters]:
        alone = [_ids(engine, [p], 0, lora=lora)[0][0] for p in prompt_ids]
        base = base or alone
        tried = [(f"k={k}", [_ids(engine, [p], k, drafter, lora)[0][0] for p in prompt_ids]) for k in (4, -1)]
        tried.append(("batched, k=auto", _ids(engine, prompt_ids, -1, lora=lora)[0]))
        for name, got in tried:
            bad = next((i for i, (a, g) in enumerate(zip(alone, got, strict=True)) if a != g), None)
            what = f"{name} vs k=0 alone" + (f", adapter {lora}" if lora else "")
            detail = "identical ids" if bad is None else (
                f"prompt {bad}: first differing position {_first_diff(alone[bad], got[bad])}"
            )  # fmt: skip
            hint = "speculation must be exact: serve with default_num_draft_tokens 0 and report the checkpoint"
            rows.append(Row("exact", what, bad is None, detail, "" if bad is None else hint))
    rows.append(_guided(engine, prompt_ids[0]))
    rows.append(_speed(engine, prompt_ids[0]))
    return rows, base


def _guided(engine, prompt: list[int]) -> Row:
    import jsonschema

    (_,), (final,), (text,) = _ids(engine, [prompt], -1, guide=json.dumps(SCHEMA), max_tokens=96)
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return Row("guided", "json_schema, k=auto", True, f"valid: {text.strip()[:60]}")
    except (ValueError, jsonschema.ValidationError) as e:
        why = final.error or f"finish_reason {final.finish_reason}, {type(e).__name__}"
        return Row("guided", "json_schema, k=auto", False, f"{why}: {text[:60]!r}", "report the checkpoint")


def _bandwidth() -> float:
    """A plain read's bytes per second here (the best of a few sums of a 256 MiB buffer)."""
    buf = torch.ones(64 * 2**20)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best


def _weight_bytes(runner) -> int:
    """What a decode step streams: the matmul weights in their served form (with scales)."""
    if runner.native is not None:
        mods = runner.native.linear_layers()
        return sum(b.numel() * b.element_size() for m in mods for b in m.buffers() if b is not None)
    from .model.choice import projections

    return sum(p.numel() * p.element_size() for m in projections(runner.model) for p in m.parameters())


def _speed(engine, prompt: list[int]) -> Row:
    if engine.device.type != "cpu":
        return Row("speed", f"decode ({engine.device})", None, "the memory bound is measured on the CPU only")
    from .engine.generate import generate
    from .request import SamplingParams

    req = engine.make_request(SamplingParams(max_tokens=32, ignore_eos=True, num_draft_tokens=0), prompt_ids=prompt)
    run = generate(engine, [req])
    step = sorted(run.step_s[2:])[len(run.step_s[2:]) // 2]  # the median decode step (past prefill)
    bw, weights = _bandwidth(), _weight_bytes(engine.target)
    bound = weights / bw
    detail = f"{step * 1e3:.1f} ms/step = {step / bound:.2f}x the bound ({_gib(weights)} at {bw / 1e9:.0f} GB/s)"
    return Row("speed", f"decode, one stream ({engine.target.linear_kind})", None, detail)


def check_logits(path: str, label: str, ref, dtype, settings, max_seq_len: int, prompt_ids) -> list[Row]:
    """Each forward's prefill, decode and verify rows of `path` (loaded in `dtype`, as served) against `ref`,
    transformers' float32 model of it."""
    from .errors import ModelLoadError
    from .model import reference
    from .model.choice import choose
    from .model.runner import ModelRunner, load_model

    rows = []
    for kind in ("native", "torch"):
        weights = settings.target.weights if kind == "native" and label == "target" else "auto"
        model = load_model(path, settings.device, dtype)
        try:
            choice = choose(model.config, settings.device, dtype, linear=kind, weights=weights)
        except ModelLoadError as e:
            rows.append(Row("logits", f"{label}, {kind}", None, f"not run here: {e}"))
            continue
        runner = ModelRunner(model, len(prompt_ids), max_seq_len, choice)
        extra = [[11, 12, 13, 14]] + [[15]] * (len(prompt_ids) - 1)  # a verify row of 4 beside decode rows of 1
        got = [runner.forward_rows(prompt_ids, list(range(len(prompt_ids))), [0] * len(prompt_ids), False)]
        got.append(runner.forward_rows(extra, list(range(len(prompt_ids))), [len(p) for p in prompt_ids], False))
        diff, agree, total, scale = 0.0, 0, 0, 0.0
        for b, p in enumerate(prompt_ids):
            want = reference.logits(ref, p + extra[b], max_seq_len)
            mine = torch.cat([got[0][b, : len(p)], got[1][b, : len(extra[b])]]).float().cpu()
            diff, scale = max(diff, float((mine - want).abs().max())), max(scale, float(want.abs().max()))
            agree += int((mine.argmax(-1) == want.argmax(-1)).sum())
            total += len(want)
        lossy = weights != "auto"
        ok = None if lossy else diff <= TOL.get(runner.dtype, TOL[torch.bfloat16]) * max(scale, 1.0)
        detail = f"max abs diff {diff:.2e} (logits up to {scale:.1f}), top-1 {agree}/{total}" + (
            f", {weights}: lossy, not judged" if lossy else ""
        )
        hint = "" if ok is not False else (
            "the PyTorch forward agrees: serve with linear torch and report the checkpoint"
            if kind == "native" else "this checkpoint sets something its family reader (model/families.py) misses"
        )  # fmt: skip
        rows.append(Row("logits", f"{label}, {kind}", ok, detail, hint))
        del runner, model
        gc.collect()
    return rows


def check_greedy(ref, dtype, max_seq_len: int, prompt_ids, served: list[list[int]], lossy: bool) -> list[Row]:
    """The served greedy ids against `ref`'s (transformers, float32); a first difference where transformers' own
    top-2 gap is within the served dtype's tolerance is a tie, named and not failed."""
    from .model import reference

    rows = []
    for i, (p, got) in enumerate(zip(prompt_ids, served, strict=True)):
        want, gaps = reference.greedy(ref, p, len(got), max_seq_len)
        at = _first_diff(want, got)
        tie = at < len(want) and gaps[at] <= TOL.get(dtype, TOL[torch.bfloat16])
        ok = None if lossy else (at == len(want) or tie)
        detail = "equal" if at == len(want) else f"first differing position {at} (relative top-2 gap {gaps[at]:.1e})"
        if tie:
            detail += ": a tie within float error"
        rows.append(Row("greedy", f"prompt {i} vs transformers", ok, detail, "" if ok is not False else "see logits"))
    return rows


def run(args) -> list[Row]:
    from .config import EngineConfig
    from .engine.engine import Engine
    from .model.runner import load_model

    params = {**SERVED_DEFAULTS, "checkpoint": args.path, "max_seq_len": str(args.max_seq_len), "max_slots": "4"}
    if args.draft:
        params["draft_checkpoint"] = args.draft
    if args.lora:
        params.update(enable_lora="1", lora_adapters=args.lora)
    params.update(args.set)
    rss0 = _rss()
    engine = Engine.from_config(EngineConfig.from_dict(params))
    load = Row(
        "load", engine.target.linear_kind, None,
        f"peak {_gib(_peak_rss() - rss0)}, resident {_gib(_rss() - rss0)} over the process's own; checkpoints "
        f"{_gib(_checkpoint_bytes(args.path) + _checkpoint_bytes(args.draft))}",
    )  # fmt: skip
    settings, tok, max_seq_len = engine.settings, engine.tokenizer, engine.config.max_seq_len
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    adapters = list(json.loads(Path(args.lora).read_text())) if args.lora else []
    try:
        engine_rows, served = check_engine(engine, prompt_ids, adapters)
    finally:
        engine.close()
    del engine
    gc.collect()
    ref = load_model(args.path, settings.device, torch.float32).eval()  # transformers' own, once per checkpoint
    rows = [load, *check_logits(args.path, "target", ref, settings.dtype, settings, max_seq_len, prompt_ids)]
    rows += check_greedy(ref, settings.dtype, max_seq_len, prompt_ids, served, settings.target.weights != "auto")
    del ref
    gc.collect()
    if args.draft:
        ref = load_model(args.draft, settings.device, torch.float32).eval()
        dtype = settings.draft.dtype if settings.draft is not None else settings.dtype
        rows += check_logits(args.draft, "draft", ref, dtype, settings, max_seq_len, prompt_ids)
    return rows + engine_rows


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def report(rows: list[Row]) -> str:
    mark = {True: "ok", False: "FAIL", None: "-"}
    w = max(len(r.what) for r in rows)
    lines = [f"{'check':7} {'what':{w}}  {'':4}  detail"]
    lines += [f"{r.check:7} {r.what:{w}}  {mark[r.ok]:4}  {r.detail}" for r in rows]
    lines += [f"what to try ({r.check}, {r.what}): {r.hint}" for r in rows if r.ok is False and r.hint]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specgram.check_model", description=__doc__.splitlines()[0])
    ap.add_argument("path", help="the checkpoint folder, as the server's `checkpoint` names it")
    ap.add_argument("--draft", default="", help="a draft checkpoint (draft_checkpoint)")
    ap.add_argument("--lora", default="", help="a multi_lora.json: its adapters are checked too")
    ap.add_argument("--max-seq-len", type=int, default=2048, help="the server's max_seq_len (longrope reads it)")
    ap.add_argument(
        "--set", action="append", type=_setting, default=[], metavar="KEY=VALUE", help="any other engine parameter"
    )
    args = ap.parse_args(argv)
    try:
        rows = run(args)
    except ModelLoadError as e:  # the server would not load it either: say why, apart from a mismatch
        print(f"could not load the checkpoint as the server would: {e}", file=sys.stderr)
        return 2
    print(report(rows))
    return 1 if any(r.ok is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
