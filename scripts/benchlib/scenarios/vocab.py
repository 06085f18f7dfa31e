"""What a vocabulary costs the grammar: each checkpoint's tokenizer compiling the JME schemas with xgrammar and
filling a token mask at every position of each schema's valid instance, in this process, one run.

    python scripts/bench.py vocab                                         # SmolLM2 and Gemma 3 270M (if built)
    python scripts/bench.py vocab --checkpoints models/gemma-3-270m --prompts 4

Per checkpoint: its vocabulary, the time to build xgrammar's TokenizerInfo (once, at load), and per schema the
compile (JSON schema, the engine's default options: any whitespace, strict) and the mean mask fill per token
(GrammarMatcher.fill_next_token_bitmask, then the instance's token accepted); p50 / p90 over the schemas.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import DEFAULT_MODEL, REPO, report
from ..workload import load_jme, pct

SHARED = {"prompts": 12}
QUICK = {"prompts": 2}
QUICK_HELP = "2 schemas"
ENGINE = False
GEMMA = REPO / "models" / "gemma-3-270m"


def add_options(ap) -> None:
    default = [str(DEFAULT_MODEL)] + ([str(GEMMA)] if (GEMMA / "config.json").exists() else [])
    ap.add_argument("--checkpoints", nargs="+", default=default, help="checkpoint folders (default %(default)s)")


def measure(path: str, items: list[dict]) -> dict:
    import xgrammar as xgr
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    info_s = time.perf_counter() - t0
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    compile_ms, fill_us = [], []
    for it in items:
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(it["guide"], any_whitespace=True, strict_mode=True)
        compile_ms.append(1e3 * (time.perf_counter() - t0))
        matcher, fills = xgr.GrammarMatcher(compiled), []
        for t in tok(json.dumps(it["instance"]), add_special_tokens=False)["input_ids"]:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            fills.append(1e6 * (time.perf_counter() - t0))
            if not matcher.accept_token(t):
                break
        fill_us.append(sum(fills) / len(fills))
    return dict(vocab=vocab, info_s=info_s, compile_ms=compile_ms, fill_us=fill_us)


def run(args) -> None:
    items = [it for it in load_jme() if it["instance"] is not None]
    items = items[:: max(len(items) // args.prompts, 1)][: args.prompts]
    results = {}
    for path in args.checkpoints:
        results[path] = measure(path, items)
        report.log(f"{Path(path).name}: {results[path]['vocab']} tokens")
    rows = [
        [
            Path(path).name,
            r["vocab"],
            f"{r['info_s']:.1f}",
            f"{pct(r['compile_ms'], 50):.0f} / {pct(r['compile_ms'], 90):.0f}",
            f"{pct(r['fill_us'], 50):.0f} / {pct(r['fill_us'], 90):.0f}",
        ]
        for path, r in results.items()
    ]
    lines = report.header(
        "What a vocabulary costs the grammar",
        args,
        f"{len(items)} JME schemas (evenly spaced, with a valid instance), xgrammar in process, no cache",
        ("xgrammar", "transformers"),
    )
    lines += report.table(
        ["checkpoint", "vocabulary", "TokenizerInfo s", "compile ms p50 / p90", "mask fill µs per token p50 / p90"],
        rows,
    )
    report.write(args, lines, results)
