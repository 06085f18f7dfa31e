"""A checkpoint of any supported family, served through tritonserver, against transformers' generate on the same
checkpoint, one run: output tok/s at one stream, with and without speculation, free text continued from raw
prompts (no chat template: base models have none).

    python scripts/bench.py models --model models/gemma-3-270m     # 8 prompts, 64 tokens, 3 rounds
    python scripts/bench.py models --model models/gemma-3-270m --quick

Rows: HF transformers generate() (float32, batch 1, target only); ours via Triton with num_draft_tokens 0 and
with the served default (auto k: lookup and the int8 copy). The rounds interleave the three (medians). Every
output stops at the checkpoint's EOS or max_tokens alike, and is compared with ours at k 0: ours must be
identical with speculation; HF's may differ at a near-tie.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .. import report
from ..run import run_triton, served, tok_s
from ..workload import CHAT_PROMPTS, eos_ids, trim_at_eos
from . import compare_hf

SHARED = {"prompts": 8, "max_tokens": 64, "repeat": 3}
QUICK = {"prompts": 2, "max_tokens": 16, "repeat": 1}
QUICK_HELP = "2 prompts, 16 tokens, one round"
ROWS = ("HF generate", "ours via Triton, k 0", "ours via Triton, served default")
SERVED = {  # the inputs each of our rows sends (None: not sent, the server's default)
    ROWS[1]: {"num_draft_tokens": 0},
    ROWS[2]: {"num_draft_tokens": None, "drafter": None},
}


def run(args) -> None:
    tok, model = compare_hf.load(args.model)
    eos = eos_ids(args.model, tok)
    prompts = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(args.prompts)]
    cases = [dict(prompt=p, prompt_ids=tok(p)["input_ids"]) for p in prompts]
    raw = {"apply_chat_template": False}
    runs: dict[str, list[dict]] = {row: [] for row in ROWS}
    settings = {"checkpoint": str(Path(args.model).resolve())}
    with served("", settings=settings, log_path=report.raw_dir(args) / "tritonserver.log") as (url, _):
        for row in ROWS[1:]:  # warm-up
            run_triton(url, cases[:1], 8, 1, extra={**raw, **SERVED[row]})
        for r in range(args.repeat):
            runs[ROWS[0]].append(compare_hf.run(tok, model, cases, "target only", False, 1, args.max_tokens, eos))
            for row in ROWS[1:]:
                rec = run_triton(url, cases, args.max_tokens, 1, extra={**raw, **SERVED[row]})
                for q in rec["requests"]:  # the same token count as HF's: up to the first EOS
                    q["ids"] = trim_at_eos(q["ids"], eos)
                runs[row].append(rec)
            report.log(f"round {r + 1}: " + ", ".join(f"{row} {tok_s(runs[row][-1]):.1f}" for row in ROWS))
    reference = [q["ids"] for q in runs[ROWS[1]][0]["requests"]]
    rate = {row: statistics.median(tok_s(rec) for rec in runs[row]) for row in ROWS}
    rows = [
        [
            row,
            f"{rate[row]:.1f}",
            f"{rate[row] / rate[ROWS[0]]:.2f}×",
            f"{rate[row] / rate[ROWS[1]]:.2f}×",
            "yes" if all([q["ids"] for q in rec["requests"]] == reference for rec in runs[row]) else "no",
        ]
        for row in ROWS
    ]
    lines = report.header(
        f"{Path(args.model).name}: served against HF generate",
        args,
        f"{args.prompts} free-text prompts without a chat template, up to {args.max_tokens} tokens (EOS ends an "
        f"output), greedy, one stream; median of {args.repeat} interleaved rounds",
        ("tritonclient", "nvidia-pytriton"),
    )
    lines += report.table(["system", "output tok/s", "÷ HF", "÷ ours k 0", "ids = ours k 0"], rows)
    report.write(args, lines, dict(runs=runs))
