"""What every benchmark script shares: the workload (JME cases, prompts, the EOS set, requests), running it in
process (specgram.generate), JSON validity, percentiles, the machine and versions, and the common options.

Importing this module puts backend/ (specgram) and client/ (collect, triton_server, jme) on sys.path. It
imports only the standard library itself (scripts/compare/vllm_worker.py loads it in vLLM's own venv).

A run record (one system x configuration x concurrency; JSON, so that the vLLM worker can produce it too):
    system, config, guided, drafter, k, concurrency, dtype, wall_s, drafted, accepted (None = not reported),
    requests: [{case, ids, text, ttft_s, latency_s, finish}]   (times from that request's submission)
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "client", REPO / "backend"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from jme import load_jme  # noqa: E402,F401  (the one case loader: the repository's copy, by case number)

INSTRUCTION = "Extract the record as JSON matching the schema. Record: {record} Schema: {schema}"


# ---- workload ---------------------------------------------------------------------------------------------

# Engine settings every benchmark shares: a few JME schemas use keywords the grammar engine would not enforce
# (e.g. properties next to oneOf), which the server refuses by default; benchmarks measure speed on the whole
# workload, so they compile those schemas best effort. Benchmarks send the same prompts run after run: with
# prompt-prefix reuse on, a later run would skip prefills an earlier one paid for, so configurations compare
# with it off (scripts/bench_prefix_cache.py measures the reuse itself).
BENCH_ENGINE = {"json_unsupported_keywords": "ignore", "prefix_cache": "off"}


def prompt_text(item: dict) -> str:
    return INSTRUCTION.format(record=json.dumps(item["instance"]), schema=item["guide"])


def chat_ids(tok, text: str) -> list[int]:
    """The ids the engine builds for a request with apply_chat_template=True (its own prompt builder)."""
    from specgram.engine.prompt import prompt_ids

    return prompt_ids(tok, text, None, chat=True)


def select_cases(tok, n: int, max_tokens: int, items: list[dict] | None = None) -> list[dict]:
    """n evenly spaced JME cases (of `items`, default load_jme()) whose reference instance takes at most 60% of
    max_tokens (so a correct answer fits); each with prompt text and ids added."""
    items = [it for it in (load_jme() if items is None else items) if it["instance"] is not None
             and len(tok(json.dumps(it["instance"]))["input_ids"]) <= 0.6 * max_tokens]
    chosen = items[::max(len(items) // n, 1)][:n]
    for it in chosen:
        it["prompt"] = prompt_text(it)
        it["prompt_ids"] = chat_ids(tok, it["prompt"])
    return chosen


def eos_ids(model: str, tok) -> set[int]:
    """The EOS ids the engine stops on for this checkpoint (specgram.loading)."""
    from specgram.engine.loading import checkpoint_eos_ids

    return checkpoint_eos_ids(model, tok)


def trim_at_eos(ids: list[int], eos) -> list[int]:
    """Output ids up to, not including, the first EOS: one token count for every system."""
    out = []
    for t in ids:
        if t in eos:
            break
        out.append(t)
    return out


def make_requests(engine, prompt_ids: list[list[int]], max_tokens: int, drafter: str | None = None, k: int = 0,
                  guides: list[str] | None = None, **params) -> list:
    """Greedy requests, one per prompt; guides: a json_schema guide per prompt (None = unguided). The grammars'
    compiles have finished when this returns, so a timed run that follows excludes them."""
    from specgram.request import SamplingParams

    reqs = []
    for i, ids in enumerate(prompt_ids):
        guide = guides[i] if guides is not None else None
        p = SamplingParams(max_tokens=max_tokens, temperature=0.0, num_draft_tokens=k, drafter=drafter or "ngram",
                           guide_type="json_schema" if guide is not None else None, guide=guide, **params)
        reqs.append(engine.make_request(p, prompt_ids=ids))
    for r in reqs:
        if r.pending_grammar is not None:
            r.pending_grammar.future.result()
    return reqs


def compile_guide(engine, guide: str):
    """What a request pays for a json_schema guide: checked, compiled (in a worker, then in the engine process)
    or found in the engine's cache, which it then fills. Raises InvalidRequest."""
    return engine.grammar.submit(engine.grammar.check("json_schema", guide), guide).future.result()


def run_batches(engine, reqs: list, batch: int) -> list:
    """Groups of `batch` requests, each group submitted together and run to its end before the next
    (batch 1 = one after another). -> the specgram.generate Runs; raises on a request's error."""
    from specgram.engine.generate import generate

    runs = [generate(engine, reqs[i:i + batch]) for i in range(0, len(reqs), batch)]
    errors = [e for r in runs for e in r.errors]
    if errors:
        raise RuntimeError(errors[0])
    return runs


# ---- measures -----------------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linear between the two nearest ranks (numpy's default); nan when empty."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo, frac = int(pos), pos - int(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * frac


def parse_json(text: str):
    """-> (ok, object): the whole output, or the text inside a ```json fence (how unguided models answer)."""
    text = text.strip()
    m = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    for candidate in (text, m.group(1) if m else None):
        if candidate is None:
            continue
        try:
            return True, json.loads(candidate)
        except ValueError:
            pass
    return False, None


