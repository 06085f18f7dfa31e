"""What one target forward costs, against what the memory allows: the step-cost table, one run.

    python scripts/bench_forward.py                      # SmolLM2-135M, fp32, cache length 300
    python scripts/bench_forward.py --dtype bfloat16 --linear eager
    python scripts/bench_forward.py --quick              # fewer repeats: a smoke run

Per shape (B rows of T new tokens each, every row attending to --cache-len earlier positions):
  forward ms   ModelRunner.forward_rows, the engine's call (median of --repeat interleaved runs)
  matmul ms    the same forward's weight matmuls alone (every Linear of the model in order, M = B*T rows),
               through the runner's own linear kernels
  bound ms     weight bytes / the read bandwidth measured in this run: a forward cannot be faster
  x bound      forward ms / bound ms (1.0 = at the memory bound)
  v            forward(B, T) / forward(B, 1): what verifying T tokens costs relative to decoding one
Also printed: the read bandwidth (best of a few sums over a 1 GiB tensor) and the torch thread count.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "backend"))

import torch  # noqa: E402

from specgram.model.runner import ModelRunner  # noqa: E402


def read_bandwidth_gbs(gib: float = 1.0, repeat: int = 5) -> float:
    """Best-of-`repeat` bytes/s of a plain reduction over a tensor far larger than the caches."""
    x = torch.ones(int(gib * (1 << 30)) // 4)
    x.sum()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def stream_bytes(runner: ModelRunner) -> int:
    """Bytes a forward must stream: every weight matmul's matrix once, as the runner stores it."""
    total = 0
    for lin in runner.linear_layers():
        w = getattr(lin, "packed", None)
        w = w if w is not None else lin.weight
        total += w.numel() * w.element_size()
    return total


@torch.inference_mode()
def matmuls(linears: list[torch.nn.Module], xs: dict[int, torch.Tensor]) -> None:
    """Every weight matmul of a forward on inputs of the right width (xs: in_features -> [M, in_features])."""
    for lin in linears:
        lin(xs[lin.in_features])


def time_ms(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--linear", default="auto", help="the runner's linear kernels (see specgram.linear)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--cache-len", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeat = 3 if args.quick else args.repeat
    dtype = getattr(torch, args.dtype)
    max_b = max(args.batches)
    runner = ModelRunner.from_pretrained(args.model, max_b, args.cache_len + max(args.widths) + 8, torch.device("cpu"),
                                         dtype, linear=args.linear)
    for b in range(max_b):      # fill every slot's cache up to cache_len (values are irrelevant, the cost is not)
        runner.forward_rows([[1] * args.cache_len], [b], [0], last_only=True)
    bw = read_bandwidth_gbs()
    bound_ms = stream_bytes(runner) / bw / 1e6

    shapes = [(b, t) for b in args.batches for t in args.widths]
    fwd = {s: [] for s in shapes}
    mm = {s: [] for s in shapes}
    linears = runner.linear_layers()
    for _ in range(repeat):      # interleaved: drift and noise hit every shape alike
        for b, t in shapes:
            rows = [[7] * t for _ in range(b)]
            fwd[(b, t)] += time_ms(partial(runner.forward_rows, rows, list(range(b)), [args.cache_len] * b,
                                           last_only=False), 1)
            xs = {lin.in_features: torch.randn(b * t, lin.in_features, dtype=runner.dtype) for lin in linears}
            mm[(b, t)] += time_ms(partial(matmuls, linears, xs), 1)

    print(f"model {Path(args.model).name}  dtype {args.dtype}  linear {runner.linear_kind}  torch threads "
          f"{torch.get_num_threads()}  cache length {args.cache_len}")
    print(f"weights {stream_bytes(runner) / 1e6:.0f} MB  read bandwidth {bw:.1f} GB/s  ->  bound "
          f"{bound_ms:.1f} ms per forward")
    print(f"{'B':>3} {'T':>3} {'forward ms':>11} {'matmul ms':>10} {'non-matmul':>11} {'x bound':>8} {'v':>6}")
    med = {s: statistics.median(v) for s, v in fwd.items()}
    for b, t in shapes:
        f, m = med[(b, t)], statistics.median(mm[(b, t)])
        v = f / med[(b, 1)] if (b, 1) in med else float("nan")
        print(f"{b:>3} {t:>3} {f:>11.1f} {m:>10.1f} {max(0.0, 1 - m / f):>10.0%} {f / bound_ms:>8.2f} {v:>6.2f}")


if __name__ == "__main__":
    main()
