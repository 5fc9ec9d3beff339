"""deploy/components/otel-tracing: on top of each pool overlay, every decode-server exports its traces
to the collector the component runs. Starts no engine and needs no cluster (kustomize renders).

The names are checked against the code that reads them, not against copies: the flag parses with
decode-server's own CLI into vLLM's `otlp_traces_endpoint` (test_manifest_cli.py's test,
which covers every tree); the variables are the OpenTelemetry
SDK's own constants, and with the rendered values set, vLLM's exporter factory, the SDK's Resource
and its default sampler come out as the manifests mean them. The endpoint reaches the collector:
its host is the collector's Service, its port a Service port whose target is the container port
the collector's OTLP receiver (for the protocol vLLM uses) listens on.
"""

from __future__ import annotations

import copy
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.deploy_render import COMPOSITIONS, DEPLOY, named, of_kind, pod_labels, pod_spec, render, selects, tree_id
from tests.support.manifests import env_map, expand, flag_value, server_container, server_deployments

TRACING = DEPLOY / "components" / "otel-tracing"
TRACING_TREES = [t for t in COMPOSITIONS if t.component == TRACING]
FLAG = "--otlp-traces-endpoint"
# OTEL_EXPORTER_OTLP_TRACES_PROTOCOL values vLLM's exporter factory takes -> the collector's OTLP
# receiver protocol that speaks it.
RECEIVER_PROTOCOL = {"grpc": "grpc", "http/protobuf": "http"}


@pytest.fixture(scope="module")
def otel_env_names():
    """The variables the OpenTelemetry SDK reads, by its own constants."""
    from opentelemetry.sdk import environment_variables as names

    return names


def server_env(c: dict) -> dict[str, str]:
    return {name: e["value"] for name, e in env_map(c).items() if "value" in e}


def collector_problems(docs: list[dict], endpoint: str, protocol: str) -> list[str]:
    """Why `endpoint` (with OTLP over `protocol`) would not reach the rendered collector's receiver."""
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or url.port is None:
        return [f"{endpoint}: expected http://SERVICE:PORT"]
    services = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == url.hostname]
    if len(services) != 1:
        return [f"{endpoint}: no Service named {url.hostname}"]
    (service,) = services
    ports = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    if not ports:
        return [f"Service/{url.hostname} has no port {url.port}"]
    (collector,) = [d for d in of_kind(docs, "Deployment") if selects(service["spec"]["selector"], pod_labels(d))]
    (c,) = pod_spec(collector)["containers"]
    target = ports[0]["targetPort"]
    container_port = target if isinstance(target, int) else {p["name"]: p["containerPort"] for p in c["ports"]}.get(target)
    if container_port is None:
        return [f"Service/{url.hostname} port {url.port} targets {target!r}, not a port of {c['name']}"]

    # The configuration the collector runs: the ConfigMap key its --config names.
    (config_arg,) = [a for a in c["args"] if a.startswith("--config=")]
    config_path = config_arg.split("=", 1)[1]
    directory, _, key = config_path.rpartition("/")
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"].rstrip("/") == directory]
    (volume,) = [v for v in pod_spec(collector)["volumes"] if v["name"] == mount["name"]]
    config = yaml.safe_load(named(docs, "ConfigMap", volume["configMap"]["name"])["data"][key])

    problems = []
    receiver = config["receivers"]["otlp"]["protocols"].get(RECEIVER_PROTOCOL[protocol])
    if receiver is None:
        return [f"the collector's otlp receiver has no {RECEIVER_PROTOCOL[protocol]} protocol"]
    listen_port = int(receiver["endpoint"].rsplit(":", 1)[1])
    if listen_port != container_port:
        problems.append(f"the {RECEIVER_PROTOCOL[protocol]} receiver listens on {listen_port}, the Service sends to {container_port}")
    traces = config["service"]["pipelines"]["traces"]
    if "otlp" not in traces["receivers"]:
        problems.append("the traces pipeline does not take the otlp receiver")
    for section in ("receivers", "processors", "exporters"):
        missing = set(traces.get(section, [])) - set(config.get(section) or {})
        if missing:
            problems.append(f"the traces pipeline names undefined {section}: {sorted(missing)}")
    if set(config["service"].get("extensions", [])) - set(config.get("extensions") or {}):
        problems.append("service.extensions names an undefined extension")
    return problems