def is_valid(text: str, schema: dict) -> bool:
    """Valid JSON, in every published table: parses (see parse_json) and validates against the schema."""
    import jsonschema

    ok, obj = parse_json(text)
    if not ok:
        return False
    try:
        jsonschema.validate(obj, schema)
        return True
    except (jsonschema.exceptions.ValidationError, jsonschema.exceptions.SchemaError):
        return False


# ---- machine, versions, options ----------------------------------------------------------------------------

def machine() -> str:
    """CPU model and cores, RAM, GPU (if any), OS, torch threads when torch is loaded."""
    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = f"{cpu}, {os.cpu_count()} cores"
    try:
        out += f", {int(Path('/proc/meminfo').read_text().split()[1]) / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    if shutil.which("nvidia-smi"):
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
            out += f", GPU {gpu}" if gpu else ""
        except (OSError, subprocess.SubprocessError):
            pass
    if "torch" in sys.modules:
        out += f", torch {sys.modules['torch'].get_num_threads()} threads"
    return f"{out}, {platform.system()} {platform.release()}"


def versions(packages=("torch", "transformers", "xgrammar")) -> str:
    out = []
    for p in packages:
        try:
            out.append(f"{p} {md.version(p)}")
        except md.PackageNotFoundError:
            out.append(f"{p} ?")
    return ", ".join(out) + f", Python {platform.python_version()}"


def common_args(ap: argparse.ArgumentParser, configs: dict, max_tokens: int, quick_help: str) -> None:
    """The options every in-process benchmark takes: model, rows, batch sizes, length, torch threads, --quick."""
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--configs", default=",".join(configs), help=f"comma-separated rows from {list(configs)}")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=max_tokens)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true", help=quick_help)


def arrival_args(doc: str) -> argparse.Namespace:
    """The options of the benchmarks that send a set of prompts and compare engine settings on it (prefix reuse,
    prefill scheduling): parsed, with --quick applied (2 prompts, 16 tokens, one repeat) and threads set."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--out", default="", help="also write the markdown report here")
    ap.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, one run: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.repeat = 2, 16, 1
    set_threads(args.threads)
    return args


def arrival_cases(tok, args: argparse.Namespace) -> list[dict]:
    """The JME cases for arrival_args(); --quick picks them as a 128-token run would (none fits 16 tokens)."""
    return select_cases(tok, args.prompts, 128 if args.quick else args.max_tokens)


def arrival_run(engine, cases: list[dict], max_tokens: int, concurrency: int = 0, k: int = 0,
                guided: bool = False) -> dict:
    """One timed run of the cases (greedy, n-gram drafter with num_draft_tokens k; concurrency 0 = all at
    once) -> its TTFT p50 / mean (s), output tok/s, prompt tokens reused from the prefix cache, output ids."""
    from specgram.engine.generate import generate

    reqs = make_requests(engine, [c["prompt_ids"] for c in cases], max_tokens, "ngram", k,
                         [c["guide"] for c in cases] if guided else None)
    run = generate(engine, reqs, concurrency or len(reqs))
    ttft = [g.first_token_s for g in run.generations]
    return dict(ttft_p50=statistics.median(ttft), ttft_mean=statistics.mean(ttft),
                tok_s=sum(len(g.token_ids) for g in run.generations) / run.wall_s,
                reused=sum(r.cached_prompt_tokens for r in reqs), ids=[g.token_ids for g in run.generations])


def arrival_header(title: str, script: str, args: argparse.Namespace, workload: str) -> list[str]:
    """The first lines of an arrival benchmark's markdown report: title, command, machine, versions, workload."""
    return [f"# {title}", "", f"Command: `python scripts/{script}{' --quick' if args.quick else ''}`  ",
            f"Machine: {machine()}  ", f"Versions: {versions()}  ", f"Workload: {workload}", ""]


def arrival_cells(runs: list[dict], reference: list) -> list[str]:
    """Report cells of one setting's repeated runs (dicts with ttft_p50, ttft_mean, tok_s, ids): the medians
    (TTFT in ms), and whether every run's output ids equal `reference`."""
    def med(key):
        return statistics.median(r[key] for r in runs)
    exact = all(r["ids"] == reference for r in runs)
    return [f"{med('ttft_p50') * 1e3:.0f}", f"{med('ttft_mean') * 1e3:.0f}", f"{med('tok_s'):.1f}",
            "yes" if exact else "NO"]


def emit_report(lines: list[str], out: str) -> None:
    """Print a markdown report, and write it to `out` too when given."""
    print("\n".join(lines))
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


def set_threads(n: int) -> None:
    if n:
        import torch
        torch.set_num_threads(n)


def select_configs(ap: argparse.ArgumentParser, text: str, known: dict, required: tuple[str, ...]) -> list[str]:
    """'a,b' -> the named rows in `known`'s order, with the `required` reference rows always included."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {list(known)}")
    names += [r for r in required if r not in names]
    return sorted(names, key=list(known).index)
