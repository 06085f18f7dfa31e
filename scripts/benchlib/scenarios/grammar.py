"""Grammar-constrained decoding in process: what the grammar costs and what speculation gains under it.

    python scripts/bench.py grammar --out docs/benchmarks/grammar_cpu.md     # full run, ~9 min on a 2-core CPU
    python scripts/bench.py grammar --quick      # 2 schemas (compile: 5), 48 tokens: a smoke run
    python scripts/bench.py grammar --configs unconstrained,none,served --model <a GGUF file> \
        --settings '{"draft_checkpoint": "<a draft GGUF file>"}'      # the served default's mask work

One run reports:
  compile     what a request pays for each JME schema's grammar (GrammarCompiler.submit): cache miss (a
              worker process, then the engine process) and hit (same schema again), p50/p99 ms
  mask work   per engine.step(): wall time inside StepMasks.fill / forced_prefix / seal / apply and the
              tentative accepts of the drafting picks (grammar_masks.py; outermost call only), p50/p90/p99 µs
              per step and per request-step (divided by the guided requests in that step); matcher commits
              (Guide.commit) are reported beside it, not inside it
  tok/s       the same prompts unconstrained vs json_schema-guided, both without speculation, c = 1 and 8
  speculation guided, each drafter (grammar = forced tokens only, ngram, int8 draft model): tok/s, α, tokens per
              step, speedup vs guided no-speculation at the same concurrency, exact (same ids as guided no-spec)
  served      (--configs ...,served) guided with the engine's default drafter and draft lengths (auto), a draft
              model where --settings names a draft_checkpoint: the mask work of the step as served
  validity    finished guided outputs that parse and validate against their schema (jsonschema)

Prompts: chat-templated extraction tasks built from each schema's first valid instance, greedy; --prompts
evenly spaced schemas. Grammars are compiled (cache hits) before each timed run starts, so decode timings
exclude compiles. One timed run per row, after a warm-up.
"""

from __future__ import annotations

import json
import re
import statistics
import time

from .. import REPO, report
from ..run import acceptance, ids, run_engine, scenario_engine, tok_s
from ..workload import INSTRUCTION, SERVED, choose, compile_guide, is_valid, load_jme, pct, select_cases

SHARED = {"prompts": 8, "max_tokens": 160, "concurrency": [1, 8]}
QUICK = {"prompts": 2, "max_tokens": 48, "concurrency": [1, 2]}
QUICK_HELP = "2 schemas (compile: 5), 48 tokens, concurrency 1 and 2"
CONFIGS = {  # name -> (guided, drafter, k)
    "unconstrained": (False, None, 0),
    "none": (True, None, 0),
    "grammar-k4": (True, "grammar", 4),
    "grammar-k8": (True, "grammar", 8),
    "ngram-k4": (True, "ngram", 4),
    "int8-k2": (True, "draft_model", 2),
    "int8-k4": (True, "draft_model", 4),
    "served": (True, SERVED, None),  # the engine's default drafter and draft length (served_engine())
}
# the drafting settings the `served` row takes from config.pbtxt (a draft model, where --settings names a
# draft_checkpoint, in the form its draft_quantization picks)
SERVED_KEYS = ("drafter", "default_num_draft_tokens", "default_num_draft_tokens_guided", "draft_quantization")
PACKAGES = ("torch", "transformers", "xgrammar", "jsonschema")


def served_engine() -> dict:
    """config.pbtxt's SERVED_KEYS as the engine reads them (EngineConfig.from_dict): what the server drafts with."""
    from specgram.config import EngineConfig

    text = (REPO / "model_repository" / "llm" / "config.pbtxt").read_text()
    params = dict(re.findall(r'parameters \{ key: "(\w+)", value: \{ string_value: "([^"]*)" \} \}', text))
    config = EngineConfig.from_dict({"checkpoint": "served", **{k: params[k] for k in SERVED_KEYS}})
    return {k: getattr(config, k) for k in SERVED_KEYS}


