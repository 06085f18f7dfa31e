"""What one target forward costs, against what the memory allows: the step-cost table, one run.

    python scripts/bench.py forward                      # SmolLM2-135M, fp32, cache length 300
    python scripts/bench.py forward --linear torch       # transformers' modules with PyTorch's ops
    python scripts/bench.py forward --dtype bfloat16 --linear native
    python scripts/bench.py forward --weights int8       # int8 weights, a scale per output channel (native only)
    python scripts/bench.py forward --weights int4       # 4-bit groups x int8 activations per 256 (native)
    python scripts/bench.py forward --weights int8-blocks --batches 1 --widths 1 4 9 16   # v of a verify
    python scripts/bench.py forward --quick              # 3 repeats: a smoke run
    python scripts/bench.py forward --shape llama-3.2-1b # random weights of a 1B-class shape (benchlib/shapes.py)

Per shape (B rows of T new tokens each, every row attending to --cache-len earlier positions):
  forward ms   ModelRunner.forward_rows, the engine's call (median of --repeat interleaved runs)
  matmul ms    the same forward's weight matmuls alone (every Linear of the model in order, M = B*T rows),
               through the runner's own linear kernels
  bound ms     the bytes a forward must read, weights plus the KV cache its rows attend to (B rows x
               (cache length + T) positions, every layer, K and V), / the read bandwidth measured in this run (a
               1 GiB reduction between the shapes' runs, median over the repeats): a forward cannot be faster
  x bound      forward ms / bound ms (1.0 = at the memory bound)
  x weights    forward ms / (weight bytes / bandwidth): the bound without the cache, as earlier reports gave it
  v            forward(B, T) / forward(B, 1): what verifying T tokens costs relative to decoding one
  of peak      the matmuls' flops (2 per weight per row) per second, against the measured fp32 FMA peak of
               the machine (benchlib/peak.py: register-only fmas on every thread, the kernels' ISA); fp32 and
               bf16 weights only (int8 products are integer or conversion-bound, not fp32 fmas)
Also reported: the read bandwidth (best of a few sums over a 1 GiB tensor), the torch thread count, and the kernel
path each weight product ran (kernel_paths: e.g. int4 x int8 on VNNI's vpdpbusd, or without VNNI), with the CPU's
matrix and dot-product features beside it (whether it has AMX, which no path uses yet).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .. import report
from ..peak import fma_peak_gflops
from ..shapes import SHAPES, random_model

SHARED = {"repeat": 15}
QUICK = {"repeat": 3}
QUICK_HELP = "3 repeats"


def add_options(ap) -> None:
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--linear", default="auto", help="the runner's linear kernels (see specgram.model.linear)")
    ap.add_argument(
        "--weights",
        default="auto",
        choices=["auto", "int8", "int8-dynamic", "int8-blocks", "int4"],
        help="the matmul weights: as loaded (auto), int8 weight-only, int8 with activations quantized to int16 "
        "per row (int8-dynamic) or to int8 per block of 256 (int8-blocks: what weights int8 serves on VNNI) "
        "(specgram.model.int8), int4 groups (specgram.model.int4); native forward only",
    )
    ap.add_argument(
        "--kv-dtype",
        default="auto",
        choices=["auto", "bfloat16"],
        help="the KV cache: the activations' dtype (auto) or bfloat16 (native forward only)",
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="rows B per forward")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 5], help="new tokens T per row")
    ap.add_argument("--cache-len", type=int, default=300)
    ap.add_argument(
        "--shape",
        default="",
        choices=["", *SHAPES],
        help="a random-weight model of this public shape, built in memory, instead of --model",
    )


def read_bandwidth_gbs(gib: float = 1.0, repeat: int = 5, x=None) -> float:
    """Best-of-`repeat` bytes/s of a plain reduction over a tensor far larger than the caches (`x`, else a new
    one of `gib` GiB)."""
    import torch

    if x is None:
        x = torch.ones(int(gib * (1 << 30)) // 4)
        x.sum()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def stream_bytes(runner) -> int:
    """Bytes a forward must stream: every weight matmul's matrix once, as the runner stores it (int8: with its
    scales)."""
    total = 0
    for lin in runner.linear_layers():
        w = getattr(lin, "packed", None)
        w = w if w is not None else lin.weight
        scale = getattr(lin, "scale", None)
        total += w.numel() * w.element_size() + (scale.numel() * scale.element_size() if scale is not None else 0)
    return total


def kv_bytes(runner, rows: int, positions: int) -> int:
    """Bytes of K and V that `rows` rows attending to `positions` positions each read, every layer."""
    k = runner.cache.k
    return 2 * rows * positions * k.shape[0] * runner.num_kv_heads * runner.head_dim * k.element_size()


def kernel_paths(runner) -> list[str]:
    """The distinct product kernels a runner's weight matmuls run, in words (native forward), else its linear kind."""
    from specgram.model.kernels import abi

    if runner.native is None:
        return [f"PyTorch ({runner.linear_kind})"]
    names = {
        abi.LIN_F32: "fp32 weights, fp32 FMA",
        abi.LIN_BF16: "bf16 weights widened to fp32, FMA",
        abi.LIN_I8: "int8 weights widened to fp32, FMA",
        abi.LIN_I8A8: "int8 weights x int{bits} activations per row, VNNI vpdpbusd",
        abi.LIN_I8B: "int8 weights x int8 activations per 256 inputs, VNNI vpdpbusd",
        abi.LIN_I4: "int4 weights x int8 activations per 256 inputs, VNNI vpdpbusd",
        abi.LIN_I4_MADD: "int4 weights x int8 activations per 256 inputs, vpmaddubsw + vpmaddwd (no VNNI)",
    }
    seen = []
    for lin in runner.linear_layers():
        d = lin.descriptor()
        name = names[d.kind].format(bits=8 * max(1, d.digits))
        if name not in seen:
            seen.append(name)
    return seen


