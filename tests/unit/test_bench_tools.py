"""The benchmark harness's pure parts (the runs themselves are measurements, not tests): argument parsing of
scripts/bench.py and every scenario, the workload helpers, the closed loop, report rendering, the compare
report's summaries and ratios, the perf_analyzer export and genai-perf CSV readers; and a --quick smoke of two
in-process scenarios on a tiny checkpoint."""

import json
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench  # noqa: E402
from benchlib import report, run, workload  # noqa: E402
from benchlib.scenarios import (  # noqa: E402
    compare,
    compare_report,
    compare_workers,
    draft_length,
    genai_perf,
    gpu,
    perf_analyzer,
    speculative,
    tree_ceiling,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


# ---- options ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", bench.SCENARIOS, ids=[f"{s}-scenario" for s in bench.SCENARIOS])
def test_every_scenario_parses_with_its_defaults_and_quick_values(name):
    mod = bench.scenario_module(name)
    extra = ["--tokenizer", "x"] if name == "gpu" else []
    args = bench.parse([name, *extra])
    for key, default in getattr(mod, "SHARED", {}).items():
        assert getattr(args, key) == default
    quick = bench.parse([name, "--quick", *extra])
    assert quick.quick and all(getattr(quick, k) == v for k, v in getattr(mod, "QUICK", {}).items())
    assert mod.__doc__.split("\n\n")[0] and f"scripts/bench.py {name}" in mod.__doc__


def test_an_option_given_beats_quick_and_shared_options_are_defined_once():
    args = bench.parse(["draft_length", "--quick", "--max-tokens", "7", "--concurrency", "3", "5"])
    assert (args.max_tokens, args.concurrency, args.prompts) == (7, [3, 5], draft_length.QUICK["prompts"])
    assert args.argv == ["draft_length", "--quick", "--max-tokens", "7", "--concurrency", "3", "5"]
    assert report.command(args) == "python scripts/bench.py draft_length --quick --max-tokens 7 --concurrency 3 5"
    with pytest.raises(SystemExit):
        bench.parse(["forward", "--concurrency", "2"])  # not an option of forward


def test_choose_keeps_the_known_order_and_the_reference_rows():
    assert workload.choose("ngram-k4,none", speculative.CONFIGS, ("none",)) == ["none", "ngram-k4"]
    assert workload.choose("int8-k2", speculative.CONFIGS, ("none",)) == ["none", "int8-k2"]
    with pytest.raises(SystemExit):
        workload.choose("nope", speculative.CONFIGS)


# ---- workload and measures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ok",
    [
        ('{"a": 1}', True),
        ('```json\n{"a": 2}\n```', True),
        ('{"a": "x"}', False),
        ('Here: {"a": 1}', False),
        ('{"a": 1', False),
    ],
)
def test_is_valid_parses_whole_text_or_a_fence_and_validates(text, ok):
    pytest.importorskip("jsonschema")
    assert workload.is_valid(text, SCHEMA) is ok


def test_pct_interpolates_between_ranks_and_trim_stops_at_eos():
    assert workload.pct([], 50) != workload.pct([], 50)  # nan
    assert workload.pct([3.0, 1.0, 2.0], 50) == 2.0
    assert workload.pct([0.0, 10.0], 90) == pytest.approx(9.0)
    assert workload.trim_at_eos([5, 6, 2, 7], {2}) == [5, 6]


def test_jme_cases_come_from_the_repository_in_case_number_order():
    names = [c["name"] for c in workload.load_jme()]
    assert names and names == sorted(names, key=lambda n: int(n.rsplit("_", 1)[1]))
    assert workload.load_jme(2) == workload.load_jme()[:2]


def test_closed_loop_keeps_c_in_flight_and_returns_results_in_order():
    live, most, lock = [0], [0], threading.Lock()

    def one(i):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.01 * (i % 3))
        with lock:
            live[0] -= 1
        return i * i

    results, wall = run.closed_loop(one, range(9), 3)
    assert results == [i * i for i in range(9)] and most[0] == 3 and wall > 0
    with pytest.raises(ZeroDivisionError):
        run.closed_loop(lambda i: 1 / (i - 2), range(5), 2)


