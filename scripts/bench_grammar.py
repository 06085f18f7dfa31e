"""Grammar-constrained decoding in process (no Triton): what the grammar costs and what speculation gains under it.

    python scripts/bench_grammar.py              # full run on JME schemas, ~10 min on a 2-core CPU
    python scripts/bench_grammar.py --quick      # 3 schemas, 48 tokens: a smoke run (writes grammar_cpu_quick.*)

One run prints (and writes to docs/benchmarks/grammar_cpu.md / .json):
  compile     what a request pays for each JME schema's grammar (GrammarCompiler.submit): cache miss (a
              worker process, then the engine process) and hit (same schema again), p50/p99 ms
  mask work   per engine.step(): wall time inside StepMasks.fill / forced_prefix / seal / apply and the
              tentative accepts of Engine._pick (monkeypatched here, outermost call only), p50/p90/p99 µs
              per step and per request-step (divided by the guided requests in that step); matcher commits
              (Guide.commit) are reported beside it, not inside it
  tok/s       the same prompts unconstrained vs json_schema-guided, both without speculation, batch 1 and 8
  speculation guided, each drafter (grammar = forced tokens only, ngram, int8 draft model): tok/s, α, tokens per
              step, speedup vs guided no-speculation at the same batch size, exact (same ids as guided no-spec)
  validity    finished guided outputs that parse and validate against their schema (jsonschema)

Prompts: chat-templated extraction tasks built from each schema's first valid instance
("Extract the record as JSON matching the schema. Record: <instance> Schema: <schema>"), greedy. Batch 1 =
the prompts one after another; batch 8 = groups of 8 submitted together. Grammars are compiled (cache hits)
before each timed run starts, so decode timings exclude compiles.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from benchlib import (
    BENCH_ENGINE,
    INSTRUCTION,
    REPO,
    common_args,
    compile_guide,
    is_valid,
    load_jme,
    machine,
    make_requests,
    pct,
    run_batches,
    select_cases,
    select_configs,
    set_threads,
    versions,
)

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.engine.loading import load_tokenizer
from specgram.errors import InvalidRequest
from specgram.grammar import guide as grammar_mod
from specgram.grammar import masks as masks_mod

# name -> (guided, drafter, k)
CONFIGS = {
    "unconstrained": (False, None, 0),
    "none": (True, None, 0),
    "grammar-k4": (True, "grammar", 4),
    "grammar-k8": (True, "grammar", 8),
    "ngram-k4": (True, "ngram", 4),
    "int8-k2": (True, "draft_model", 2),
    "int8-k4": (True, "draft_model", 4),
}


# ---- instrumentation ------------------------------------------------------------------------------------

class MaskTimer:
    """Wall time spent in grammar-mask code per engine.step(), by outermost wrapped call."""

    MASK = ("fill", "forced_prefix", "seal", "apply", "tentative")   # the headline "mask work"

    def __init__(self):
        self.depth = 0
        self.cur: dict[str, float] = defaultdict(float)    # outermost calls, this step
        self.incl: dict[str, float] = defaultdict(float)   # every call, this step
        self.calls: dict[str, int] = defaultdict(int)
        self.forced = 0
        self.guides: set[int] = set()
        self.steps: list[dict] = []
        self.enabled = True

    def wrap(self, owner, attr: str, cat: str):
        fn = getattr(owner, attr)
        timer = self

        def wrapped(*a, **kw):
            outer = timer.depth == 0
            timer.depth += 1
            t0 = time.perf_counter()
            try:
                out = fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                timer.depth -= 1
                timer.incl[cat] += dt           # inclusive, nested or not
                timer.calls[cat] += 1
                if outer:                       # nested calls are counted in their outermost caller
                    timer.cur[cat] += dt
            if cat == "forced_prefix":
                timer.forced += len(out)
            return out

        wrapped.__wrapped__ = fn
        setattr(owner, attr, wrapped)

    def install(self) -> None:
        SM, G = masks_mod.StepMasks, grammar_mod.Guide
        self.wrap(SM, "fill", "fill")
        self.wrap(SM, "forced_prefix", "forced_prefix")
        self.wrap(SM, "seal", "seal")
        self.wrap(SM, "apply", "apply")
        self.wrap(G, "try_tentative", "tentative")   # top level only from Engine._pick (drafting)
        self.wrap(G, "rollback", "rollback")         # top level never (inside seal); kept for completeness
        self.wrap(G, "commit", "commit")
        self.wrap(SM, "rows_for", "rows_for")        # inside apply: gathering the mask rows
        import xgrammar
        self.wrap(xgrammar, "apply_token_bitmask_inplace", "kernel")   # inside apply: xgrammar's CPU kernel
        orig_commit = G.commit
        timer = self

        def commit(guide, token):
            timer.guides.add(id(guide))
            return orig_commit(guide, token)
        G.commit = commit
        orig_step = Engine.step

        def step(engine):
            timer.cur.clear()
            timer.incl.clear()
            timer.calls.clear()
            timer.forced = 0
            timer.guides.clear()
            t0 = time.perf_counter()
            out = orig_step(engine)
            wall = time.perf_counter() - t0
            if timer.enabled and timer.guides:
                timer.steps.append(dict(wall=wall, n=len(timer.guides), fills=timer.calls["fill"], forced=timer.forced,
                                        fill_incl=timer.incl["fill"], rows_for=timer.incl["rows_for"],
                                        kernel=timer.incl["kernel"], apply_calls=timer.calls["apply"],
                                        mask=sum(timer.cur[c] for c in MaskTimer.MASK), **dict(timer.cur)))
            return out
        Engine.step = step

    def take(self) -> list[dict]:
        s, self.steps = self.steps, []
        return s


def mask_summary(steps: list[dict]) -> dict:
    per_step = [1e6 * s["mask"] for s in steps]
    per_req = [1e6 * s["mask"] / s["n"] for s in steps]
    tot_mask = sum(s["mask"] for s in steps)
    cats = {c: sum(s.get(c, 0.0) for s in steps) for c in MaskTimer.MASK}
    return dict(
        steps=len(steps),
        step_p50=pct(per_step, 50), step_p90=pct(per_step, 90), step_p99=pct(per_step, 99),
        req_p50=pct(per_req, 50), req_p90=pct(per_req, 90), req_p99=pct(per_req, 99),
        commit_p50=pct([1e6 * s.get("commit", 0.0) for s in steps], 50),
        share=tot_mask / max(sum(s["wall"] for s in steps), 1e-12),
        fills_per_step=statistics.mean(s["fills"] for s in steps) if steps else 0.0,
        fill_us=1e6 * sum(s["fill_incl"] for s in steps) / max(sum(s["fills"] for s in steps), 1),
        fill_share=sum(s["fill_incl"] for s in steps) / max(tot_mask, 1e-12),
        breakdown={c: v / max(tot_mask, 1e-12) for c, v in cats.items()},
        rows_for_share=sum(s["rows_for"] for s in steps) / max(tot_mask, 1e-12),
        kernel_share=sum(s["kernel"] for s in steps) / max(tot_mask, 1e-12),
        apply_us=1e6 * cats["apply"] / max(sum(s["apply_calls"] for s in steps), 1),
    )


# ---- compile --------------------------------------------------------------------------------------------

def bench_compile(engine: Engine, items: list[dict]) -> dict:
    gc_ = engine.grammar                                # a fresh engine: its cache is empty
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
    return dict(n=len(items), compiled=len(miss), failed=failed,
                miss_p50=pct(miss, 50), miss_p90=pct(miss, 90), miss_p99=pct(miss, 99), miss_max=max(miss, default=0),
                miss_mean=statistics.mean(miss) if miss else 0,
                hit_p50=pct(hit, 50), hit_p90=pct(hit, 90), hit_p99=pct(hit, 99), hit_max=max(hit, default=0),
                cache_mb=gc_.cache_bytes() / 2**20)


# ---- decode runs ----------------------------------------------------------------------------------------

def run(engine: Engine, items, pids, cfg: str, max_tokens: int, batch: int) -> dict:
    guided, drafter, k = CONFIGS[cfg]
    reqs = make_requests(engine, pids, max_tokens, drafter, k, [it["guide"] for it in items] if guided else None)
    gc.collect()
    runs = run_batches(engine, reqs, batch)
    gens = [g for r in runs for g in r.generations]
    return dict(seconds=sum(r.wall_s for r in runs), outs=[g.token_ids for g in gens],
                steps=sum(len(r.step_s) for r in runs), reasons=[g.final.finish_reason for g in gens],
                drafted=sum(g.spec.drafted for g in gens), accepted=sum(g.spec.accepted for g in gens),
                req_steps=sum(len(g.outputs) for g in gens))


def validity(tok, items, outs, reasons) -> dict:
    """Finished (stop) outputs, and outputs that are valid (benchlib.is_valid) against their schema."""
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in outs]
    return dict(n=len(outs), stop=sum(why == "stop" for why in reasons),
                valid=sum(is_valid(t, it["schema"]) for it, t in zip(items, texts)))


def forced_positions(engine: Engine, items, outs) -> float:
    """Replay the outputs through fresh matchers: the share of output positions where the grammar allowed exactly
    one token (an upper bound on what grammar-forced drafting could propose)."""
    buf = torch.zeros((1, grammar_mod.bitmask_width(engine.target.vocab_size)), dtype=torch.int32)
    forced = total = 0
    for it, ids in zip(items, outs):
        g = grammar_mod.Guide(engine.grammar.compile("json_schema", it["guide"]))
        for t in ids:
            if g.terminated:
                break
            g.fill(buf, 0)
            total += 1
            forced += grammar_mod.single_allowed_token(buf[0].numpy()) >= 0
            if not g.matcher.accept_token(t):
                break
    return forced / max(total, 1)


# ---- report ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, CONFIGS, 160, "2 schemas (compile: 5), 48 tokens, batches 1 and 2")
    ap.add_argument("--schemas", type=int, default=8, help="JME schemas used as decode prompts (evenly spaced)")
    ap.add_argument("--out", default="", help="output stem (default docs/benchmarks/grammar_cpu[_quick])")
    args = ap.parse_args()
    if args.quick:
        args.schemas, args.max_tokens, args.batches = 2, 48, [1, 2]
    set_threads(args.threads)
    names = select_configs(ap, args.configs, CONFIGS, ("unconstrained", "none"))
    out_stem = Path(args.out) if args.out else REPO / "docs" / "benchmarks" / ("grammar_cpu_quick" if args.quick
                                                                                else "grammar_cpu")
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *sys.argv[1:]])

    items = load_jme()
    all_items = items[:5] if args.quick else items
    tok = load_tokenizer(args.model)
    # decode prompts: evenly spaced schemas whose instance fits comfortably in max_tokens
    chosen = select_cases(tok, args.schemas, args.max_tokens, items)
    pids = [it["prompt_ids"] for it in chosen]
    max_slots = max(args.batches)
    max_seq_len = max(map(len, pids)) + args.max_tokens + 16
    need_int8 = any(CONFIGS[n][1] == "draft_model" for n in names)
    config = EngineConfig(checkpoint=args.model, device="cpu", dtype="float32", max_slots=max_slots,
                          max_seq_len=max_seq_len, max_draft_len=8, default_max_tokens=args.max_tokens,
                          draft_quantization="int8" if need_int8 else "none", **BENCH_ENGINE)
    engine = Engine.from_config(config)
    timer = MaskTimer()
    timer.install()

    header = (f"{Path(args.model).name} fp32 target on {machine()}; "
              f"{versions(('torch', 'transformers', 'xgrammar', 'jsonschema'))}; "
              f"load avg at start {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}")
    print(f"# {header}", flush=True)
    print(f"# decode prompts: {', '.join(it['name'] for it in chosen)} (prompt tokens mean "
          f"{statistics.mean(map(len, pids)):.0f}, max {max(map(len, pids))}); max_tokens {args.max_tokens}, greedy",
          flush=True)

    # 1. compile
    comp = bench_compile(engine, all_items)
    print(f"# compile: {comp['compiled']}/{comp['n']} schemas; miss p50 {comp['miss_p50']:.1f} ms p99 "
          f"{comp['miss_p99']:.1f} ms; hit p50 {comp['hit_p50']:.3f} ms p99 {comp['hit_p99']:.3f} ms", flush=True)
    for name, err in comp["failed"]:
        print(f"#   failed {name}: {err}", flush=True)
    for it in chosen:                                   # the decode grammars stay cached (hits) from here on
        compile_guide(engine, it["guide"])

    # 2. warm-up: every config, every batch size, a few tokens
    timer.enabled = False
    for b in args.batches:
        for n in names:
            run(engine, chosen[:b], pids[:b], n, 6, b)
    timer.enabled = True
    timer.take()

    # 3. timed runs
    rows = []
    for b in args.batches:
        ref = None
        for n in names:
            guided, drafter, k = CONFIGS[n]
            r = run(engine, chosen, pids, n, args.max_tokens, b)
            steps = timer.take()
            tokens = sum(map(len, r["outs"]))
            row = dict(batch=b, config=n, guided=guided, drafter=drafter or "none", k=k, tokens=tokens,
                       seconds=r["seconds"], tps=tokens / r["seconds"], engine_steps=r["steps"],
                       ms_per_step=1e3 * r["seconds"] / r["steps"],
                       tok_per_step=tokens / max(r["req_steps"], 1),
                       alpha=r["accepted"] / r["drafted"] if r["drafted"] else None,
                       drafted=r["drafted"], accepted=r["accepted"],
                       forced=sum(s["forced"] for s in steps),
                       stop=sum(x == "stop" for x in r["reasons"]), n=len(r["outs"]),
                       validity=validity(tok, chosen, r["outs"], r["reasons"]),
                       forced_positions=forced_positions(engine, chosen, r["outs"]) if n == "none" else None,
                       mask=mask_summary(steps) if guided else None)
            if n == "none":
                ref = r
            row["exact"] = (r["outs"] == ref["outs"]) if guided and ref is not None else None
            row["_outs"] = r["outs"]
            rows.append(row)
            a = f"{row['alpha']:.2f}" if row["alpha"] is not None else "-"
            ms = row["mask"]
            print(f"# batch {b} {n}: {row['tps']:.1f} tok/s, {tokens} tokens, {row['ms_per_step']:.1f} ms/step, "
                  f"α {a}, tok/step {row['tok_per_step']:.2f}, valid {row['validity']['valid']}/{row['n']}"
                  + (f", mask p50 {ms['step_p50']:.0f} µs/step ({100 * ms['share']:.1f}% of step)" if ms else ""),
                  flush=True)
    for b in args.batches:
        base = next(r for r in rows if r["batch"] == b and r["config"] == "none")
        for r in rows:
            if r["batch"] == b:
                r["speedup"] = r["tps"] / base["tps"]

    md_text = report(args, command, header, chosen, pids, comp, rows, time.perf_counter() - t_start)
    print()
    print(md_text)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    out_stem.with_suffix(".md").write_text(md_text)
    out_stem.with_suffix(".json").write_text(json.dumps(dict(
        command=command, header=header, prompts=[it["name"] for it in chosen], max_tokens=args.max_tokens,
        compile=comp, rows=[{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]), indent=1))
    print(f"\n# wrote {out_stem.with_suffix('.md')} and .json; total {time.perf_counter() - t_start:.0f} s; "
          f"load avg now {os.getloadavg()[0]:.2f}", flush=True)


def report(args, command, header, chosen, pids, comp, rows, elapsed) -> str:
    L = ["# Grammar-constrained decoding on CPU (JME schemas)", "",
         f"Command: `{command}` ({elapsed:.0f} s)  ", f"Machine: {header}", "",
         f"Decode prompts: {len(chosen)} JME schemas ({', '.join(it['name'] for it in chosen)}), chat-templated "
         f"extraction (\"{INSTRUCTION}\"), prompt tokens mean {statistics.mean(map(len, pids)):.0f}; greedy, "
         f"max_tokens {args.max_tokens}, guide_type json_schema. Batch 1 = prompts one after another; batch "
         f"{max(args.batches)} = submitted together. One timed run per row, after a warm-up; the machine is noisy, "
         "so read differences under ~10% as noise.", "",
         "## Compile time (GrammarCompiler.submit, json_schema)", "",
         "| schemas | compiled | miss p50 ms | miss p90 ms | miss p99 ms | miss max ms | hit p50 ms | hit p99 ms | cache MiB |",
         "|---|---|---|---|---|---|---|---|---|",
         f"| {comp['n']} | {comp['compiled']} | {comp['miss_p50']:.1f} | {comp['miss_p90']:.1f} | {comp['miss_p99']:.1f} | "
         f"{comp['miss_max']:.1f} | {comp['hit_p50']:.3f} | {comp['hit_p99']:.3f} | {comp['cache_mb']:.1f} |", ""]
    if comp["failed"]:
        L += ["Failed to compile: " + "; ".join(f"{n} ({e})" for n, e in comp["failed"]), ""]
    L += ["Miss = first compile after `clear_cache()`; hit = the same schema again (xgrammar's compiled-grammar cache). "
          "Called directly, without the engine's compile thread pool.", "",
          "## Mask work per step", "",
          "Wall time per `engine.step()` inside StepMasks.fill / forced_prefix / seal / apply and the tentative "
          "accepts in Engine._pick (outermost call only). Per request-step = that step's time / guided "
          "requests in it. fill % = share of that time in xgrammar fill_next_token_bitmask (nested calls included); "
          "apply % = StepMasks.apply (gather = rows_for building the [rows, W] mask, kernel = "
          "xgrammar.apply_token_bitmask_inplace); commit = Guide.commit (matcher accepts of "
          "the committed tokens), not included in the mask figures.", "",
          "| batch | drafter | k | steps | µs/step p50 | p90 | p99 | µs/req-step p50 | p90 | p99 | % of step | fills/step | µs/fill | fill % | apply % (gather, kernel) | µs/apply | commit µs/step p50 |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["mask"]
        if m:
            L.append(f"| {r['batch']} | {r['drafter']} | {r['k']} | {m['steps']} | {m['step_p50']:.0f} | {m['step_p90']:.0f} | "
                     f"{m['step_p99']:.0f} | {m['req_p50']:.0f} | {m['req_p90']:.0f} | {m['req_p99']:.0f} | "
                     f"{100 * m['share']:.1f} | {m['fills_per_step']:.1f} | {m['fill_us']:.0f} | "
                     f"{100 * m['fill_share']:.0f} | {100 * m['breakdown']['apply']:.0f} ({100 * m['rows_for_share']:.0f}, "
                     f"{100 * m['kernel_share']:.0f}) | {m['apply_us']:.0f} | {m['commit_p50']:.0f} |")
    L += ["", "## Constrained vs unconstrained (no speculation)", "",
          "Output tok/s; the unconstrained outputs differ in length (ms/step is the fairer per-step cost).", "",
          "| batch | unconstrained tok/s | guided tok/s | ratio | unconstrained ms/step | guided ms/step | "
          "unconstrained tokens | guided tokens | valid unconstrained | valid guided |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for b in args.batches:
        u = next(r for r in rows if r["batch"] == b and r["config"] == "unconstrained")
        g = next(r for r in rows if r["batch"] == b and r["config"] == "none")
        L.append(f"| {b} | {u['tps']:.1f} | {g['tps']:.1f} | {g['tps'] / u['tps']:.2f}× | {u['ms_per_step']:.1f} | "
                 f"{g['ms_per_step']:.1f} | {u['tokens']} | {g['tokens']} | {u['validity']['valid']}/{u['n']} | "
                 f"{g['validity']['valid']}/{g['n']} |")
    g1 = next(r for r in rows if r["config"] == "none")
    L += ["", f"Positions where the grammar allows exactly one token (replaying the guided outputs): "
          f"{100 * g1['forced_positions']:.1f}%.", ""]
    L += ["", "Valid = parses as JSON (the whole text, or a ```json fence) and validates against the schema "
          "(jsonschema), as in every benchmark table.", "",
          "## Speculation under the grammar", "",
          "| batch | drafter | k | tok/s | α | tok/step | forced/token | speedup | exact | finished (stop) | valid |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["guided"]:
            continue
        a = f"{r['alpha']:.2f}" if r["alpha"] is not None else "–"
        v = r["validity"]
        L.append(f"| {r['batch']} | {r['drafter']} | {r['k']} | {r['tps']:.1f} | {a} | {r['tok_per_step']:.2f} | "
                 f"{r['forced'] / max(r['tokens'], 1):.2f} | {r['speedup']:.2f}× | {'yes' if r['exact'] else 'NO'} | "
                 f"{r['stop']}/{r['n']} | {v['valid']}/{v['n']} ({100 * v['valid'] / max(v['stop'], 1):.0f}% of finished) |")
    L += ["", "α = accepted / drafted draft tokens (grammar-forced drafts included); tok/step = output tokens / "
          "request-steps (prefill step counts); forced/token = grammar-forced draft tokens proposed per output token; "
          "speedup = tok/s / guided no-speculation tok/s at the same batch size; exact = output ids equal guided "
          "no-speculation for every prompt; int8 = int8 dynamic-quantized copy of the target "
          "(draft_quantization=\"int8\").", ""]
    return "\n".join(L)


if __name__ == "__main__":
    main()
