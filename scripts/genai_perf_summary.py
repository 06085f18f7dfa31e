"""genai-perf CSV exports (one per concurrency, c<N>.csv) -> <dir>/summary.md: the four figures per concurrency.

    python scripts/genai_perf_summary.py <dir> <genai-perf version> <command> <output tokens> <input tokens>
"""
from __future__ import annotations

import csv
import re
import sys
from pathlib import Path


def read(path: Path) -> dict[str, dict[str, str]]:
    """genai-perf's CSV: a per-metric table (Metric, avg, min, max, p99, ...), a blank line, then
    single-value rows (Metric, Value)."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] = []
    for line in csv.reader(path.read_text().splitlines()):
        if not line or not any(line):
            header = []
            continue
        if line[0] == "Metric":
            header = line
            continue
        rows[line[0]] = dict(zip(header[1:] if header else ["value"], line[1:]))
    return rows


def pick(rows, name, col):
    for key, vals in rows.items():
        if key.split(" (")[0].lower() == name.lower():
            v = vals.get(col) or vals.get("value") or next(iter(vals.values()), "")
            return float(v.replace(",", "")) if v else float("nan")
    return float("nan")


def main() -> None:
    out, version, command, out_tokens, in_tokens = sys.argv[1:6]
    d = Path(out)
    files = sorted(d.glob("c*.csv"), key=lambda p: int(re.findall(r"\d+", p.stem)[0]))
    L = [f"# genai-perf: model `llm`, gRPC streaming ({version})", "",
         f"Command: `{command}`  ", f"Synthetic prompts of {in_tokens} tokens, {out_tokens} output tokens "
         "(max_tokens + ignore_eos), no warm-up requests, 2 x c requests per level (at least 4), "
         "`--backend vllm --endpoint-type kserve --streaming`, our tritonserver with the default "
         "model repository (guided requests speculate by default; these are unguided: no speculation).", "",
         "| concurrency | TTFT avg ms | TTFT p99 ms | ITL avg ms | ITL p99 ms | output tok/s | requests/s |",
         "|---|---|---|---|---|---|---|"]
    for f in files:
        r = read(f)
        c = re.findall(r"\d+", f.stem)[0]
        L.append(f"| {c} | {pick(r, 'Time To First Token', 'avg'):.0f} | {pick(r, 'Time To First Token', 'p99'):.0f} | "
                 f"{pick(r, 'Inter Token Latency', 'avg'):.1f} | {pick(r, 'Inter Token Latency', 'p99'):.1f} | "
                 f"{pick(r, 'Output Token Throughput', 'value'):.1f} | {pick(r, 'Request Throughput', 'value'):.2f} |")
    (d / "summary.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
