"""Run a real tritonserver (2.51, from the nvidia-pytriton wheel) for end-to-end tests and benchmarks.

`TritonServer` starts the server on free local ports with a model repository, waits until the server
and a model are ready, and stops it (SIGTERM, then SIGKILL of its process group). Talking to it over a
gRPC stream: collect.py. Needs `scripts/setup.sh` to have been run (venv, build/triton/backends).
Watching a running server (any server, not only one started here): `stub_pids` (the Python-backend processes
that run the model), `rss_bytes`, `metric_total` (a metric from the metrics port), `model_parameters`.

Environment knobs (read by tests/e2e/conftest.py):
    E2E_MODEL_REPOSITORY   model repository to serve (default: <repo>/model_repository)
    E2E_MODEL              model that must be ready before tests start (default: llm)
    E2E_STARTUP_TIMEOUT    seconds to wait for readiness (default: 300)
    E2E_TRITON_ARGS        extra tritonserver arguments (shell-split)
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUB = "triton_python_backend_stub"


# --------------------------------------------------------------------------- watching a server
def stub_pids(server_pid: int) -> list[int]:
    """The Python-backend stub processes (one per model instance; the model runs in them) that a tritonserver
    started: its children named triton_python_backend_stub."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # the process ended while we looked
            continue
        if fields.get("Name", "").strip() == STUB[:15] and int(fields.get("PPid", "0")) == server_pid:
            pids.append(int(status.parent.name))
    return sorted(pids)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def metric_total(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of the samples of metric `name` (Prometheus text format) whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", metrics_text, re.MULTILINE):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def model_repository_with(
    settings: dict[str, str], target: Path, source: Path = REPO / "model_repository", model: str = "llm"
) -> Path:
    """A model repository at `target` serving `model` of `source` with some engine settings changed or added.
    The version folder is a link to the source's, so the model runs this checkout's engine (model.py resolves
    its own path); a relative checkpoint is made absolute: one given in `settings` against the current directory,
    the source config's own against the model's folder (where the server would resolve it)."""
    src, dst = Path(source) / model, Path(target) / model
    dst.mkdir(parents=True)
    for version in src.iterdir():
        if version.is_dir() and version.name.isdigit():
            (dst / version.name).symlink_to(version.resolve(), target_is_directory=True)
    text = (src / "config.pbtxt").read_text()
    current = model_parameters(source, model)
    for key in ("checkpoint", "draft_checkpoint"):  # a relative path given here: the caller's, from its directory
        if settings.get(key) and not Path(settings[key]).is_absolute():
            settings = {**settings, key: str(Path(settings[key]).resolve())}
    for key in ("checkpoint", "draft_checkpoint"):
        if current.get(key) and key not in settings and not Path(current[key]).is_absolute():
            settings = {**settings, key: str((src / current[key]).resolve())}
    for key, value in settings.items():
        line = f'parameters {{ key: "{key}", value: {{ string_value: "{value}" }} }}'
        text, n = re.subn(
            rf'parameters {{ key: "{re.escape(key)}", value: {{ string_value: "[^"]*" }} }}',
            lambda _, line=line: line,
            text,
        )
        if n == 0:
            text += line + "\n"
    (dst / "config.pbtxt").write_text(text)
    return Path(target)


def model_parameters(model_repository: Path, model: str = "llm") -> dict[str, str]:
    """The `parameters` of a model's config.pbtxt (key -> string_value): the engine settings it is served with
    (a setting that is absent takes its default in backend/specgram/config.py)."""
    text = (Path(model_repository) / model / "config.pbtxt").read_text()
    return dict(re.findall(r'key:\s*"([^"]+)",\s*value:\s*{\s*string_value:\s*"([^"]*)"', text))


# --------------------------------------------------------------------------- server
def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together while choosing, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _default_venv() -> Path:
    """The venv running these tests (tests run with .venv/bin/python), else the repo's .venv."""
    return Path(sys.prefix) if sys.prefix != sys.base_prefix else REPO / ".venv"