def add_options(ap) -> None:
    default = ",".join(c for c in CONFIGS if c != "served")
    ap.add_argument("--configs", default=default, help=f"comma-separated rows from {list(CONFIGS)}")
    ap.add_argument(
        "--settings",
        default="{}",
        help="engine settings as JSON, over the scenario's (e.g. a GGUF target's draft_checkpoint, weights int4)",
    )
    ap.add_argument(
        "--mask-kernel",
        choices=("auto", "xgrammar"),
        default="auto",
        help="auto: the native mask kernel where the forward is native; xgrammar: xgrammar's kernel everywhere",
    )


def bench_compile(engine, items: list[dict]) -> dict:
    """Each schema compiled on a fresh engine (a miss), then again (a hit) -> ms percentiles."""
    from specgram.errors import InvalidRequest

    miss, hit, failed = [], [], []
    for it in items:
        t0 = time.perf_counter()
        try:
            compile_guide(engine, it["guide"])
        except InvalidRequest as e:
            failed.append((it["name"], str(e)[:120]))
            continue
        miss.append(1e3 * (time.perf_counter() - t0))
        t0 = time.perf_counter()
        compile_guide(engine, it["guide"])
        hit.append(1e3 * (time.perf_counter() - t0))
    return dict(
        n=len(items),
        compiled=len(miss),
        failed=failed,
        cache_mb=engine.grammar.cache_bytes() / 2**20,
        **{f"{name}_p{q}": pct(v, q) for name, v in (("miss", miss), ("hit", hit)) for q in (50, 90, 99)},
        miss_max=max(miss, default=0),
    )


def forced_positions(engine, cases, outs) -> float:
    """Replay the outputs through fresh matchers: the share of output positions where the grammar allowed exactly
    one token (an upper bound on what grammar-forced drafting could propose)."""
    import torch

    from specgram.grammar import guide as g_mod

    buf = torch.zeros((1, g_mod.bitmask_width(engine.target.vocab_size)), dtype=torch.int32)
    forced = total = 0
    for case, out in zip(cases, outs, strict=True):
        g = g_mod.Guide(engine.grammar.compile("json_schema", case["guide"]))
        for t in out:
            if g.terminated:
                break
            g.fill(buf, 0)
            total += 1
            forced += g_mod.single_allowed_token(buf[0].numpy()) >= 0
            if not g.matcher.accept_token(t):
                break
    return forced / max(total, 1)


def measure(engine, cases, timer, name: str, c: int, max_tokens: int) -> dict:
    """One timed run of a configuration -> its record with the report's figures added. Each run has a cache_salt
    of its own (run_engine's): the suffix store never drafts a run's answers from an earlier run's."""
    from .grammar_masks import mask_summary

    guided, drafter, k = CONFIGS[name]
    rec = run_engine(engine, cases, max_tokens, c, drafter, k, guided, engine.tokenizer, config=name)
    steps, gens = timer.take(), rec["_run"].generations
    tokens = sum(len(o) for o in ids(rec))
    return dict(
        rec,
        tok_s=tok_s(rec),
        tokens=tokens,
        ms_per_step=1e3 * rec["wall_s"] / len(rec["_run"].step_s),
        tok_per_step=tokens / max(sum(len(g.outputs) for g in gens), 1),
        alpha=acceptance(rec),
        forced=sum(s["forced"] for s in steps),
        n=len(gens),
        stop=sum(r["finish"] == "stop" for r in rec["requests"]),
        valid=sum(is_valid(r["text"], cases[r["case"]]["schema"]) for r in rec["requests"]),
        mask=mask_summary(steps) if guided else None,
    )