def test_record_sums_drafts_and_its_measures():
    reqs = [
        dict(case=0, ids=[1, 2, 3], ttft_s=0.1, drafted=4, accepted=2, steps=2),
        dict(case=1, ids=[4], ttft_s=0.3, drafted=0, accepted=0, steps=0),
    ]
    rec = run.record(reqs, 2.0, 2, system="S", config="k4", k=4)
    assert (rec["drafted"], rec["accepted"], rec["concurrency"], rec["system"]) == (4, 2, 2, "S")
    assert run.tok_s(rec) == 2.0 and run.acceptance(rec) == 0.5 and run.tok_per_step(rec) == 2.0
    assert run.ttft_ms(rec) == pytest.approx(200.0) and run.ids(rec) == [[1, 2, 3], [4]]
    assert run.record([dict(case=0, ids=[1])], 1.0, 1)["drafted"] is None
    assert run.ttft_cells([rec], [[1, 2, 3], [4]]) == ["200", "200", "2.0", "yes"]


def test_speculation_formulas():
    assert speculative.ideal_speedup(0.5, 0, 0.3) == 1.0
    assert speculative.ideal_speedup(1.0, 4, 0.0) == 5.0
    assert speculative.ideal_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert (
        draft_length.sources_text({"prompt": [3, 1], "output": [1, 1]}) == "output 25% (acc 100%), prompt 75% (acc 33%)"
    )
    assert draft_length.sources_text({}) == "–"


# ---- reports ------------------------------------------------------------------------------------------------


def test_table_cells_and_the_written_report(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECGRAM_KERNEL_ISA", raising=False)
    assert report.table(["a", "b"], [[1, "x"]]) == ["| a | b |", "|---|---|", "| 1 | x |"]
    assert [report.cell(v) for v in (None, float("nan"), "s", 2.345)] == ["–", "–", "s", "2.3"]
    args = bench.parse(["serving", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "doc" / "r.md")])
    lines = report.header("Title", args, "some workload") + report.table(["x"], [[1]])
    assert lines[0] == "# Title" and lines[2].startswith("Command: `python scripts/bench.py serving --raw ")
    raw = report.write(args, lines, {"rows": [{"a": 1, "_run": object()}]}, quiet=True)
    assert (raw / "report.md").read_text() == (tmp_path / "doc" / "r.md").read_text()
    assert json.loads((raw / "serving.json").read_text()) == {"rows": [{"a": 1}]}
    monkeypatch.setenv("SPECGRAM_KERNEL_ISA", "avx2")  # a setting that changes what the run measures is shown
    assert report.command(args).startswith("SPECGRAM_KERNEL_ISA=avx2 python scripts/bench.py serving ")


def req(case, ids, text, ttft, latency):
    return dict(case=case, ids=ids, text=text, ttft_s=ttft, latency_s=latency)


def test_compare_summaries_and_ratios():
    pytest.importorskip("jsonschema")
    cs = [dict(schema=SCHEMA), dict(schema=SCHEMA)]
    base = run.record(
        [req(0, [1, 2, 3], '{"a": 1}', 0.1, 1.1), req(1, [4, 5], "no", 0.3, 0.8)],
        2.0,
        1,
        system="S",
        config="target only",
        guided=True,
    )
    spec = dict(
        run.record(
            [req(0, [1, 2, 3], '{"a": 1}', 0.1, 0.6), req(1, [4, 9], "no", 0.2, 0.4)],
            1.0,
            1,
            system="S",
            config="ngram k4",
            guided=True,
        ),
        drafted=10,
        accepted=4,
    )
    rows = [compare_report.summarize(r, cs, base) for r in (base, spec)]
    compare_report.add_ratios(rows)
    b, s = rows
    assert b["tok_s"] == pytest.approx(5 / 2.0) and s["tok_s"] == pytest.approx(5 / 1.0)
    assert s["ratio"] == pytest.approx(2.0) and b["ratio"] == pytest.approx(1.0)
    assert b["ttft_p50"] == pytest.approx(200.0)  # median of 100 and 300 ms
    assert b["itl_p50"] == pytest.approx((500 + 500) / 2)  # (1.1-0.1)/2 and (0.8-0.3)/1 s
    assert s["acceptance"] == pytest.approx(0.4) and b["acceptance"] is None
    assert b["valid"] == 1 and b["n"] == 2
    assert b["same_ids"] == 2 and s["same_ids"] == 1  # request 1 differs: [4, 9] != [4, 5]
    lines = compare_report.headline(rows + [dict(s, system="ours via Triton"), dict(b, system="ours via Triton")], [1])
    assert any("spec ÷ no-spec, guided, c=1" in line and "2.00×" in line for line in lines)
    table = compare_report.table(rows)
    assert len(table) == 4 and "| S | ngram k4 | json_schema | 1 | 5.0 | 2.00× |" in table[3]