@pytest.mark.parametrize("tree", TRACING_TREES, ids=tree_id)
def test_every_server_exports_traces_to_the_collector(tree, otel_env_names):
    docs = render(tree)
    servers = server_deployments(docs)
    assert {d["metadata"]["name"] for d in servers} == {d["metadata"]["name"] for d in server_deployments(render(tree.overlay))}
    for d in servers:
        c = server_container(d)
        env = server_env(c)
        endpoint = flag_value(expand(c), FLAG)
        assert endpoint == env[otel_env_names.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT], "one endpoint for vLLM and the SDK"
        protocol = env[otel_env_names.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL]
        assert protocol in RECEIVER_PROTOCOL
        assert collector_problems(docs, endpoint, protocol) == []
        # The image is the overlay's own (the images install the `tracing` extra: test_images_resolve.py).
        assert c["image"] == server_container(named(render(tree.overlay), "Deployment", d["metadata"]["name"]))["image"]


@pytest.mark.parametrize("tree", TRACING_TREES, ids=tree_id)
def test_every_otel_variable_is_one_the_sdk_reads(tree, otel_env_names):
    known = {v for k, v in vars(otel_env_names).items() if k.startswith("OTEL_") and isinstance(v, str)}
    for d in server_deployments(render(tree)):
        otel = {name for name in env_map(server_container(d)) if name.startswith("OTEL_")}
        assert otel and otel <= known, f"not read by the OpenTelemetry SDK: {sorted(otel - known)}"


def test_the_rendered_settings_mean_what_they_say(otel_env_names, monkeypatch):
    """With the decode pod's variables set, vLLM's exporter factory makes the exporter for the
    protocol, and the SDK names the service and samples as the manifests say."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from vllm.tracing.otel import OTLPGrpcExporter, OTLPHttpExporter, get_span_exporter

    (tree,) = [t for t in TRACING_TREES if t.overlay.name == "base"]
    c = server_container(named(render(tree), "Deployment", "decode-server-decode"))
    env = server_env(c)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = get_span_exporter(env[otel_env_names.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT])
    expected = {"grpc": OTLPGrpcExporter, "http/protobuf": OTLPHttpExporter}[env[otel_env_names.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL]]
    assert isinstance(exporter, expected)
    assert Resource.create().attributes[SERVICE_NAME] == env[otel_env_names.OTEL_SERVICE_NAME] == "decode-server"
    sampler = TracerProvider().sampler
    ratio = float(env[otel_env_names.OTEL_TRACES_SAMPLER_ARG])
    assert isinstance(sampler, ParentBased)
    assert sampler.get_description() == ParentBased(TraceIdRatioBased(ratio)).get_description()
    assert 0 < ratio < 1


def test_the_collector_check_is_live(otel_env_names):
    """collector_problems finds a receiver on the wrong port, a wrong Service and a protocol the
    collector receives on another port."""
    (tree,) = [t for t in TRACING_TREES if t.overlay.name == "base"]
    docs = render(tree)
    env = server_env(server_container(named(docs, "Deployment", "decode-server-decode")))
    endpoint = env[otel_env_names.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT]
    assert collector_problems(docs, endpoint, "grpc") == []

    moved = copy.deepcopy(docs)
    config_map = named(moved, "ConfigMap", "decode-server-otel-collector")
    (key,) = config_map["data"]
    config = yaml.safe_load(config_map["data"][key])
    config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = "0.0.0.0:14317"
    config_map["data"][key] = yaml.safe_dump(config)
    assert collector_problems(moved, endpoint, "grpc") == ["the grpc receiver listens on 14317, the Service sends to 4317"]

    url = urlsplit(endpoint)
    assert collector_problems(docs, f"{url.scheme}://elsewhere:{url.port}", "grpc") == [f"{url.scheme}://elsewhere:{url.port}: no Service named elsewhere"]
    assert collector_problems(docs, f"{url.scheme}://{url.hostname}:9", "grpc") == [f"Service/{url.hostname} has no port 9"]
    assert collector_problems(docs, endpoint, "http/protobuf") == ["the http receiver listens on 4318, the Service sends to 4317"]
