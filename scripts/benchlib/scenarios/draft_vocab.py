"""A reduced draft vocabulary (draft_vocab): the int8 copy drafting over the most frequent entries only, against
the whole vocabulary, in process, one run.

    python scripts/bench.py draft_vocab --model models/gemma-3-270m       # 8 prompts, 64 tokens, 3 rounds
    python scripts/bench.py draft_vocab --model models/gemma-3-270m --sizes full 32768 16384 8192
    python scripts/bench.py draft_vocab --model models/gemma-3-270m --quick

Workloads, one stream, greedy, raw prompts (no chat template: base models have none):
  free text   the chat prompts continued
  JSON        JME extraction prompts, each guided by its JSON schema
Per workload the int8 copy drafts at k = 3 and under auto k (lookup or the copy, per request per step, as served
by default), drafter draft_model. The settings run interleaved, --repeat times (medians). Per row:
  tok/s       output tokens / wall seconds;  ÷ full: over the whole-vocabulary copy's, same workload and k
  accepted    accepted drafts / drafted tokens (the copy's and lookup's together)
  tok/step    tokens committed per decode step
  draft ms    one draft-model forward at one row (the engine's own running mean of its timings)
  exact       greedy ids identical to the whole-vocabulary copy's (the target verifies over every entry)
"""

from __future__ import annotations

import statistics

from .. import report
from ..run import cpu_engine, ids, run_engine, tok_s
from ..workload import CHAT_PROMPTS, load_jme, prompt_text

SHARED = {"prompts": 8, "max_tokens": 64, "repeat": 3}
QUICK = {"prompts": 2, "max_tokens": 16, "repeat": 1}
QUICK_HELP = "2 prompts, 16 tokens, one round"
KS = {"k=3": 3, "auto": -1}


def setting(size: str) -> int:
    """A --sizes word as the EngineConfig field: auto -1, full 0, else the count."""
    return {"auto": -1, "full": 0}[size] if size in ("auto", "full") else int(size)


def add_options(ap) -> None:
    ap.add_argument(
        "--sizes", nargs="+", default=["full", "auto", "16384"], help="draft_vocab settings to compare (first: base)"
    )


def _cases(tok, n: int) -> dict[str, list[dict]]:
    free = [dict(prompt_ids=tok(CHAT_PROMPTS[i % len(CHAT_PROMPTS)])["input_ids"]) for i in range(n)]
    items = [it for it in load_jme() if it["instance"] is not None]
    items = sorted(items, key=lambda it: len(prompt_text(it)))[: 4 * n : 4]  # short ones: quick prefills
    guided = [dict(prompt_ids=tok(prompt_text(it))["input_ids"], guide=it["guide"]) for it in items]
    return {"free text": free, "JSON": guided}


def run(args) -> None:
    from specgram.model.source import open_source

    tok = open_source(args.model).tokenizer()
    workloads = _cases(tok, args.prompts)
    longest = max(len(c["prompt_ids"]) for cs in workloads.values() for c in cs)
    engines = {
        size: cpu_engine(
            args.model,
            1,
            longest + args.max_tokens + 16,
            args.max_tokens,
            draft_quantization="int8",
            draft_vocab=setting(size),
        )
        for size in args.sizes
    }
    heads = {size: e.drafters["draft_model"].runner.head_ids for size, e in engines.items()}
    cells = [(w, k) for w in workloads for k in KS]

    def one(size: str, w: str, k: str) -> dict:
        return run_engine(engines[size], workloads[w], args.max_tokens, 1, "draft_model", KS[k], w == "JSON")

    for size in engines:  # warm-up
        one(size, "free text", "k=3")
    runs: dict[tuple, list[dict]] = {(s, w, k): [] for s in engines for w, k in cells}
    draft_ms: dict[tuple, list[float]] = {key: [] for key in runs}
    for r in range(args.repeat):
        for w, k in cells:
            for size in engines:
                runs[(size, w, k)].append(one(size, w, k))
                draft_ms[(size, w, k)].append(1e3 * engines[size].planner.costs.draft_depth_s)
        report.log(f"round {r + 1} done")
    rows = []
    base = args.sizes[0]
    for w, k in cells:
        reference = ids(runs[(base, w, k)][0])
        base_rate = statistics.median(tok_s(rec) for rec in runs[(base, w, k)])
        for size in engines:
            recs = runs[(size, w, k)]
            rate = statistics.median(tok_s(rec) for rec in recs)
            reqs = [q for rec in recs for q in rec["requests"]]
            drafted, accepted = sum(q["drafted"] for q in reqs), sum(q["accepted"] for q in reqs)
            decode_steps = sum(sum(g.spec.k_hist) for rec in recs for g in rec["_run"].generations)
            steps = sum(len(q["ids"]) for q in reqs) / max(1, decode_steps)
            entries = len(tok) if heads[size] is None else len(heads[size])
            rows.append(
                [
                    w,
                    k,
                    f"{size} ({entries})",
                    f"{rate:.1f}",
                    f"{rate / base_rate:.2f}×",
                    f"{accepted / max(1, drafted):.2f}",
                    f"{steps:.2f}",
                    f"{statistics.median(draft_ms[(size, w, k)]):.1f}",
                    "yes" if all(ids(rec) == reference for rec in recs) else "no",
                ]
            )
    lines = report.header(
        "Reduced draft vocabulary",
        args,
        f"{args.prompts} prompts per workload, up to {args.max_tokens} tokens, greedy, one stream; the int8 copy "
        f"over draft_vocab {', '.join(args.sizes)} (entries in brackets); median of {args.repeat} interleaved rounds",
    )
    lines += report.table(
        ["workload", "k", "draft_vocab", "tok/s", f"÷ {base}", "accepted", "tok/step", "draft ms", "exact"], rows
    )
    report.write(args, lines, dict(runs={" | ".join(key): recs for key, recs in runs.items()}))
