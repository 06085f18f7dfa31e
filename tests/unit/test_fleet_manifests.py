"""deploy/inference-pool.yaml, checked where it cannot be applied (no cluster here): the InferencePool against the
CRD's OpenAPI schema (vendored in tests/data, release named there), the picker's metric flags against the series
the model exports, parsed the way the picker parses them, and every reference between the objects."""

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "tests" / "data" / "gateway-api-inference-extension" / "inferencepool-v1.json"
METRIC_FLAGS = {  # the picker's flag -> the kind of series it reads
    "--total-queued-requests-metric": "gauge",
    "--total-running-requests-metric": "gauge",
    "--kv-cache-usage-percentage-metric": "gauge",
    "--lora-info-metric": "gauge",
}


def objects() -> dict[tuple[str, str], dict]:
    """(kind, name) -> object."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "inference-pool.yaml").read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def validator():
    schema = json.loads(SCHEMA.read_text())
    assert "v1.3.1" in schema["source"] and schema["bundle_version"] == "v1.3.1"
    return jsonschema.Draft7Validator(schema["openAPIV3Schema"])


def exported() -> dict[str, tuple[str, set[str]]]:
    """What a model instance serving a LoRA adapter exports once its gauges are set: name -> (kind, labels)."""
    from specgram.serving.loop import Load
    from specgram.serving.metrics import Metrics

    from . import fake_pb_utils as pb

    mark = {"model": "llm", "version": "1", "instance": "fleet-manifests-check"}
    metrics = Metrics(pb.MetricFamily, mark, max_draft_len=4, max_slots=8, forward="native", adapters=["sql"])
    metrics.publish(Load(), up=True)
    out = {}
    for name, series in pb.MetricFamily.registry.items():
        mine = [m for m in series if m.labels.get("instance") == mark["instance"]]
        if mine:
            out[name] = (mine[0].family.kind, set().union(*(m.labels for m in mine)))
    metrics.release()
    for series in pb.MetricFamily.registry.values():  # drop these again: other tests read their own [0]
        series[:] = [m for m in series if m.labels.get("instance") != mark["instance"]]
    return out


def picker_spec(text: str) -> tuple[str, dict[str, str]]:
    """A metric flag's value as the picker (v1.3.1, metrics_spec.go) reads it: name{label=value,...}, values
    taken as written (quotes would be part of them)."""
    m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]+)\})?", text.strip())
    assert m, f"not a metric spec the picker parses: {text!r}"
    labels = dict(pair.strip().split("=", 1) for pair in (m[2] or "").split(",") if pair.strip())
    return m[1], labels


def test_the_inference_pool_validates_against_the_crd_schema():
    pool = objects()[("InferencePool", "specgram-fleet")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    errors = [e.message for e in validator().iter_errors(pool)]
    assert not errors, errors


@pytest.mark.parametrize(
    "broken",
    [
        lambda s: s.pop("endpointPickerRef"),
        lambda s: s.update(targetPorts=[]),
        lambda s: s.update(targetPorts=[{"number": 70000}]),
        lambda s: s["endpointPickerRef"].update(failureMode="FailSometimes"),
    ],
)
def test_the_schema_refuses_a_broken_pool(broken):
    pool = objects()[("InferencePool", "specgram-fleet")]
    broken(pool["spec"])
    assert list(validator().iter_errors(pool))


def test_the_pool_selects_the_model_servers_and_the_picker_serves_it():
    obj = objects()
    pool = obj[("InferencePool", "specgram-fleet")]["spec"]
    servers = obj[("Deployment", "specgram-fleet")]["spec"]["template"]
    assert pool["selector"]["matchLabels"].items() <= servers["metadata"]["labels"].items()
    (server,) = servers["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert [p["number"] for p in pool["targetPorts"]] == [ports["openai"]]  # the picker scrapes its /metrics
    assert servers["metadata"]["annotations"]["prometheus.io/port"] == str(ports["openai"])
    args = server["args"]
    assert {"--backend=vllm", "--model-control-mode=explicit", "--load-model=llm"} <= set(args)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # the model's readiness, not the server's
        assert server[probe]["httpGet"] == {"path": "/v2/models/llm/ready", "port": "http"}, probe

    ref = pool["endpointPickerRef"]
    service = obj[("Service", ref["name"])]["spec"]
    assert ref["port"]["number"] in {p["port"] for p in service["ports"]}
    epp = obj[("Deployment", ref["name"])]["spec"]["template"]
    assert service["selector"].items() <= epp["metadata"]["labels"].items()
    (picker,) = epp["spec"]["containers"]
    assert ref["port"]["number"] in {p["containerPort"] for p in picker["ports"]}
    assert f"--pool-name={obj[('InferencePool', 'specgram-fleet')]['metadata']['name']}" in picker["args"]

    # its configuration file is the mounted ConfigMap's, and every scorer a profile uses is declared
    config_file = next(a.split("=", 1)[1] for a in picker["args"] if a.startswith("--config-file="))
    (mount,) = [m for m in picker["volumeMounts"] if config_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in epp["spec"]["volumes"] if v["name"] == mount["name"]]
    config = yaml.safe_load(obj[("ConfigMap", volume["configMap"]["name"])]["data"][Path(config_file).name])
    assert config["kind"] == "EndpointPickerConfig"
    declared = {p["type"] for p in config["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "lora-affinity-scorer"} <= declared
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= declared

    # the picker's account may watch the pool and its pods
    account = epp["spec"]["serviceAccountName"]
    assert ("ServiceAccount", account) in obj
    binding = obj[("RoleBinding", account)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    rules = obj[("Role", binding["roleRef"]["name"])]["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("inference.networking.k8s.io", "inferencepools"), ("", "pods")} <= granted

    route = obj[("HTTPRoute", "specgram-fleet")]["spec"]
    backends = [b for rule in route["rules"] for b in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "specgram-fleet"}]


def test_the_pickers_metric_flags_name_what_the_model_exports():
    from . import fake_pb_utils as pb

    (picker,) = objects()[("Deployment", "specgram-fleet-epp")]["spec"]["template"]["spec"]["containers"]
    flags = dict(a.split("=", 1) for a in picker["args"] if "=" in a)
    model = exported()
    for flag, kind in METRIC_FLAGS.items():
        name, labels = picker_spec(flags[flag])
        assert name in model, f"{flag}: {name} is not a metric the model exports"
        assert model[name][0] == getattr(pb.MetricFamily, kind.upper()), (flag, model[name][0])
        assert labels == {"model": "llm"} and set(labels) <= model[name][1], (flag, labels)
    lora = model[picker_spec(flags["--lora-info-metric"])[0]][1]
    assert {"max_lora", "running_lora_adapters", "waiting_lora_adapters"} <= lora  # the labels the picker parses


def test_the_autoscaler_scales_the_pool_on_its_queue():
    obj = objects()
    hpa = obj[("HorizontalPodAutoscaler", "specgram-fleet")]["spec"]
    dep = obj[("Deployment", "specgram-fleet")]
    assert hpa["scaleTargetRef"] == {"apiVersion": dep["apiVersion"], "kind": "Deployment", "name": "specgram-fleet"}
    assert 1 <= hpa["minReplicas"] <= dep["spec"]["replicas"] <= hpa["maxReplicas"]
    [metric] = hpa["metrics"]
    assert metric["pods"]["metric"]["name"] == "specgram_requests_waiting"
    values = yaml.safe_load((REPO / "deploy" / "prometheus-adapter-values.yaml").read_text())
    assert "specgram_requests_waiting" in {rule["name"]["as"] for rule in values["rules"]["custom"]}
