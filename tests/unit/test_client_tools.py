"""The client-side tools the end-to-end suites and the soak scenario (scripts/bench.py soak) lean on: raw input
tensors in build_inputs, the metrics reader, engine settings of a model repository, a repository with changed
settings, and finding the model's process and its memory."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client"))

from stream_client import build_inputs  # noqa: E402
from triton_server import (  # noqa: E402
    STUB,
    metric_total,
    model_parameters,
    model_repository_with,
    rss_bytes,
    stub_pids,
)

METRICS = """# HELP specgram_requests_total Finished requests by finish reason
# TYPE specgram_requests_total counter
specgram_requests_total{finish_reason="error",model="llm",version="1"} 3
specgram_requests_total{finish_reason="cancelled",model="llm",version="1"} 87
specgram_requests_total{finish_reason="cancelled",model="other",version="1"} 5
specgram_requests_total_extra{finish_reason="cancelled",model="llm",version="1"} 1000
nv_inference_count{model="llm",version="1"} 241
"""


def test_metric_total_sums_the_samples_whose_labels_match():
    assert metric_total(METRICS, "specgram_requests_total") == 95
    assert metric_total(METRICS, "specgram_requests_total", finish_reason="cancelled") == 92
    assert metric_total(METRICS, "specgram_requests_total", finish_reason="cancelled", model="llm") == 87
    assert metric_total(METRICS, "specgram_requests_total", finish_reason="stop") == 0


def test_build_inputs_sends_a_raw_tensor_as_built():
    import tritonclient.grpc as grpcclient

    raw = grpcclient.InferInput("max_tokens", [1], "FP32")
    raw.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    [sent] = build_inputs({"max_tokens": raw})
    assert sent is raw and sent.datatype() == "FP32"  # not cast to the contract's INT32
    [cast] = build_inputs({"max_tokens": np.array([2.0], dtype=np.float32)})
    assert cast.datatype() == "INT32"
    with pytest.raises(ValueError, match="temperature"):
        build_inputs({"temperature": raw})


def test_model_repository_with_changes_and_adds_settings(tmp_path):
    served = model_parameters(REPO / "model_repository")
    assert "ngram_min" not in served  # an engine setting the served config leaves at its default
    repo = model_repository_with({"max_slots": "3", "ngram_min": "1"}, tmp_path / "repo")
    params = model_parameters(repo)
    assert params["max_slots"] == "3" and params["ngram_min"] == "1"
    assert {k: v for k, v in params.items() if k not in ("max_slots", "ngram_min", "checkpoint")} == {
        k: v for k, v in served.items() if k not in ("max_slots", "checkpoint")
    }
    # the checkpoint is the same folder, now absolute; model.py is this checkout's (it runs this engine)
    assert Path(params["checkpoint"]).is_absolute()
    assert Path(params["checkpoint"]).resolve() == (REPO / "model_repository" / "llm" / served["checkpoint"]).resolve()
    assert (repo / "llm" / "1" / "model.py").resolve() == (REPO / "model_repository" / "llm" / "1" / "model.py")


def test_stub_pids_finds_the_children_named_like_the_stub(tmp_path):
    stub = tmp_path / STUB
    stub.symlink_to("/bin/sleep")  # a process's name is the file it was started from
    children = [subprocess.Popen([str(stub), "30"]), subprocess.Popen(["/bin/sleep", "30"])]
    try:
        assert stub_pids(os.getpid()) == [children[0].pid]
        assert stub_pids(children[1].pid) == []
        assert 0 < rss_bytes(children[0].pid) < rss_bytes(os.getpid())
    finally:
        for c in children:
            c.kill()
            c.wait()
