"""Session fixture `triton_server`: one real tritonserver per test session (see client/triton_server.py)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client"))  # triton_server, collect, jme

from triton_server import REPO, TritonServer, model_repository_with  # noqa: E402


def engine_settings() -> dict[str, str]:
    """E2E_ENGINE_SETTINGS="key=value,...": engine settings over the served model's (e.g. linear=torch serves the
    PyTorch forward, the code CUDA runs, on this CPU)."""
    given = os.environ.get("E2E_ENGINE_SETTINGS", "").strip()
    return dict(item.split("=", 1) for item in given.split(",") if item) if given else {}


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """A started tritonserver serving E2E_MODEL_REPOSITORY (default: the repo's model_repository), with
    E2E_ENGINE_SETTINGS over its settings.

    Attributes: http_url, grpc_url, metrics_url, log_path (plus log_tail(n), process, model_repository).
    """
    repo = Path(os.environ.get("E2E_MODEL_REPOSITORY", REPO / "model_repository"))
    if engine_settings():
        repo = model_repository_with(engine_settings(), tmp_path_factory.mktemp("settings") / "repo", repo)
    server = TritonServer(
        model_repository=repo,
        model=os.environ.get("E2E_MODEL", "llm") or None,
        startup_timeout=float(os.environ.get("E2E_STARTUP_TIMEOUT", "300")),
        extra_args=shlex.split(os.environ.get("E2E_TRITON_ARGS", "")),
        log_path=tmp_path_factory.mktemp("triton") / "tritonserver.log",
    )
    error = None
    try:
        server.start()
    except RuntimeError as e:  # start() has already stopped the server; report outside the except block
        error = str(e)
    if error is not None:
        pytest.fail(f"tritonserver did not become ready: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(items):
    """Tests marked stops_server stop the session's server: they run after all the others."""
    items.sort(key=lambda item: item.get_closest_marker("stops_server") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the end of the server log to the report of a failed test that used the server."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("triton_server")
    if report.failed and server is not None:
        report.sections.append((f"tritonserver log (last 80 lines of {server.log_path})", server.log_tail(80)))