def run(args) -> None:
    from specgram.model.source import open_source

    from .grammar_masks import MaskTimer

    names = choose(args.configs, CONFIGS, ("unconstrained", "none"))
    items = load_jme()
    tok = open_source(args.model).tokenizer()
    cases = select_cases(tok, args.prompts, args.max_tokens, items)
    lens = [len(c["prompt_ids"]) for c in cases]
    need_int8 = any(CONFIGS[n][1] == "draft_model" for n in names)
    settings = {"draft_quantization": "int8" if need_int8 else "none", **(served_engine() if "served" in names else {})}
    engine = scenario_engine(args, cases, **{**settings, **json.loads(args.settings)})
    if args.mask_kernel == "xgrammar":
        engine.logits.masks.lib = None
    timer = MaskTimer()
    timer.install()
    comp = bench_compile(engine, items[:5] if args.quick else items)
    report.log(f"compile: {comp['compiled']}/{comp['n']} schemas; miss p50 {comp['miss_p50']:.1f} ms")
    timer.enabled = False  # warm-up: every config, every concurrency, a few tokens
    for c in args.concurrency:
        for n in names:
            measure(engine, cases[:c], timer, n, c, 6)
    timer.enabled = True
    timer.take()
    rows = []
    for c in args.concurrency:
        for n in names:
            r = measure(engine, cases, timer, n, c, args.max_tokens)
            rows.append(r)
            report.log(f"c {c} {n}: {r['tok_s']:.1f} tok/s, {r['tokens']} tokens, valid {r['valid']}/{r['n']}")
        ref = next(r for r in rows if r["concurrency"] == c and r["config"] == "none")
        for r in rows[-len(names) :]:
            r["speedup"] = r["tok_s"] / ref["tok_s"]
            r["exact"] = ids(r) == ids(ref) if r["guided"] else None
    forced = forced_positions(engine, cases, ids(next(r for r in rows if r["config"] == "none")))
    report.write(
        args, render(args, cases, lens, comp, rows, forced), dict(compile=comp, forced_positions=forced, rows=rows)
    )