def typed_gguf(path: Path, file_type: str) -> Path:
    """A GGUF file whose general.file_type is gguf.LlamaFileType[file_type] (one small F32 tensor)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(gguf.LlamaFileType[file_type])
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_type_names_the_file_type_as_llama_cpp_does_else_the_stem(tmp_path):
    pytest.importorskip("gguf")
    from .tiny_gguf import save_gguf

    assert compare_workers.gguf_type(typed_gguf(tmp_path / "a.gguf", "MOSTLY_Q4_K_M")) == "Q4_K_M"
    assert compare_workers.gguf_type(typed_gguf(tmp_path / "b.gguf", "ALL_F32")) == "F32"
    assert compare_workers.gguf_type(save_gguf(tmp_path / "m-q5_0.gguf")) == "m-q5_0"  # no file_type in it
    (tmp_path / "junk.gguf").write_text("not gguf")
    assert compare_workers.gguf_type(tmp_path / "junk.gguf") == "junk"


def test_llamacpp_entries_use_gguf_files_as_they_are_and_convert_the_types(tmp_path):
    pytest.importorskip("gguf")
    q4 = typed_gguf(tmp_path / "x-q4_k_m.gguf", "MOSTLY_Q4_K_M")
    q8 = typed_gguf(tmp_path / "x-q8_0.gguf", "MOSTLY_Q8_0")
    ggufs, convert = compare_workers.llamacpp_ggufs([str(q4), "q8_0", str(q8), "f32"], str(tmp_path / "X"))
    assert convert == ["q8_0", "f32"]
    assert ggufs == {
        "Q4_K_M": str(q4),
        "Q8_0": str(compare_workers.gguf_path(str(tmp_path / "X"), "q8_0")),
        "Q8_0 (x-q8_0.gguf)": str(q8),  # the same type twice: the file's name tells them apart
        "F32": str(compare_workers.gguf_path(str(tmp_path / "X"), "f32")),
    }
    with pytest.raises(SystemExit):
        compare_workers.llamacpp_ggufs([str(tmp_path / "missing.gguf")], "X")


@pytest.mark.parametrize(
    "gtype, bits",
    [
        ("F32", 32),
        ("F16", 16),
        ("BF16", 16),
        ("Q8_0", 8),
        ("Q6_K", 6),
        ("Q5_K_M", 5),
        ("Q4_K_M", 4),
        ("Q4_1", 4),
        ("IQ4_XS", 4),
        ("Q8_0 (x-q8_0.gguf)", 8),
        ("SmolLM2-135M-Instruct.Q4_1", 4),  # a file's stem, where the file names no type
        ("qwen2.5-coder-1.5b-instruct-q4_k_m", 4),
        ("mystery", None),
    ],
)
def test_type_bits(gtype, bits):
    assert compare_report.type_bits(gtype) == bits


def test_server_specs_parse_resolve_paths_and_infer_bits(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    typed_gguf(tmp_path / "models" / "t-q4_k_m.gguf", "MOSTLY_Q4_K_M")
    typed_gguf(tmp_path / "models" / "t-q8_0.gguf", "MOSTLY_Q8_0")
    model = str(tmp_path / "M")
    assert compare.parse_server("fp32={}", model) == ("fp32", {"checkpoint": model}, 32)
    assert compare.parse_server("fp32=", model)[1:] == ({"checkpoint": model}, 32)
    assert compare.parse_server('int8={"weights": "int8"}', model)[2] == 8
    label, settings, bits = compare.parse_server(
        'q4 pair={"checkpoint": "models/t-q4_k_m.gguf", "draft_checkpoint": "models/t-q8_0.gguf"}', model
    )
    assert (label, bits) == ("q4 pair", 4)  # the checkpoint's type's bits, not the draft's
    assert settings == {
        "checkpoint": str(tmp_path / "models" / "t-q4_k_m.gguf"),
        "draft_checkpoint": str(tmp_path / "models" / "t-q8_0.gguf"),
    }
    assert compare.parse_server('q8={"checkpoint": "models/t-q8_0.gguf"}', model)[2] == 8
    assert compare.parse_server('int4={"checkpoint": "models/t-q8_0.gguf", "weights": "int4"}', model)[2] == 4
    assert compare.parse_server('bf={"dtype": "bfloat16"}', model)[2] == 16
    assert compare.parse_server('x={"bits": 6, "weights": "int8"}', model) == (
        "x",
        {"checkpoint": model, "weights": "int8"},
        6,
    )
    for bad in ("fp32", "={}", "x=[1]", "x={nope", 'x={"checkpoint": "models/none.gguf"}'):
        with pytest.raises(SystemExit):
            compare.parse_server(bad, model)
    args = bench.parse(["compare", "--server", "a={}", "--server", 'a={"weights": "int8"}'])
    assert args.server == ["a={}", 'a={"weights": "int8"}']
    with pytest.raises(SystemExit):
        compare.servers(args)  # the same label twice


def row(system, config, guided, tok_s, bits=None, c=1):
    return dict(system=system, config=config, guided=guided, concurrency=c, tok_s=tok_s, bits=bits)


def test_headline_sets_the_servers_against_llama_cpp_at_matching_bits():
    S = compare_report.SERVER
    rows = []
    for g in (False, True):
        rows += [
            row(f"{S}fp32)", "target only", g, 10.0, 32),
            row(f"{S}fp32)", "served default", g, 20.0, 32),
            row(f"{S}int4)", "target only", g, 40.0, 4),
            row(f"{S}int4)", "served default", g, 50.0, 4),
            row(f"{S}int4 pair)", "target only", g, 41.0, 4),
            row(f"{S}int4 pair)", "served default", g, 80.0, 4),
            row(f"{S}int4)", "target only", g, 99.0, 4, c=8),  # not c=1: in no ratio
            row("llama.cpp F32", "target only", g, 8.0),
            row("llama.cpp F32", "prompt lookup k4", g, 16.0),
            row("llama.cpp Q4_K_M", "target only", g, 20.0),
            row("llama.cpp Q4_K_M", "prompt lookup k4", g, 25.0),
            row("llama.cpp Q8_0", "target only", g, 15.0),
        ]
    rows = [dict(r, bits=r["bits"] or compare_report.run_bits(r)) for r in rows]
    lines = compare_report.headline(rows, [1, 8])
    by = {line.split(" | ")[0].lstrip("| "): line for line in lines}
    assert all("Triton ÷ in-process" not in line and "spec ÷ no-spec" not in line for line in lines)  # none ran
    for g in ("unguided", "guided"):
        assert by[f"ours 32-bit ÷ llama.cpp F32, target only, {g}, c=1"].split(" | ")[1:] == [
            "1.25×",
            f"{S}fp32) · target only (10.0) ÷ llama.cpp F32 · target only (8.0) |",
        ]
        assert "1.25×" in by[f"ours 32-bit ÷ llama.cpp F32, best of each, {g}, c=1"]  # 20 ÷ 16
        # target only: the fastest target-only row of the 4-bit servers (int4 pair's 41), not c=8's 99
        assert (
            f"2.05× | {S}int4 pair) · target only (41.0) ÷ llama.cpp Q4_K_M · target only (20.0)"
            in by[f"ours 4-bit ÷ llama.cpp Q4_K_M, target only, {g}, c=1"]
        )
        assert (
            f"3.20× | {S}int4 pair) · served default (80.0) ÷ llama.cpp Q4_K_M · prompt lookup k4"
            in by[f"ours 4-bit ÷ llama.cpp Q4_K_M, best of each, {g}, c=1"]
        )
        assert "not measured" in by[f"ours 8-bit ÷ llama.cpp Q8_0, target only, {g}, c=1"]  # no 8-bit server
        assert "3.20×" in by[f"ours best ÷ llama.cpp best, any bits, {g}, c=1"]  # 80 ÷ 25
    assert list(by).index("ours 32-bit ÷ llama.cpp F32, target only, unguided, c=1") < list(by).index(
        "ours 4-bit ÷ llama.cpp Q4_K_M, target only, unguided, c=1"
    )  # the widest types first
    assert compare_report.servers_note(rows)[0].startswith(f"Our servers (--server): {S}fp32) (32-bit weights)")
    assert compare_report.matching_bits([r for r in rows if r["system"].startswith("llama")]) == []


def test_headline_sets_the_servers_against_openvino_at_its_bits_beside_llama_cpp():
    S = compare_report.SERVER
    rows = []
    for g in (False, True):
        rows += [
            row(f"{S}int4)", "target only", g, 40.0, 4),
            row(f"{S}int4)", "served default", g, 60.0, 4),
            row("llama.cpp Q4_K_M", "target only", g, 20.0),
            row("OpenVINO GenAI int4", "target only", g, 10.0, 4),
            row("OpenVINO GenAI int4", "prompt lookup k4", g, 12.0, 4),
            row("OpenVINO GenAI int4", "draft model k3", g, 15.0, 4),
        ]
    rows = [dict(r, bits=r["bits"] or compare_report.run_bits(r)) for r in rows]
    by = {line.split(" | ")[0].lstrip("| "): line for line in compare_report.headline(rows, [1])}
    for g in ("unguided", "guided"):
        assert "4.00× | " in by[f"ours 4-bit ÷ OpenVINO GenAI int4, target only, {g}, c=1"]  # 40 ÷ 10
        assert (
            f"4.00× | {S}int4) · served default (60.0) ÷ OpenVINO GenAI int4 · draft model k3 (15.0)"
            in by[f"ours 4-bit ÷ OpenVINO GenAI int4, best of each, {g}, c=1"]
        )
        assert "4.00×" in by[f"ours best ÷ OpenVINO GenAI best, any bits, {g}, c=1"]
        assert "3.00×" in by[f"ours best ÷ llama.cpp best, any bits, {g}, c=1"]  # 60 ÷ 20: each peer apart
    assert compare_report.lossy_peer("OpenVINO GenAI int4") and not compare_report.lossy_peer("llama.cpp F32")


def test_same_ids_reference_ours_in_process_or_the_system_itself():
    S = compare_report.SERVER
    runs = [
        row("ours in-process", "target only", False, 1.0),
        row("llama.cpp F32", "target only", False, 1.0),
        row(f"{S}a)", "target only", False, 1.0),
        row(f"{S}a)", "served default", False, 1.0),
        row(f"{S}b)", "served default", False, 1.0),
        row(f"{S}a)", "served default", True, 1.0),
    ]
    refs = compare_report.references(runs)
    assert refs[:4] == [runs[0], runs[0], runs[2], runs[2]]
    assert refs[4:] == [None, None]  # b has no target only; a has none guided
    # a peer whose weights are not float32 (its ids differ from ours by design): its own target only
    L = "llama.cpp Q4_K_M (llama-server)"
    peers = [row(L, "target only", False, 1.0), row(L, "draft model k3", False, 1.0), runs[0]]
    peers.append(row("llama.cpp Q4_K_M", "prompt lookup k4", False, 1.0))  # the other front end: not the server's
    assert compare_report.references(peers) == [peers[0], peers[0], peers[2], None]


def test_tree_ceiling_counts_hits_at_the_failing_position_only():
    # (request id, line, runner-ups by draft index, other continuations, accepted, target token)
    log = [
        (1, [5, 6, 7], {1: (9, 0.3)}, [], 1, 9),  # fails at 1, its runner-up there is the target's: a hit
        (1, [5, 6], {0: (8, 0.2)}, [], 2, 4),  # the whole line taken: no failure
        (1, [5, 6, 7], {2: (3, 0.2)}, [[5, 6, 3]], 1, 3),  # last of request 1: not counted (nor a hit anyway)
        (2, [4, 4], {}, [[4, 2, 2], [3]], 1, 2),  # fails at 1: another match agrees up to 1 and goes on with 2
        (2, [1], {0: (6, 0.5)}, [], 0, 6),  # its request's last step: no next step to merge, not counted
    ]
    c = tree_ceiling.count(log)
    assert (c["steps"], c["tokens"], c["rejected"]) == (5, 2 + 3 + 2 + 2 + 1, 2)
    assert (c["alt_hits"], c["lookup_hits"]) == (1, 1)
    assert c["ceiling"] == pytest.approx(5 / 3) and c["leaves"] == pytest.approx(11 / 10)
    assert c["every"] == pytest.approx(5 / 3)


GENAI_PERF_CSV = """Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1
Time To First Token (ms),436.21,364.82,495.81,494.86,491.03,486.25,471.90,447.98,406.40,381.46,373.14,366.49
Request Latency (ms),"2,636.24","2,435.52","2,863.89","2,858.79","2,838.43","2,812.97","2,736.60","2,609.31",x,x,x,x
Inter Token Latency (ms),70.97,66.80,77.93,77.74,76.96,75.98,73.05,68.18,67.49,67.07,66.93,66.82