def cpu_features() -> str:
    """The CPU's vector and matrix features that bear on the products (from /proc/cpuinfo)."""
    from specgram.model import kernels

    flags = kernels.cpu_flags()
    wanted = ("avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
    have = [f for f in wanted if f in flags]
    return ", ".join(have) if have else "none of " + ", ".join(wanted)


def timed_ms(fn, *a, **kw) -> float:
    t = time.perf_counter()
    fn(*a, **kw)
    return (time.perf_counter() - t) * 1e3


def run(args) -> None:
    import torch

    from specgram.engine.loading import model_of
    from specgram.model import kernels
    from specgram.model.choice import choose, choose_for
    from specgram.model.runner import ModelRunner
    from specgram.model.source import open_source

    max_b = max(args.batches)
    positions = args.cache_len + max(args.widths) + 8
    tensors, cpu, dtype = None, torch.device("cpu"), getattr(torch, args.dtype)
    if args.shape:
        model = random_model(args.shape, args.dtype)
    else:  # as the engine loads it: on the native forward one tensor at a time into its served form (a 7B fits)
        model, tensors = model_of(open_source(args.model), cpu, dtype, native=args.linear != "torch")
    forward = (
        choose_for(model, args.linear, args.weights, args.kv_dtype)
        if tensors is None
        else choose(model.config, cpu, dtype, args.linear, args.weights, args.kv_dtype)
    )
    runner = ModelRunner(model, max_b, positions, forward, tensors=tensors)
    for b in range(max_b):  # fill every slot's cache up to cache_len (values are irrelevant, the cost is not)
        runner.forward_rows([[1] * args.cache_len], [b], [0], last_only=True)
    probe = torch.ones((1 << 30) // 4)  # the bandwidth probe's 1 GiB, read between the shapes' runs (below)
    probe.sum()
    bws = []
    linears = runner.linear_layers()

    @torch.inference_mode()
    def matmuls(xs: dict) -> None:  # every weight matmul of a forward on inputs of the right width
        for lin in linears:
            lin(xs[lin.in_features])

    shapes = [(b, t) for b in args.batches for t in args.widths]
    fwd: dict = {s: [] for s in shapes}
    mm: dict = {s: [] for s in shapes}
    for _ in range(args.repeat):  # interleaved: drift and noise hit every shape alike
        bws.append(read_bandwidth_gbs(repeat=2, x=probe))  # and the bandwidth too (the host's memory is shared)
        for b, t in shapes:
            fwd[(b, t)].append(
                timed_ms(
                    runner.forward_rows,
                    [[7] * t for _ in range(b)],
                    list(range(b)),
                    [args.cache_len] * b,
                    last_only=False,
                )
            )
            mm[(b, t)].append(
                timed_ms(
                    matmuls,
                    {lin.in_features: torch.randn(b * t, lin.in_features, dtype=runner.dtype) for lin in linears},
                )
            )
    med = {s: statistics.median(v) for s, v in fwd.items()}
    bw = statistics.median(bws)
    bound_ms = stream_bytes(runner) / bw / 1e6
    isa = (
        runner.native.lib.isa if runner.native is not None else ("avx512" if kernels.cpu_supports("avx512") else "avx2")
    )
    peak = fma_peak_gflops(isa, torch.get_num_threads())
    weights_n = sum(lin.in_features * lin.out_features for lin in linears)
    rows = []
    for b, t in shapes:
        f, m = med[(b, t)], statistics.median(mm[(b, t)])
        v = f / med[(b, 1)] if (b, 1) in med else None
        gflops = 2 * b * t * weights_n / m / 1e6
        bound = (stream_bytes(runner) + kv_bytes(runner, b, args.cache_len + t)) / bw / 1e6
        rows.append(
            [
                b,
                t,
                f"{f:.1f}",
                f"{m:.1f}",
                f"{max(0.0, 1 - m / f):.0%}",
                f"{f / bound:.2f}",
                f"{f / bound_ms:.2f}",
                report.cell(v, "{:.2f}"),
                f"{gflops / peak:.0%}" if args.weights == "auto" else "-",
            ]
        )
    model = f"{args.shape} (random weights)" if args.shape else Path(args.model).name
    lines = report.header(
        "Target forward cost",
        args,
        f"{model}, {args.dtype}, weights {args.weights}, linear "
        f"{runner.linear_kind}, torch threads "
        f"{torch.get_num_threads()}, cache length {args.cache_len}, median of {args.repeat}",
    )
    kv_row = kv_bytes(runner, 1, args.cache_len + 1)
    lines += [
        f"Weights {stream_bytes(runner) / 1e6:.0f} MB, KV cache read per row {kv_row / 1e6:.1f} MB "
        f"({runner.cache.k.dtype}), read bandwidth {bw:.1f} GB/s -> weights alone {bound_ms:.1f} ms per forward. "
        f"fp32 FMA peak ({isa}, {torch.get_num_threads()} threads) {peak:.0f} GFLOP/s.",
        "",
        f"Kernel paths: {'; '.join(kernel_paths(runner))}. CPU features: {cpu_features()}.",
        "",
        *report.table(
            ["B", "T", "forward ms", "matmul ms", "non-matmul", "x bound", "x weights", "v", "of peak"], rows
        ),
    ]
    report.write(
        args,
        lines,
        dict(
            bandwidth_gbs=bw,
            bound_ms=bound_ms,
            fma_peak_gflops=peak,
            kernel_paths=kernel_paths(runner),
            cpu_features=cpu_features(),
            forward_ms={f"{b}x{t}": v for (b, t), v in fwd.items()},
            matmul_ms={f"{b}x{t}": v for (b, t), v in mm.items()},
        ),
    )