def render(args, cases, lens, comp, rows, forced) -> list[str]:
    f = report.cell
    L = report.header(
        "Grammar-constrained decoding on CPU (JME schemas)",
        args,
        f"{len(cases)} JME schemas ({', '.join(c['name'] for c in cases)}), chat-templated extraction "
        f'("{INSTRUCTION}"), prompt tokens mean {statistics.mean(lens):.0f}; greedy, max_tokens '
        f"{args.max_tokens}, guide_type json_schema, concurrency {args.concurrency} (closed loop). "
        "One timed run per row, after a warm-up; the machine is noisy, so read differences under ~10% "
        "as noise.",
        PACKAGES,
    )
    L += [
        "## Compile time (GrammarCompiler.submit, json_schema)",
        "",
        *report.table(
            [
                "schemas",
                "compiled",
                "miss p50 ms",
                "miss p90 ms",
                "miss p99 ms",
                "miss max ms",
                "hit p50 ms",
                "hit p99 ms",
                "cache MiB",
            ],
            [
                [
                    comp["n"],
                    comp["compiled"],
                    *(f(comp[k]) for k in ("miss_p50", "miss_p90", "miss_p99", "miss_max")),
                    f(comp["hit_p50"], "{:.3f}"),
                    f(comp["hit_p99"], "{:.3f}"),
                    f(comp["cache_mb"]),
                ]
            ],
        ),
        "",
    ]
    if comp["failed"]:
        L += ["Failed to compile: " + "; ".join(f"{n} ({e})" for n, e in comp["failed"]), ""]
    L += [
        "Miss = first compile on a fresh engine; hit = the same schema again (the compiled-grammar cache).",
        "",
        "## Mask work per step",
        "",
        "Wall time per `engine.step()` inside StepMasks.fill / forced_prefix / seal / apply and the tentative "
        "accepts of the drafting picks (outermost call only). Per request-step = that step's time / guided "
        "requests in it. fill % = share of that time in xgrammar fill_next_token_bitmask (nested calls included); "
        "apply % = StepMasks.apply (gather = rows_for building the [rows, W] mask, kernel = "
        "xgrammar.apply_token_bitmask_inplace, or the native kernel where the forward is native); commit = "
        "Guide.commit (matcher accepts of the committed tokens), not included in the mask figures.",
        "",
        *report.table(
            [
                "c",
                "drafter",
                "k",
                "steps",
                "µs/step p50",
                "p90",
                "p99",
                "µs/req-step p50",
                "p90",
                "p99",
                "% of step",
                "fills/step",
                "µs/fill",
                "fill %",
                "apply % (gather, kernel)",
                "µs/apply",
                "commit µs/step p50",
            ],
            (
                [
                    r["concurrency"],
                    r["drafter"] or "none",
                    "auto" if r["k"] is None else r["k"],
                    m["steps"],
                    *(f(m[k], "{:.0f}") for k in ("step_p50", "step_p90", "step_p99", "req_p50", "req_p90", "req_p99")),
                    f(100 * m["share"]),
                    f(m["fills_per_step"]),
                    f(m["fill_us"], "{:.0f}"),
                    f(100 * m["fill_share"], "{:.0f}"),
                    f"{100 * m['breakdown']['apply']:.0f} ({100 * m['rows_for_share']:.0f}, "
                    f"{100 * m['kernel_share']:.0f})",
                    f(m["apply_us"], "{:.0f}"),
                    f(m["commit_p50"], "{:.0f}"),
                ]
                for r in rows
                if (m := r["mask"])
            ),
        ),
        "",
        "## Constrained vs unconstrained (no speculation)",
        "",
        "Output tok/s; the unconstrained outputs differ in length (ms/step is the fairer per-step cost).",
        "",
    ]
    pairs = [
        (
            next(r for r in rows if r["concurrency"] == c and r["config"] == "unconstrained"),
            next(r for r in rows if r["concurrency"] == c and r["config"] == "none"),
        )
        for c in args.concurrency
    ]
    L += [
        *report.table(
            [
                "c",
                "unconstrained tok/s",
                "guided tok/s",
                "ratio",
                "unconstrained ms/step",
                "guided ms/step",
                "unconstrained tokens",
                "guided tokens",
                "valid unconstrained",
                "valid guided",
            ],
            (
                [
                    g["concurrency"],
                    f(u["tok_s"]),
                    f(g["tok_s"]),
                    f"{g['tok_s'] / u['tok_s']:.2f}×",
                    f(u["ms_per_step"]),
                    f(g["ms_per_step"]),
                    u["tokens"],
                    g["tokens"],
                    f"{u['valid']}/{u['n']}",
                    f"{g['valid']}/{g['n']}",
                ]
                for u, g in pairs
            ),
        ),
        "",
        f"Positions where the grammar allows exactly one token (replaying the guided outputs): {100 * forced:.1f}%.",
        "",
        "Valid = parses as JSON (the whole text, or a ```json fence) and validates against the schema "
        "(jsonschema), as in every benchmark table.",
        "",
        "## Speculation under the grammar",
        "",
        *report.table(
            [
                "c",
                "drafter",
                "k",
                "tok/s",
                "α",
                "tok/step",
                "forced/token",
                "speedup",
                "exact",
                "finished (stop)",
                "valid",
            ],
            (
                [
                    r["concurrency"],
                    r["drafter"] or "none",
                    "auto" if r["k"] is None else r["k"],
                    f(r["tok_s"]),
                    f(r["alpha"], "{:.2f}"),
                    f(r["tok_per_step"], "{:.2f}"),
                    f(r["forced"] / max(r["tokens"], 1), "{:.2f}"),
                    f"{r['speedup']:.2f}×",
                    "yes" if r["exact"] else "NO",
                    f"{r['stop']}/{r['n']}",
                    f"{r['valid']}/{r['n']} ({100 * r['valid'] / max(r['stop'], 1):.0f}% of finished)",
                ]
                for r in rows
                if r["guided"]
            ),
        ),
        "",
        "α = accepted / drafted draft tokens (grammar-forced drafts included); tok/step = output tokens / "
        "request-steps (prefill step counts); forced/token = grammar-forced draft tokens proposed per output token; "
        "speedup = tok/s / guided no-speculation tok/s at the same concurrency; exact = output ids equal guided "
        "no-speculation for every prompt; int8 = int8 dynamic-quantized copy of the target "
        '(draft_quantization="int8").',
    ]
    return L
