"""Throughput through tritonserver over gRPC streaming: aggregate and per-stream tok/s per concurrency, one run.

    python scripts/bench.py serving                       # starts its own server (model_repository/, BENCH_ENGINE)
    python scripts/bench.py serving --url localhost:8001 --concurrency 1 8 --prompts 8 --max-tokens 64
    python scripts/bench.py serving --extra '{"num_draft_tokens": 4}'
    python scripts/bench.py serving --quick               # c = 1 and 2, 2 requests, 16 tokens
    python scripts/bench.py serving --configs k0,served --repeat 3 --prompt-set chat   # speculation's gain
    python scripts/bench.py serving --configs k0,served-lines,served --repeat 5   # trees of drafts' gain
    python scripts/bench.py serving --configs k0,served --settings '{"spec_fallback": "0"}'  # engine settings
    python scripts/bench.py serving --configs k0,copy-auto,served --settings '{"draft_checkpoint": "..."}'
    python scripts/bench.py serving --configs k0,lookup-only,ngram-auto,served-nosuffix,served --prompt-set repeat \
        --prompts 24 --max-tokens 128                     # the suffix store's gain on a repeated task

Every request produces exactly --max-tokens tokens (ignore_eos), greedy, chat-templated prompts; each
concurrency level sends max(--prompts, c) requests in a closed loop. Per concurrency: aggregate output tok/s,
per-stream tok/s (a request's tokens / its latency, averaged), mean TTFT, and the ratio to the first row.
--configs: request settings compared on one server, interleaved --repeat times per concurrency (medians):
  served      no num_draft_tokens / drafter inputs: the server's defaults (config.pbtxt)
  served-lines  the same with tree_drafts false: lines of drafts only (no trees)
  k0          num_draft_tokens 0: no speculation
  ngram-auto  drafter ngram, num_draft_tokens auto (n-gram lookup and the suffix store)
  lookup-only ngram-auto with a cache_salt per request: the suffix store never holds the request's scope
  served-nosuffix  served, a cache_salt per request: the served default without suffix drafts
  copy-auto   drafter copy, num_draft_tokens auto: on a server with a draft_checkpoint, the target alone's own
              drafting (its copy and the lookups), the draft model left out: the pair against the target alone
Each timed run carries a cache_salt of its own (the suffix store starts empty for it and learns from that run's
earlier answers only, as a stream of new inputs would), and the per-request ones above one per request.
k0 always runs; the ratio column is tok/s ÷ k0's at the same concurrency, and every config's outputs are
compared with k0's (greedy: they must be identical).
"""

from __future__ import annotations

import json
import statistics

from .. import report
from ..run import acceptance, ids, run_triton, served, tok_s
from ..workload import CHAT_PROMPTS, COPY_PROMPTS, REPEAT_PROMPTS, choose, is_valid, load_jme

SHARED = {"concurrency": [1, 8], "prompts": 8, "max_tokens": 64}
QUICK = {"concurrency": [1, 2], "prompts": 2, "max_tokens": 16}
QUICK_HELP = "concurrency 1 and 2, 2 requests, 16 tokens"
ENGINE = False


# name -> the inputs a request of that config carries (None: the input is not sent)
CONFIGS = {
    "k0": {"num_draft_tokens": 0},
    "served": {"num_draft_tokens": None, "drafter": None},
    "served-lines": {"num_draft_tokens": None, "drafter": None, "tree_drafts": False},
    "ngram-auto": {"num_draft_tokens": -1, "drafter": "ngram"},
    "lookup-only": {"num_draft_tokens": -1, "drafter": "ngram", "salt": "request"},
    "served-nosuffix": {"num_draft_tokens": None, "drafter": None, "salt": "request"},
    "copy-auto": {"num_draft_tokens": -1, "drafter": "copy"},
    "model-k3": {"num_draft_tokens": 3, "drafter": "draft_model"},  # the draft model alone, at a fixed depth
}
PROMPT_SETS = {"chat": CHAT_PROMPTS, "copy": COPY_PROMPTS, "guided": None, "repeat": REPEAT_PROMPTS}
# prompt sets whose answers end where the model ends them (EOS; a grammar's end): no ignore_eos
NATURAL_END = ("guided", "repeat")


