"""Model management in explicit model-control mode, on one tritonserver for the module: loading and unloading a
model (its requests refused once it is gone, its Python stub process and that process's children ended, the
same greedy output once it is loaded again); two models of this kind with different settings in one server,
served at once, each with its own settings and its own metric series; unloading one leaves the other serving;
a model whose checkpoint is broken fails its load saying why; and the server stops cleanly at the end."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from collect import errors_of, ids_of, stream_infer, text_of
from test_model_reload import CLOSE, wait_for
from triton_server import TritonServer, metric_total, model_repository_with

A, B = "llm", "llm_b"
BROKEN = "llm_broken"  # its checkpoint a truncated GGUF file
A_MAX_TOKENS, B_MAX_TOKENS = 12, 5
# llm_b: fewer KV slots, a shorter default output and no speculation, so that each setting shows in its outputs
# and gauges; greedy output is the same with speculation on or off, so llm_b's output is the start of llm's.
A_SETTINGS = {"default_max_tokens": str(A_MAX_TOKENS)}
B_SETTINGS = {
    "max_slots": "2",
    "default_max_tokens": str(B_MAX_TOKENS),
    "default_num_draft_tokens": "0",
    "default_num_draft_tokens_guided": "0",
}
PROMPTS = ["Name a colour.", "Count to five.", "Say hello in French."]


def request(prompt: str, **more) -> dict:
    """A greedy request without max_tokens (the model's default_max_tokens applies) that ignores EOS, so that
    its output has exactly that many tokens."""
    return {"text_input": prompt, "ignore_eos": True, **more}


def add_model_copy(repo: Path, name: str, settings: dict[str, str], staging: Path) -> None:
    """Model `name` in `repo`: the shipped `llm` under another name with some settings changed (Triton wants the
    name in config.pbtxt to be the folder's)."""
    model_repository_with(settings, staging)
    (staging / A).rename(repo / name)
    config = repo / name / "config.pbtxt"
    text, n = re.subn(rf'^name: "{A}"$', f'name: "{name}"', config.read_text(), flags=re.M)
    assert n == 1, "config.pbtxt has no name line"
    config.write_text(text)


def post(server, path: str) -> requests.Response:
    return requests.post(f"{server.http_url}/v2/repository/{path}", timeout=300, headers=CLOSE)


def ready(server, model: str) -> bool:
    return requests.get(f"{server.http_url}/v2/models/{model}/ready", timeout=30, headers=CLOSE).status_code == 200


def metrics(server) -> str:
    return requests.get(server.metrics_url, timeout=30, headers=CLOSE).text


def instances(text: str, model: str) -> set[str]:
    """The instance labels of a model's series on the metrics port (any specgram metric)."""
    found = set()
    for m in re.finditer(r"^specgram_\w+\{([^}]*)\}", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("model") == model:
            found.add(labels["instance"])
    return found


def stub_of(server, model: str) -> int:
    """The pid of the model's one Python stub process: its instance label ends with the pid of the process that
    runs it, which must be one of the server's stub children."""
    (instance,) = instances(metrics(server), model)
    pid = int(instance.rsplit("-", 1)[1])
    assert pid in server.stub_pids(), (instance, server.stub_pids())
    return pid


def process_tree(pid: int) -> set[int]:
    """pid and every live process below it (the stub's grammar-compile forkserver and workers)."""
    parents = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # the process ended while we looked
            continue
        if not fields.get("State", "").startswith("Z"):
            parents[int(status.parent.name)] = int(fields.get("PPid", "0"))
    tree, grew = {pid} & set(parents), True
    while grew:
        below = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return tree


def alive(pids: set[int]) -> set[int]:
    """Those of pids that still run (a zombie, ended but not yet reaped, does not)."""
    live = set()
    for pid in pids:
        try:
            state = next(
                line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:")
            )
        except (OSError, StopIteration):
            continue
        if "Z" not in state.split(":", 1)[1].split()[0]:
            live.add(pid)
    return live


def served(server, model: str, prompt: str = PROMPTS[0], on_response=None, **more) -> list[int]:
    """A request to `model` that must succeed: its output ids."""
    responses = stream_infer(
        server.grpc_url, request(prompt, **more), model=model, timeout=120, on_response=on_response
    )
    assert not errors_of(responses), errors_of(responses)
    assert text_of(responses), responses
    return ids_of(responses)


def truncated_gguf(folder: Path) -> Path:
    """A tiny GGUF file cut at three quarters of its length, as an interrupted download leaves one."""
    from tests.unit.tiny_gguf import save_gguf

    folder.mkdir()
    path = save_gguf(folder / "cut.gguf", seed=5)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 3 // 4])
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module in explicit model-control mode: `llm` loaded at start, `llm_b` in the repository
    and loaded by the tests."""
    root = tmp_path_factory.mktemp("model-management")
    repo = model_repository_with(A_SETTINGS, root / "repository")
    add_model_copy(repo, B, B_SETTINGS, root / "staging")
    add_model_copy(repo, BROKEN, {"checkpoint": str(truncated_gguf(root / "broken"))}, root / "staging-broken")
    server = TritonServer(
        model_repository=repo,
        model=A,
        log_path=root / "tritonserver.log",
        extra_args=["--model-control-mode=explicit", f"--load-model={A}"],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()  # the last test has stopped it already when it ran


def test_load_then_unload_ends_the_stub_refuses_requests_and_a_reload_serves_the_same_ids(server):
    assert not ready(server, B)
    r = post(server, f"models/{B}/load")
    assert r.status_code == 200, r.text
    assert ready(server, B)
    before = served(server, B)
    assert len(before) == B_MAX_TOKENS
    stub = stub_of(server, B)
    tree = process_tree(stub)
    assert len(tree) > 1, tree  # the grammar-compile processes start with the model

    # Unloading with a stream open on the model: Triton unloads it once the stream has ended, which it does in
    # full (32 tokens, the first 5 those above).
    streaming = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        open_stream = pool.submit(
            served, server, B, PROMPTS[0], on_response=lambda _: streaming.set(), max_tokens=32, stream=True
        )
        assert streaming.wait(120)
        r = post(server, f"models/{B}/unload")
        assert r.status_code == 200, r.text
        ended = open_stream.result()
    assert len(ended) == 32 and ended[:B_MAX_TOKENS] == before
    assert wait_for(lambda: not ready(server, B))
    refused = stream_infer(server.grpc_url, request(PROMPTS[0]), model=B, timeout=60)
    assert not ids_of(refused) and len(errors_of(refused)) == 1, refused
    # Triton's own refusal ("Request for unknown model: 'llm_b' has no available versions"): no model saw it
    assert "unknown model" in errors_of(refused)[0] and f"'{B}'" in errors_of(refused)[0], refused
    assert wait_for(lambda: not alive(tree)), f"still running after the unload: {alive(tree)}"
    assert wait_for(lambda: stub not in server.stub_pids())
    assert wait_for(lambda: not instances(metrics(server), B)), instances(metrics(server), B)
    index = post(server, "index").json()
    assert {m["name"]: m.get("state") for m in index}[B] == "UNAVAILABLE", index
    assert served(server, A, PROMPTS[0])[:B_MAX_TOKENS] == before  # the other model serves on

    r = post(server, f"models/{B}/load")
    assert r.status_code == 200, r.text
    assert served(server, B) == before
    assert stub_of(server, B) != stub


def test_two_models_serve_at_once_with_their_own_settings_and_series(server):
    r = post(server, f"models/{B}/load")  # loaded already when the test above ran: then nothing changes
    assert r.status_code == 200, r.text
    text = metrics(server)
    generated = {m: metric_total(text, "specgram_generated_tokens_total", model=m) for m in (A, B)}
    finished = {m: metric_total(text, "specgram_requests_total", model=m, finish_reason="length") for m in (A, B)}
    assert metric_total(text, "specgram_kv_slots", model=A) == 8
    assert metric_total(text, "specgram_kv_slots", model=B) == 2  # B_SETTINGS' max_slots

    # Both models at once: three requests to llm, four to llm_b (more than its two KV slots: some wait).
    jobs = [(A, p) for p in PROMPTS] + [(B, p) for p in PROMPTS] + [(B, PROMPTS[0])]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(pool.map(lambda job: served(server, *job), jobs))
    by_prompt = {p: ids for (model, p), ids in zip(jobs, outputs, strict=True) if model == A}
    for (model, prompt), ids in zip(jobs, outputs, strict=True):
        assert len(ids) == (A_MAX_TOKENS if model == A else B_MAX_TOKENS), (model, prompt, ids)
        assert ids == by_prompt[prompt][: len(ids)], (model, prompt)  # greedy: the same tokens on both models

    # Each model's counters count its own tokens and requests, and each has one instance of its own.
    made = {m: sum(len(ids) for (model, _), ids in zip(jobs, outputs, strict=True) if model == m) for m in (A, B)}

    def counted() -> dict:
        text = metrics(server)
        return {
            m: (
                metric_total(text, "specgram_generated_tokens_total", model=m) - generated[m],
                metric_total(text, "specgram_requests_total", model=m, finish_reason="length") - finished[m],
            )
            for m in (A, B)
        }

    expected = {m: (made[m], sum(model == m for model, _ in jobs)) for m in (A, B)}
    assert wait_for(lambda: counted() == expected, polls=100), (counted(), expected)
    text = metrics(server)
    assert len(instances(text, A)) == len(instances(text, B)) == 1
    assert instances(text, A) != instances(text, B)

    # Unloading llm_b while llm streams: the stream ends exactly as it does alone, and llm serves on.
    long = {"max_tokens": 64, "stream": True}
    solo = served(server, A, PROMPTS[1], **long)
    streaming = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        during = pool.submit(served, server, A, PROMPTS[1], on_response=lambda _: streaming.set(), **long)
        assert streaming.wait(120)
        r = post(server, f"models/{B}/unload")
        assert r.status_code == 200, r.text
        assert during.result() == solo
    assert wait_for(lambda: not ready(server, B))
    assert wait_for(lambda: not instances(metrics(server), B))
    assert served(server, A, PROMPTS[2]) == by_prompt[PROMPTS[2]]
    assert metric_total(metrics(server), "specgram_kv_slots", model=A) == 8


def test_a_broken_checkpoint_fails_its_load_in_words_and_the_others_serve_on(server):
    r = post(server, f"models/{BROKEN}/load")
    assert r.status_code != 200, r.text
    # the engine's refusal reaches the load's answer: the file, the tensor, how far past the end, why
    assert "cut.gguf" in r.text and "bytes past the end of the file" in r.text and "truncated" in r.text, r.text
    assert not any(t in r.text for t in ("cannot reshape", "KeyError", "Traceback")), r.text
    assert not ready(server, BROKEN)
    assert len(served(server, A)) == A_MAX_TOKENS


def test_the_server_stops_cleanly(server):
    """Last in the module: it stops the module's server."""
    process = server.process
    assert process is not None and process.poll() is None
    server.stop()
    log = server.log_tail(600)
    assert process.returncode == 0, log
    assert not re.search(r"Signal \((6|11)\)|Segfault|tcache|double free", log), log
    assert log.count(f"successfully unloaded '{B}'") >= 2, log
    assert f"successfully unloaded '{A}'" in log, log
