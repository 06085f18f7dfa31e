"""The benchmark instruments' pure parts (the runs themselves are measurements, not tests): the side-by-side
report's summaries and ratios, the JSON validity check, percentiles, the case loader, and the genai-perf CSV
summary."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "scripts" / "compare"), str(REPO / "scripts")]

import benchlib  # noqa: E402
import report  # noqa: E402

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def run(system, config, guided, c, reqs, wall, drafted=None, accepted=None):
    return dict(system=system, config=config, guided=guided, concurrency=c, wall_s=wall, drafted=drafted,
                accepted=accepted, requests=reqs)


def req(case, ids, text, ttft, latency):
    return dict(case=case, ids=ids, text=text, ttft_s=ttft, latency_s=latency)


@pytest.mark.parametrize("text, ok", [('{"a": 1}', True), ('```json\n{"a": 2}\n```', True), ('{"a": "x"}', False),
                                      ('Here: {"a": 1}', False), ('{"a": 1', False)])
def test_is_valid_parses_whole_text_or_a_fence_and_validates(text, ok):
    assert benchlib.is_valid(text, SCHEMA) is ok


def test_pct_interpolates_between_ranks():
    assert benchlib.pct([], 50) != benchlib.pct([], 50)          # nan
    assert benchlib.pct([3.0, 1.0, 2.0], 50) == 2.0
    assert benchlib.pct([0.0, 10.0], 90) == pytest.approx(9.0)


def test_jme_cases_come_from_the_repository_in_case_number_order():
    names = [c["name"] for c in benchlib.load_jme()]
    assert names and names == sorted(names, key=lambda n: int(n.rsplit("_", 1)[1]))
    assert benchlib.load_jme(2) == benchlib.load_jme()[:2]


def test_summarize_and_ratios():
    cs = [dict(schema=SCHEMA), dict(schema=SCHEMA)]
    base = run("S", "target only", True, 1, [req(0, [1, 2, 3], '{"a": 1}', 0.1, 1.1), req(1, [4, 5], "no", 0.3, 0.8)],
               wall=2.0)
    spec = run("S", "ngram k4", True, 1, [req(0, [1, 2, 3], '{"a": 1}', 0.1, 0.6), req(1, [4, 9], "no", 0.2, 0.4)],
               wall=1.0, drafted=10, accepted=4)
    rows = [report.summarize(r, cs, base) for r in (base, spec)]
    report.add_ratios(rows)
    b, s = rows
    assert b["tok_s"] == pytest.approx(5 / 2.0) and s["tok_s"] == pytest.approx(5 / 1.0)
    assert s["ratio"] == pytest.approx(2.0) and b["ratio"] == pytest.approx(1.0)
    assert b["ttft_p50"] == pytest.approx(200.0)                       # median of 100 and 300 ms
    assert b["itl_p50"] == pytest.approx((500 + 500) / 2)             # (1.1-0.1)/2 and (0.8-0.3)/1 s
    assert s["acceptance"] == pytest.approx(0.4) and b["acceptance"] is None
    assert b["valid"] == 1 and b["n"] == 2
    assert b["same_ids"] == 2 and s["same_ids"] == 1                  # request 1 differs: [4, 9] != [4, 5]
    lines = report.headline(rows + [dict(s, system="ours via Triton"), dict(b, system="ours via Triton")], [1])
    assert any("spec ÷ no-spec, guided, c=1" in line and "2.00×" in line for line in lines)


def test_genai_perf_summary_reads_the_csv(tmp_path):
    (tmp_path / "c1.csv").write_text((REPO / "docs" / "benchmarks" / "perf_analyzer" / "genai_perf_smoke_c1.csv")
                                     .read_text())
    subprocess.run([sys.executable, str(REPO / "scripts" / "genai_perf_summary.py"), str(tmp_path), "v", "cmd",
                    "32", "64"], check=True, capture_output=True)
    row = [line for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| 1 |")]
    # that CSV: TTFT avg 436.21 / p99 494.86 ms, ITL avg 70.97 / p99 77.74 ms, 12.14 tok/s, 0.38 req/s
    assert row == ["| 1 | 436 | 495 | 71.0 | 77.7 | 12.1 | 0.38 |"]
