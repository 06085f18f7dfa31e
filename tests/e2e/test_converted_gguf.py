"""GGUF files written by llama.cpp's own converter, served through tritonserver: each family's file (F32 and Q8_0)
and its checkpoint folder in one server, both in `weights int8`, give the same greedy ids at draft lengths 0, 3
and auto.

Optional: the files come from `bash scripts/compare/setup_converter.sh && python scripts/compare/family_ggufs.py`
(llama.cpp's converter in a venv of its own, minutes of CPU), under build/gguf-families/; without them the module
is skipped. The reference of a Q8_0 file is its folder with the file's own values (folder-q8_0, which
family_ggufs.py writes): a random tiny model's greedy ids move with Q8_0's rounding.
"""

from __future__ import annotations

import pytest
from collect import errors_of, ids_of, stream_infer
from test_model_management import add_model_copy
from triton_server import REPO, TritonServer, model_repository_with

FAMILIES = REPO / "build" / "gguf-families"
CASES = sorted(
    (d.name, kind)
    for d in (FAMILIES.iterdir() if FAMILIES.is_dir() else [])
    for kind in ("f32", "q8_0")
    if (d / f"{d.name}-{kind}.gguf").exists() and (d / ("folder" if kind == "f32" else "folder-q8_0")).is_dir()
)
PROMPTS = ["Hello there", "The quick brown fox jumps"]
SETTINGS = {"weights": "int8", "max_slots": "2", "max_seq_len": "256"}

pytestmark = pytest.mark.skipif(
    not CASES, reason="no converter-written GGUF files under build/gguf-families (scripts/compare/family_ggufs.py)"
)


@pytest.fixture(scope="module", params=CASES, ids=[f"{c}-{k}" for c, k in CASES])
def pair_server(request, tmp_path_factory):
    """A tritonserver serving the case's GGUF file as `llm` and its reference folder as `folder`."""
    case, kind = request.param
    root = tmp_path_factory.mktemp(f"converted-{case}-{kind}")
    d = FAMILIES / case
    repo = model_repository_with({**SETTINGS, "checkpoint": str(d / f"{case}-{kind}.gguf")}, root / "repo")
    reference = d / ("folder" if kind == "f32" else "folder-q8_0")
    add_model_copy(repo, "folder", {**SETTINGS, "checkpoint": str(reference)}, root / "staging")
    server = TritonServer(model_repository=repo, model="llm", log_path=root / "tritonserver.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_file_serves_its_folders_greedy_ids_at_every_draft_length(pair_server):
    for prompt in PROMPTS:
        got = {}
        for model in ("llm", "folder"):
            for k in (0, 3, -1):
                request = {"text_input": prompt, "max_tokens": 12, "ignore_eos": True, "num_draft_tokens": k}
                responses = stream_infer(pair_server.grpc_url, request, model=model, timeout=120)
                assert not errors_of(responses), (model, k, errors_of(responses))
                got[model, k] = ids_of(responses)
        assert len(got["folder", 0]) == 12
        assert all(ids == got["folder", 0] for ids in got.values()), (prompt, got)
