"""The compare scenario's llama.cpp peer: llama-cpp-python on GGUF files of the same model; runs inside
build/peers/llamacpp (scripts/compare/setup_llamacpp.sh), never in the project venv, standalone. Reads a job JSON,
writes run records (scripts/benchlib/run.py) as JSON, as scripts/compare/vllm_worker.py does:

    build/peers/llamacpp/bin/python scripts/compare/llamacpp_worker.py job.json out.json

job: {gguf: {label: path}, max_tokens, threads, lookup: [0 | k], guided: [false, true], eos: [..],
      cases: [{name, guide, prompt_ids}]}
One Llama per (GGUF, lookup) setting; a GGUF's rows are system "llama.cpp <label>" (its type: F32, Q8_0, Q4_K_M).
llama-cpp-python decodes one sequence at a time (no batching of requests), so every run is concurrency 1: the
cases one after another. Each request feeds the prompt's token ids to
Llama.generate (greedy: temperature 0, top_k 1) and stops at EOS or max_tokens; the KV cache is reset before each
one, so no request reuses an earlier one's prompt prefix (as in our runs and vLLM's). lookup k: llama-cpp-python's
prompt-lookup drafter (LlamaPromptLookupDecoding, k tokens per draft); drafted / accepted are counted here from
its drafts and the tokens that followed. guided: llama.cpp's JSON-schema grammar (LlamaGrammar.from_json_schema),
built before the clock starts; a case whose schema it rejects runs without one (no_grammar: case -> the error).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchlib.workload: stdlib-only at import


class CountingLookup:
    """Wraps the prompt-lookup drafter: keeps each draft with the number of tokens generated when it was made, so
    that accepted drafts can be counted afterwards (greedy: a draft token is accepted iff it equals the token
    generated at its position, counting from the draft's start up to the first difference)."""

    def __init__(self, k: int):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        # max_ngram_size 4: the longest n-gram matched, as vLLM's prompt_lookup_max in its row
        self.inner = LlamaPromptLookupDecoding(max_ngram_size=4, num_pred_tokens=k)
        self.drafts: list[tuple[int, list[int]]] = []
        self.prompt_len = 0

    def __call__(self, input_ids, /, **kwargs):
        out = self.inner(input_ids, **kwargs)
        # input_ids = prompt + generated tokens so far; the draft proposes the tokens after them
        self.drafts.append((len(input_ids) - self.prompt_len, [int(t) for t in out]))
        return out

    def count(self, generated: list[int]) -> tuple[int, int]:
        drafted = accepted = 0
        for at, draft in self.drafts:
            drafted += len(draft)
            for i, t in enumerate(draft):
                if at + i >= len(generated) or generated[at + i] != t:
                    break
                accepted += 1
        return drafted, accepted


def one_request(llm, case: dict, max_tokens: int, eos: set[int], grammar, lookup) -> dict:
    from benchlib.workload import trim_at_eos

    if lookup is not None:
        lookup.drafts, lookup.prompt_len = [], len(case["prompt_ids"])
    llm.reset()  # no prompt-prefix reuse across requests
    ids: list[int] = []
    t0 = time.perf_counter()
    ttft = None
    finish = "length"
    for t in llm.generate(case["prompt_ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, grammar=grammar):
        if ttft is None:
            ttft = time.perf_counter() - t0
        ids.append(int(t))
        if t in eos:
            finish = "stop"
            break
        if len(ids) >= max_tokens:
            break
    latency = time.perf_counter() - t0
    gen = trim_at_eos(ids, eos)
    text = llm.detokenize(gen).decode("utf-8", errors="replace")
    out = dict(ids=gen, text=text, ttft_s=ttft if ttft is not None else latency, latency_s=latency, finish=finish)
    if lookup is not None:
        out["drafted"], out["accepted"] = lookup.count(ids)
    return out


def run(llm, cases, grammars, lookup, k, guided, max_tokens, eos, gtype) -> dict:
    from benchlib.run import peer_run

    return peer_run(
        cases,
        lambda i, c: one_request(llm, c, max_tokens, eos, grammars[i] if guided else None, lookup),
        system=f"llama.cpp {gtype}",
        config=f"prompt lookup k{k}" if k else "target only",
        guided=guided,
        drafter="prompt lookup" if k else None,
        k=k,
        dtype=gtype,
    )


def main() -> None:
    job = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    import llama_cpp
    from llama_cpp import Llama, LlamaGrammar

    eos = set(job["eos"])
    cases = job["cases"]
    n_ctx = max(len(c["prompt_ids"]) for c in cases) + job["max_tokens"] + 32  # + room for a last draft
    # grammars built once, before any timing (llama.cpp still parses each into a sampler per request); a schema
    # its converter rejects leaves that case's guided requests without a grammar, named in the output
    grammars, no_grammar = [], {}
    for c in cases if any(job["guided"]) else []:
        try:
            grammars.append(LlamaGrammar.from_json_schema(c["guide"], verbose=False))
        except Exception as e:  # noqa: BLE001 - the converter raises AssertionError, ValueError, ...
            grammars.append(None)
            no_grammar[c["name"]] = f"{type(e).__name__}: {str(e)[:120]}"
    results = []
    for gtype, path in job["gguf"].items():
        for k in job["lookup"]:
            lookup = CountingLookup(k) if k else None
            t0 = time.perf_counter()
            # logits_all: llama-cpp-python turns it on by itself with a drafter (it samples every drafted position)
            llm = Llama(
                model_path=path,
                n_ctx=n_ctx,
                n_batch=min(n_ctx, 2048),
                n_threads=job["threads"],
                n_threads_batch=job["threads"],
                draft_model=lookup,
                seed=0,
                verbose=False,
            )
            print(
                f"# llama-cpp-python {llama_cpp.__version__} {gtype} lookup={k}: model ready in "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
            for guided in job["guided"]:
                run(llm, cases[:2], grammars, lookup, k, guided, 8, eos, gtype)  # warm-up
                r = run(llm, cases, grammars, lookup, k, guided, job["max_tokens"], eos, gtype)
                toks = sum(len(q["ids"]) for q in r["requests"])
                print(f"# {r['system']} {r['config']} guided={guided} c=1: {toks / r['wall_s']:.1f} tok/s")
                results.append(r)
                out = dict(llamacpp=llama_cpp.__version__, results=results, no_grammar=no_grammar)
                json.dump(out, open(out_path, "w"))
            del llm


if __name__ == "__main__":
    main()
