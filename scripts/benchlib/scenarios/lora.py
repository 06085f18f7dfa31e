"""LoRA adapters: throughput with 0, 1 and 4 distinct adapters in the batch against the base model alone, in
process, one run.

    python scripts/bench.py lora                     # 8 JME prompts, 64 tokens, c = 1 and 8, rank 16, 3 rounds
    python scripts/bench.py lora --rank 64 --concurrency 8
    python scripts/bench.py lora --quick
    python scripts/bench.py lora --draft --k 3 --alpha 4  # the int8 copy drafting with the adapters, or without

Adapters: random PEFT LoRA adapters of the model (every attention and MLP projection, rank --rank, A and B both
random), written to a temporary folder and served from a multi_lora.json by one engine (enable_lora). Workload: JME
extraction prompts (chat template, greedy, unguided), num_draft_tokens --k. Rows per concurrency:
  base        no request names an adapter (the same engine: adapters loaded, none used)
  1 adapter   every request names the same adapter
  4 adapters  requests name 4 adapters in turn (a batch of 8 holds each twice)
The rows run interleaved, --repeat times (medians); tok/s ÷ base is the cost of the adapters' updates.
With --draft: two engines, each with the target's int8 copy drafting (drafter draft_model, num_draft_tokens --k),
one whose copy applies the request's adapter (lora_draft on) and one whose copy drafts as the base model; per
row tok/s and the accepted share of the drafts for each. --alpha sets the adapters' lora_alpha (their scale is
alpha / rank: random adapters far stronger than a fine-tune's move the model much further from its base).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from .. import report
from ..run import cpu_engine, run_engine
from ..workload import select_cases

SHARED = {"prompts": 8, "max_tokens": 64, "concurrency": [1, 8], "repeat": 3}
QUICK = {"prompts": 2, "max_tokens": 16, "concurrency": [1, 2], "repeat": 1}
QUICK_HELP = "2 prompts, 16 tokens, concurrency 1 and 2, one round"
ROWS = {"base": 0, "1 adapter": 1, "4 adapters": 4}


def add_options(ap) -> None:
    ap.add_argument("--rank", type=int, default=16, help="the adapters' rank")
    ap.add_argument("--k", type=int, default=0, help="num_draft_tokens of every request (-1: auto)")
    ap.add_argument("--draft", action="store_true", help="compare the int8 copy drafting with and without adapters")
    ap.add_argument("--alpha", type=float, default=0.0, help="the adapters' lora_alpha (default: 2 x rank)")


def _adapters(model_path: str, folder: Path, rank: int, n: int, alpha: float) -> Path:
    """n random PEFT adapters of the checkpoint in `folder`, and their multi_lora.json -> its path."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    for i in range(n):
        torch.manual_seed(i)
        cfg = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules="all-linear", init_lora_weights=False)
        get_peft_model(copy.deepcopy(base), cfg).save_pretrained(str(folder / f"a{i}"))
    listing = folder / "multi_lora.json"
    listing.write_text(json.dumps({f"a{i}": f"a{i}" for i in range(n)}))
    return listing


def _engine(args, listing: Path, longest: int, **settings):
    """An engine serving the adapters of `listing`, sized for the run."""
    return cpu_engine(
        args.model,
        max(args.concurrency),
        longest + args.max_tokens + 16,
        args.max_tokens,
        enable_lora=True,
        lora_adapters=str(listing),
        max_lora_rank=max(64, args.rank),
        **settings,
    )