def _site_packages() -> Path:
    venv = _default_venv()
    cand = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    return cand if cand.is_dir() else Path(sysconfig.get_paths()["purelib"])


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class TritonServer:
    model_repository: Path = REPO / "model_repository"
    model: str | None = "llm"  # wait for this model to be ready (None: server readiness only)
    startup_timeout: float = 300.0
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None  # default: a new temporary file
    venv: Path = field(default_factory=_default_venv)

    http_url: str = ""  # http://127.0.0.1:PORT
    grpc_url: str = ""  # 127.0.0.1:PORT (tritonclient.grpc style)
    metrics_url: str = ""  # http://127.0.0.1:PORT/metrics
    process: subprocess.Popen | None = None

    # ---- paths
    @property
    def triton_bin(self) -> Path:
        return _site_packages() / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def backends_dir(self) -> Path:
        return Path(os.environ.get("TRITON_BACKENDS", REPO / "build" / "triton" / "backends"))

    def log_tail(self, n: int = 80) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return "(no server log)"
        lines = Path(self.log_path).read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    # ---- lifecycle
    def start(self) -> "TritonServer":
        if not self.triton_bin.exists():
            raise RuntimeError(f"tritonserver not found at {self.triton_bin}; run scripts/setup.sh")
        stub = self.backends_dir / "python" / "triton_python_backend_stub"
        if not stub.exists():
            raise RuntimeError(f"Python backend stub not found at {stub}; run scripts/setup.sh")
        if not Path(self.model_repository).is_dir():
            raise RuntimeError(f"model repository {self.model_repository} does not exist")
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        # The ports are free when chosen but could be taken before the server binds them: retry.
        for attempt in range(3):
            self._launch()
            try:
                self._wait_ready()
                return self
            except RuntimeError as e:
                port_clash = "already in use" in self.log_tail(200).lower()
                self.stop()
                if not port_clash or attempt == 2:
                    raise RuntimeError(f"{e}\n--- last 80 lines of {self.log_path} ---\n{self.log_tail(80)}") from None
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        http, grpc, metrics = free_ports(3)
        self.http_url = f"http://127.0.0.1:{http}"
        self.grpc_url = f"127.0.0.1:{grpc}"
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        cmd = [
            str(self.triton_bin),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={self.backends_dir}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--log-verbose=0",
            *self.extra_args,
        ]
        env = dict(os.environ)
        # The stub's embedded interpreter finds the venv's site-packages through PATH.
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        # Keep build/lib (nvidia-pytriton's libcudart.so.12, for perf_analyzer) away from the server: the
        # model's torch would pick up that CUDA runtime instead of its own.
        ld = [
            p
            for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != (REPO / "build" / "lib").resolve()
        ]
        if ld:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
        else:
            env.pop("LD_LIBRARY_PATH", None)
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = open(self.log_path, "ab")
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
        )
        log.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        targets = [f"{self.http_url}/v2/health/ready"]
        if self.model:
            targets.append(f"{self.http_url}/v2/models/{self.model}/ready")
        while time.monotonic() < deadline:
            rc = self.process.poll()
            if rc is not None:
                raise RuntimeError(f"tritonserver exited early with code {rc}")
            if all(_http_ok(t) for t in targets):
                return
            time.sleep(0.5)
        what = f"model {self.model!r}" if self.model else "the server"
        raise RuntimeError(f"timed out after {self.startup_timeout:.0f}s waiting for {what} to be ready")

    def stop(self, term_timeout: float = 30.0) -> None:
        p = self.process
        if p is None:
            return
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=term_timeout)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        # Kill whatever is left in its process group (the server, Python backend stubs).
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.process = None

    def stub_pids(self) -> list[int]:
        return stub_pids(self.process.pid) if self.process is not None else []

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
