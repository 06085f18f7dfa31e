"""Smoke test: the real server starts with the repo's model repository and `llm` is served."""

import json
import urllib.request


def _get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return json.loads(r.read())


def test_server_ready(triton_server):
    with urllib.request.urlopen(f"{triton_server.http_url}/v2/health/ready", timeout=10) as r:
        assert r.status == 200


def test_llm_metadata_lists_text_input(triton_server):
    meta = _get_json(f"{triton_server.http_url}/v2/models/llm")
    names = {i["name"] for i in meta["inputs"]}
    assert "text_input" in names, meta
    assert "text_output" in {o["name"] for o in meta["outputs"]}, meta