def run(args) -> None:
    from specgram.engine.generate import generate
    from specgram.model.source import open_source
    from specgram.request import SamplingParams

    tok = open_source(args.model).tokenizer()
    cases = select_cases(tok, args.prompts, 256)  # any JME prompt: unguided, the answer need not fit
    longest = max(len(c["prompt_ids"]) for c in cases)
    with tempfile.TemporaryDirectory() as tmp:
        listing = _adapters(args.model, Path(tmp), args.rank, max(ROWS.values()), args.alpha)
        if args.draft:
            return _draft_run(args, cases, listing, longest)
        engine = _engine(args, listing, longest)
    adapter_mb = sum(a.nbytes for a in engine.target.adapters.all) / len(engine.target.adapters.all) / 1e6

    def one(row: str, c: int) -> dict:
        """One closed-loop run of every case at concurrency c, the requests naming ROWS[row] adapters in turn."""
        n = ROWS[row]
        reqs = [
            engine.make_request(
                SamplingParams(
                    max_tokens=args.max_tokens, num_draft_tokens=args.k, lora_name=f"a{i % n}" if n else None
                ),
                prompt_ids=case["prompt_ids"],
            )
            for i, case in enumerate(cases)
        ]
        out = generate(engine, reqs, c)
        return {"tok_s": sum(len(g.token_ids) for g in out.generations) / out.wall_s}

    run_engine(engine, cases[:2], 8, 2)  # warm-up
    results = {(row, c): [] for row in ROWS for c in args.concurrency}
    for r in range(args.repeat):
        for c in args.concurrency:
            for row in ROWS:
                results[(row, c)].append(one(row, c))
        report.log(f"round {r + 1} done")
    rows = []
    for c in args.concurrency:
        base = statistics.median(x["tok_s"] for x in results[("base", c)])
        for row in ROWS:
            rate = statistics.median(x["tok_s"] for x in results[(row, c)])
            rows.append([c, row, f"{rate:.1f}", f"{rate / base:.2f}×"])
    lines = report.header(
        "LoRA adapters",
        args,
        f"{len(cases)} JME prompts, up to {args.max_tokens} tokens, greedy, unguided, num_draft_tokens {args.k}; "
        f"random adapters of rank {args.rank} on every projection ({adapter_mb:.1f} MB each); median of "
        f"{args.repeat} interleaved rounds",
    )
    lines += report.table(["concurrency", "requests", "output tok/s", "÷ base"], rows)
    report.write(args, lines, {f"{row} | c={c}": recs for (row, c), recs in results.items()})
    engine.close()


def _draft_run(args, cases: list[dict], listing: Path, longest: int) -> None:
    """--draft: lora_draft on against off, both engines drafting with the int8 copy, the rows interleaved."""
    from specgram.engine.generate import generate
    from specgram.request import SamplingParams

    engines = {
        mode: _engine(args, listing, longest, draft_quantization="int8", lora_draft=mode == "with adapter")
        for mode in ("with adapter", "base copy")
    }
    rows = {"1 adapter": 1, "4 adapters": 4}

    def one(engine, n: int, c: int) -> dict:
        reqs = [
            engine.make_request(
                SamplingParams(
                    max_tokens=args.max_tokens, num_draft_tokens=args.k, drafter="draft_model", lora_name=f"a{i % n}"
                ),
                prompt_ids=case["prompt_ids"],
            )
            for i, case in enumerate(cases)
        ]
        out = generate(engine, reqs, c)
        spec = [g.final.spec for g in out.generations]
        return {
            "tok_s": sum(len(g.token_ids) for g in out.generations) / out.wall_s,
            "drafted": sum(x.drafted for x in spec),
            "accepted": sum(x.accepted for x in spec),
            "ids": [g.token_ids for g in out.generations],
        }

    for engine in engines.values():
        run_engine(engine, cases[:2], 8, 2)  # warm-up
    results = {(m, row, c): [] for m in engines for row in rows for c in args.concurrency}
    for r in range(args.repeat):
        for c in args.concurrency:
            for row, n in rows.items():
                for mode, engine in engines.items():
                    results[(mode, row, c)].append(one(engine, n, c))
        report.log(f"round {r + 1} done")
    table = []
    for c in args.concurrency:
        for row in rows:
            cells = [c, row]
            for mode in engines:
                recs = results[(mode, row, c)]
                acc = sum(x["accepted"] for x in recs) / max(1, sum(x["drafted"] for x in recs))
                cells += [f"{statistics.median(x['tok_s'] for x in recs):.1f}", f"{acc:.2f}"]
            same = all(a["ids"] == b["ids"] for a, b in zip(*(results[(m, row, c)] for m in engines), strict=True))
            table.append(cells + ["yes" if same else "no"])
    lines = report.header(
        "LoRA adapters: the int8 copy drafting with or without them",
        args,
        f"{len(cases)} JME prompts, up to {args.max_tokens} tokens, greedy, drafter draft_model, num_draft_tokens "
        f"{args.k}; random adapters of rank {args.rank}, lora_alpha {args.alpha or 2 * args.rank}; median of "
        f"{args.repeat} interleaved rounds",
    )
    header = ["concurrency", "requests", "tok/s, copy with adapter", "accepted", "tok/s, base copy", "accepted"]
    lines += report.table(header + ["same ids"], table)
    report.write(args, lines, {" | ".join(map(str, key)): recs for key, recs in results.items()})
    for engine in engines.values():
        engine.close()