Metric,Value
Output Token Throughput (tokens/sec),12.14
Request Throughput (per sec),0.38
"""


def test_genai_perf_csv_summary():
    rows = genai_perf.read_csv(GENAI_PERF_CSV)
    assert genai_perf.pick(rows, "Request Latency", "avg") == pytest.approx(2636.24)
    assert genai_perf.summary_row(1, rows) == ["1", "436", "495", "71.0", "77.7", "12.1", "0.38"]


def test_perf_analyzer_export_figures(tmp_path):
    ms = 1_000_000  # the export's timestamps are ns
    export = {
        "version": "2.51.0",
        "experiments": [
            {
                "experiment": {"mode": "concurrency", "value": 2},
                "requests": [
                    {
                        "timestamp": 0,
                        "response_timestamps": [100 * ms, 200 * ms, 300 * ms],
                        "response_outputs": [
                            {"output_ids": 5},
                            {"output_ids": [6, 7]},
                            {
                                "output_ids": [8],
                                "finish_reason": "stop",
                                "spec_drafted_tokens": 4,
                                "spec_accepted_tokens": 1,
                            },
                        ],
                    },
                    {
                        "timestamp": 50 * ms,
                        "response_timestamps": [250 * ms, 1050 * ms],
                        "response_outputs": [{"output_ids": [1, 2]}, {"output_ids": [3, 4], "finish_reason": "length"}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "v_c2.json").write_text(json.dumps(export))
    [r] = perf_analyzer.summarize_export(tmp_path / "v_c2.json")
    assert (r["concurrency"], r["completed"], r["output_tokens"]) == (2, 2, 8)
    assert r["ttft_ms_mean"] == pytest.approx(150.0) and r["duration_s"] == pytest.approx(1.05)
    assert r["itl_ms_mean"] == pytest.approx((200 / 3 + 800 / 2) / 2)
    assert r["output_tok_s"] == pytest.approx(8 / 1.05) and r["spec_acceptance_rate"] == pytest.approx(0.25)
    assert r["finish_reasons"] == {"stop": 1, "length": 1} and r["tokens_per_response"] == pytest.approx(8 / 5)
    args = bench.parse(["perf_analyzer", "--raw", str(tmp_path)])
    lines = perf_analyzer.summary(
        args,
        [{"variant": "v", **r}, dict(variant="w", concurrency=1, error="rc 1")],
        dict(inputs="x", server="y", command="z"),
    )
    assert any(line.startswith("| v | 2 | 2/2 | 150 |") for line in lines)
    assert any(line.startswith("| w | 1 | failed: rc 1 |") for line in lines)


def test_gpu_report_renders_measured_and_failed_sections():
    args = bench.parse(["gpu", "--tokenizer", "x"])
    fwd = [
        dict(model=m, graphs=g, batch=b, width=w, ms=ms)
        for m, ms in (("target-1B", 10.0), ("draft-135M", 4.0))
        for g in (False, True)
        for b in (1, 8)
        for w in (1, 4)
    ]
    lines = gpu.render(args, dict(device="D", forward=fwd, engine="RuntimeError('x')"))
    assert lines[0] == "# GPU check: D"
    assert "| target-1B | 1 | 1 | 10.00 | 10.00 | 1.00× |" in lines
    assert any("c = draft/target = 0.40" in line for line in lines)
    assert lines[-1] == "Engine runs failed: `RuntimeError('x')`"


# ---- smoke ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["forward", "--quick", "--batches", "1", "--widths", "1", "2", "--cache-len", "16"],
        ["speculative", "--quick", "--configs", "none,ngram-k2", "--max-tokens", "12"],
        ["layer_skip", "--quick", "--subsets", "first:1", "skip:0-0"],  # --draft: added below (the same model)
    ],
)
def test_quick_in_process_scenarios_run(argv, tiny_ckpt, tmp_path, capsys):
    more = ["--draft", str(tiny_ckpt)] if argv[0] == "layer_skip" else []
    assert bench.main([*argv, *more, "--model", str(tiny_ckpt), "--raw", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# ") and "|---|" in text and (tmp_path / f"{argv[0]}.json").exists()
    if argv[0] == "speculative":
        assert text.count("| yes |") == 4  # none and ngram-k2 at c = 1 and 2, same ids
    if argv[0] == "layer_skip":  # the whole model, and itself as the draft, agree everywhere; one layer does not
        assert "| all (the target) | 2 / 2 | 1.000 |" in text
        assert f"| draft model {tiny_ckpt.name} | - | 1.000 |" in text
        first = next(line for line in text.splitlines() if line.startswith("| first:1 | 1 / 2 |"))
        second = next(line for line in text.splitlines() if line.startswith("| skip:0-0 | 1 / 2 |"))
        assert float(first.split("|")[3]) < 1.0
        assert first.split("|")[3] != second.split("|")[3]  # layer 0 alone and layer 1 alone: different models


def test_layer_skip_subsets_name_the_layers_they_keep():
    from benchlib.scenarios import layer_skip

    assert layer_skip.keep("first:3", 28) == [0, 1, 2]
    assert layer_skip.keep("skip:2-25", 28) == [0, 1, 26, 27]
    assert layer_skip.keep("odd:1-6", 8) == [0, 2, 4, 6, 7]
    assert layer_skip.default_subsets(28)[:4] == ["first:14", "first:20", "first:24", "skip:12-19"]
    for bad in ("middle:3", "skip:5", "odd:9-2", "first:x", "first:0", "first:28", "skip:30-40", "skip:0-27"):
        with pytest.raises(SystemExit):
            layer_skip.keep(bad, 28)


def test_a_peer_run_numbers_its_requests_and_sums_draft_counts_only_where_every_request_has_them():
    counted = run.peer_run([{}, {}], lambda i, c: dict(ids=[i], drafted=3, accepted=i), system="p", k=3)
    assert counted["requests"] == [
        dict(case=0, ids=[0], drafted=3, accepted=0),
        dict(case=1, ids=[1], drafted=3, accepted=1),
    ]
    assert (counted["system"], counted["k"], counted["concurrency"]) == ("p", 3, 1) and counted["wall_s"] >= 0
    assert (counted["drafted"], counted["accepted"]) == (6, 1)
    partly = run.peer_run([{}, {}], lambda i, c: dict(ids=[i], **({"drafted": 1, "accepted": 1} if i else {})))
    assert partly["drafted"] is None and partly["accepted"] is None  # not reported for every request


def test_each_run_gets_a_cache_salt_of_its_own_unless_its_cases_name_one():
    from benchlib.run import with_salt

    cases = [dict(prompt="a"), dict(prompt="b")]
    one, two = with_salt(cases), with_salt(cases)
    assert len({c["cache_salt"] for c in one}) == 1 and len({c["cache_salt"] for c in two}) == 1
    assert one[0]["cache_salt"] != two[0]["cache_salt"] and "cache_salt" not in cases[0]  # the cases untouched
    assert {c["cache_salt"] for c in with_salt(cases, "shared")} == {"shared"}
    named = [dict(prompt="a", cache_salt="mine"), dict(prompt="b")]
    assert with_salt(named) == named  # a run that names its scope keeps it


def test_llamacpp_server_worker_reads_the_streamed_ids_and_the_servers_draft_counts():
    """llama-server's side of the compare scenario against a stand-in that speaks its /completion stream: the
    request it sends (token ids, greedy, no prompt cache, the schema), the ids and text it keeps (up to EOS), the
    server's own draft counts, a schema the server rejects leaving its case unguided, and the streams it must not
    take as a result (an error event, no last event, fewer ids than the server decoded)."""
    import http.server
    import importlib.util

    spec = importlib.util.spec_from_file_location("lsw", REPO / "scripts" / "compare" / "llamacpp_server_worker.py")
    lsw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lsw)
    seen = []
    last = dict(content="", stop=True, stop_type="eos", tokens_predicted=4, timings=dict(draft_n=6, draft_n_accepted=4))
    streams = {  # the prompt's first id -> the events the stand-in streams
        1: [dict(content='{"a"', tokens=[5, 6]), dict(content=": 1}", tokens=[7, 9]), last],
        2: [dict(content="x", tokens=[5]), dict(error=dict(code=500, message="boom"))],
        3: [dict(content="x", tokens=[5])],
        4: [dict(content="x", tokens=[5]), last],
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            assert body["stream"] is True  # the worker reads server-sent events only
            if body.get("json_schema", {}).get("title") == "bad":
                self.send_response(400)
                self.end_headers()
                self.wfile.write(b'{"error": "unsupported"}')
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for e in streams[body["prompt"][0]]:
                self.wfile.write(f"data: {json.dumps(e)}\n\n".encode())

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        case = dict(name="c", guide=json.dumps(SCHEMA), prompt_ids=[1, 2, 3])
        out = lsw.one_request(port, case, 3, 128, {9}, SCHEMA)
        assert out["ids"] == [5, 6, 7] and out["text"] == '{"a": 1}' and out["finish"] == "stop"
        assert (out["drafted"], out["accepted"]) == (6, 4) and 0 < out["ttft_s"] <= out["latency_s"]
        sent = seen[-1]
        assert sent["prompt"] == [1, 2, 3] and sent["cache_prompt"] is False and sent["return_tokens"] is True
        assert sent["temperature"] == 0.0 and sent["top_k"] == 1 and sent["json_schema"] == SCHEMA
        assert "drafted" not in lsw.one_request(port, case, 0, 128, {9}, None)  # target only: no draft counts
        assert "json_schema" not in seen[-1]
        run = lsw.run(port, [case], [SCHEMA], 3, True, 128, {9}, "Q4_K_M")
        assert (run["system"], run["config"]) == ("llama.cpp Q4_K_M (llama-server)", "draft model k3")
        assert lsw.run(port, [case], [None], 0, False, 128, {9}, "Q4_K_M")["config"] == "target only"
        # an error event; no last event; 1 id streamed of 4 decoded
        for first, why in ((2, "boom"), (3, "without its last event"), (4, "1 ids streamed of 4")):
            with pytest.raises(RuntimeError, match=why):
                lsw.one_request(port, dict(case, prompt_ids=[first]), 3, 128, {9}, None)
        bad = dict(name="b", guide=json.dumps({"title": "bad"}), prompt_ids=[1])
        schemas, no_grammar = lsw.accepted_schemas(port, [case, bad])
        assert schemas == [SCHEMA, None] and list(no_grammar) == ["b"] and "400" in no_grammar["b"]
    finally:
        server.shutdown()