def salted(cases: list[dict], config: str, run: str) -> list[dict]:
    """The cases with their cache_salt: the run's (every request of a timed run shares it), or one per request
    where the config says so."""
    per_request = CONFIGS[config].get("salt") == "request"
    return [{**c, "cache_salt": f"{run}-{i}" if per_request else run} for i, c in enumerate(cases)]


def guided_cases(n: int) -> list[dict]:
    """n JME schemas (evenly spaced), each as a guided request whose prompt names the record but does not quote
    its schema (lookup finds nothing there to copy; only the guide knows the keys)."""
    schemas = load_jme()
    picked = [schemas[i * len(schemas) // n] for i in range(n)]
    out = []
    for c in picked:
        title = c["schema"].get("title") if isinstance(c["schema"], dict) else None
        what = f" of a {title}" if isinstance(title, str) and title else ""
        out.append(
            dict(
                prompt=f"Write a realistic example record{what} as a JSON object. Respond with the JSON object only.",
                guide=c["guide"],
            )
        )
    return out


def add_options(ap) -> None:
    ap.add_argument("--url", default="", help="gRPC url of a running server (default: start one here)")
    ap.add_argument("--extra", default="{}", help="JSON of extra inputs, e.g. '{\"num_draft_tokens\": 4}'")
    ap.add_argument("--configs", default="", help=f"comma-separated request settings to compare, from {list(CONFIGS)}")
    ap.add_argument(
        "--prompt-set",
        choices=sorted(PROMPT_SETS),
        default="chat",
        help="chat: open-ended chat prompts (free text); copy: prompts holding text to copy; "
        "guided: JSON-schema guided requests whose prompt does not quote the schema; repeat: one instruction "
        "over a stream of related inputs, answers ending at EOS (--configs)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per config, interleaved (with --configs)")
    ap.add_argument("--settings", default="{}", help="JSON of engine settings for the server started here")
    ap.add_argument(
        "--warm-store",
        type=int,
        default=0,
        help="before each timed run, this many other prompts of the set (those after the timed ones) run untimed "
        "with the run's cache_salt: the suffix store and prefix cache as a server that has served the task a while "
        "finds them (with --configs)",
    )


def run(args) -> None:
    if args.configs:
        return compare_configs(args)
    extra = {"ignore_eos": True, **json.loads(args.extra)}
    recs = []
    with served(args.url, json.loads(args.settings), report.raw_dir(args) / "tritonserver.log") as (url, _):
        run_triton(url, [dict(prompt=CHAT_PROMPTS[0])], 8, 1, extra=extra)  # warm-up
        for c in args.concurrency:
            n = max(args.prompts, c)
            cases = [dict(prompt=CHAT_PROMPTS[i % len(CHAT_PROMPTS)]) for i in range(n)]
            recs.append(run_triton(url, cases, args.max_tokens, c, extra=extra, system="ours via Triton"))
            report.log(f"c {c}: {tok_s(recs[-1]):.1f} tok/s")
    rows = [
        [
            r["concurrency"],
            f"{tok_s(r):.1f}",
            f"{statistics.mean(len(q['ids']) / q['latency_s'] for q in r['requests']):.1f}",
            f"{1e3 * statistics.mean(q['ttft_s'] for q in r['requests']):.0f}",
            f"{tok_s(r) / tok_s(recs[0]):.2f}×",
        ]
        for r in recs
    ]
    lines = report.header(
        "Serving throughput over gRPC streaming",
        args,
        f"max(--prompts, c) chat prompts per level, {args.max_tokens} tokens each (ignore_eos), "
        f"greedy, extra inputs {extra}; {'server at ' + args.url if args.url else 'own server'}",
        ("tritonclient", "nvidia-pytriton"),
    )
    lines += report.table(
        [
            "concurrency",
            "output tok/s (aggregate)",
            "per-stream tok/s",
            "mean TTFT ms",
            f"ratio to c={recs[0]['concurrency']}",
        ],
        rows,
    )
    report.write(args, lines, dict(records=recs))


def compare_configs(args) -> None:
    """--configs: each config's closed-loop run per concurrency on one server, interleaved --repeat times."""
    names = choose(args.configs, CONFIGS, ("k0",))  # k0: the reference
    guided = args.prompt_set == "guided"
    pool = guided_cases(max(args.prompts, 8)) if guided else [dict(prompt=p) for p in PROMPT_SETS[args.prompt_set]]
    # guided answers end with their JSON (a grammar allows only EOS there), repeat's at EOS; the others run
    # --max-tokens
    base = {**({} if args.prompt_set in NATURAL_END else {"ignore_eos": True}), **json.loads(args.extra)}
    inputs = {n: {k: v for k, v in CONFIGS[n].items() if k != "salt"} for n in names}

    def extra(n: str) -> dict:
        return {**base, **inputs[n]}

    rows, recs = [], []
    with served(args.url, json.loads(args.settings), report.raw_dir(args) / "tritonserver.log") as (url, _):
        for n in names:  # warm-up: every config
            run_triton(url, pool, 8, 2, guided=guided, extra=extra(n))  # compiles the guides
        for c in args.concurrency:
            cases = [pool[i % len(pool)] for i in range(max(args.prompts, c))]
            warm = [pool[(len(cases) + i) % len(pool)] for i in range(args.warm_store)]
            runs: dict[str, list[dict]] = {n: [] for n in names}
            for rep in range(args.repeat):
                for n in names:
                    salt = f"{n}-c{c}-r{rep}"
                    if warm:  # untimed, under the timed run's salt
                        run_triton(url, salted(warm, n, salt), args.max_tokens, c, guided=guided, extra=extra(n))
                    runs[n].append(
                        run_triton(
                            url,
                            salted(cases, n, salt),
                            args.max_tokens,
                            c,
                            guided=guided,
                            extra=extra(n),
                            system="ours via Triton",
                            config=n,
                        )
                    )
                    report.log(f"c {c} {n}: {tok_s(runs[n][-1]):.1f} tok/s")
            recs += [r for rs in runs.values() for r in rs]
            ref = statistics.median(map(tok_s, runs[names[0]]))
            ref_ids = ids(runs[names[0]][0])
            for n in names:
                last, alpha = runs[n][-1], acceptance(runs[n][-1])
                t = statistics.median(map(tok_s, runs[n]))
                exact = all(ids(r) == ref_ids for r in runs[n])
                valid = (
                    sum(is_valid(q["text"], json.loads(cases[q["case"]]["guide"])) for q in last["requests"])
                    if guided
                    else 0
                )
                rows.append(
                    [
                        c,
                        n,
                        f"{t:.1f}",
                        " / ".join(f"{tok_s(r):.1f}" for r in runs[n]),
                        "–" if alpha is None else f"{alpha:.2f}",
                        f"{t / ref:.2f}×",
                        "yes" if exact else "NO",
                        f"{valid}/{len(cases)}" if guided else "–",
                        by_source(runs[n]),
                    ]
                )
    lines = report.header(
        "Serving: request settings side by side over gRPC streaming",
        args,
        f"max(--prompts, c) {args.prompt_set} prompts per level, {args.max_tokens} tokens at most "
        f"each, greedy, extra inputs {base}, configs interleaved {args.repeat}x; "
        + (
            f"{args.warm_store} other prompts untimed before each timed run, its cache_salt; "
            if args.warm_store
            else ""
        )
        + f"{'server at ' + args.url if args.url else 'own server'}",
        ("tritonclient",),
    )
    lines += report.table(
        [
            "c",
            "config",
            "output tok/s (median)",
            "runs",
            "α",
            f"÷ {names[0]}",
            f"same output as {names[0]}",
            "valid JSON (guided)",
            "accepted / drafted by source",
        ],
        rows,
    )
    report.write(args, lines, dict(records=recs))


def by_source(runs: list[dict]) -> str:
    """The drafts of every request of these runs by source (spec_detail), as "source accepted/drafted", most
    drafted first; "–" where none."""
    totals: dict[str, list[int]] = {}
    for run in runs:
        for q in run["requests"]:
            for src, d in (q.get("sources") or {}).items():
                t = totals.setdefault(src, [0, 0])
                t[0] += int(d.get("accepted", 0))
                t[1] += int(d.get("drafted", 0))
    shown = sorted(((d, a, src) for src, (a, d) in totals.items() if d), reverse=True)
    return ", ".join(f"{src} {a}/{d}" for d, a, src in shown) or "–"
