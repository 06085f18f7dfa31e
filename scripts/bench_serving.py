"""Throughput through a running tritonserver over gRPC streaming: batch 1 vs N concurrent streams, one run.

    python scripts/bench_serving.py --url localhost:8001 --concurrency 1 8 --requests 8 --max-tokens 64

Every request produces exactly --max-tokens tokens (ignore_eos), greedy, chat-templated prompts.
Prints per concurrency: aggregate output tok/s, per-stream tok/s, mean TTFT, and the ratio to the first row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import benchlib  # noqa: F401  (puts client/ on sys.path)
from collect import errors_of, ids_of, stream_infer

PROMPTS = ["Write a short story about a robot.", "Explain how rainbows form.", "List ten fruits and their colors.",
           "Describe the water cycle.", "What makes a good cup of coffee?", "Summarize the history of Rome.",
           "Give tips for learning to code.", "Describe a walk in the forest."]


def one(url: str, prompt: str, max_tokens: int, extra: dict) -> tuple[int, float, float]:
    t0 = time.perf_counter()
    resps = stream_infer(url, {"text_input": prompt, "apply_chat_template": True, "stream": True,
                               "max_tokens": max_tokens, "ignore_eos": True, **extra})
    if errors_of(resps):
        raise RuntimeError(errors_of(resps))
    return len(ids_of(resps)), resps[0]["time"], time.perf_counter() - t0


def run(url: str, concurrency: int, n_requests: int, max_tokens: int, extra: dict) -> dict:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n_requests)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: one(url, p, max_tokens, extra), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    return {"concurrency": concurrency, "tok_s": tokens / wall,
            "stream_tok_s": statistics.mean(r[0] / r[2] for r in results),
            "ttft_ms": 1000 * statistics.mean(r[1] for r in results), "tokens": tokens, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=8, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--extra", default="{}", help="JSON of extra inputs, e.g. '{\"num_draft_tokens\": 4}'")
    args = ap.parse_args()
    extra = json.loads(args.extra)
    run(args.url, 1, 1, 8, extra)  # warm-up
    rows = [run(args.url, c, max(args.requests, c), args.max_tokens, extra) for c in args.concurrency]
    print("| concurrency | output tok/s (aggregate) | per-stream tok/s | mean TTFT ms | "
          f"ratio to c={rows[0]['concurrency']} |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['tok_s']:.1f} | {r['stream_tok_s']:.1f} | {r['ttft_ms']:.0f} | "
              f"{r['tok_s'] / rows[0]['tok_s']:.2f}x |")


if __name__ == "__main__":
    main()
