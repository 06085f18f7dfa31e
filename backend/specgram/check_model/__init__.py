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
import sys
from pathlib import Path

import torch

from ..errors import ModelLoadError
from .against import check_greedy, check_logits
from .common import PROMPTS, SERVED_DEFAULTS, Row, checkpoint_bytes, gib, peak_rss, rss
from .served import check_engine


def run(args) -> list[Row]:
    from ..config import EngineConfig
    from ..engine.engine import Engine
    from ..model.source import open_source
    from ..model.whole import load_model

    params = {**SERVED_DEFAULTS, "checkpoint": args.path, "max_seq_len": str(args.max_seq_len), "max_slots": "4"}
    if args.draft:
        params["draft_checkpoint"] = args.draft
    if args.lora:
        params.update(enable_lora="1", lora_adapters=args.lora)
    params.update(args.set)
    rss0 = rss()
    engine = Engine.from_config(EngineConfig.from_dict(params))
    load = Row(
        "load", engine.target.linear_kind, None,
        f"peak {gib(peak_rss() - rss0)}, resident {gib(rss() - rss0)} over the process's own; checkpoints "
        f"{gib(checkpoint_bytes(args.path) + checkpoint_bytes(args.draft))}",
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
    source = open_source(args.path)
    ref = load_model(source, settings.device, torch.float32).eval()  # transformers' own, once per checkpoint
    rows = [load, *check_logits(source, "target", ref, settings.dtype, settings, max_seq_len, prompt_ids)]
    rows += check_greedy(ref, settings.dtype, max_seq_len, prompt_ids, served, settings.target.weights != "auto")
    del ref
    gc.collect()
    if args.draft:
        source = open_source(args.draft)
        ref = load_model(source, settings.device, torch.float32).eval()
        dtype = settings.draft.dtype if settings.draft is not None else settings.dtype
        rows += check_logits(source, "draft", ref, dtype, settings, max_seq_len, prompt_ids)
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
