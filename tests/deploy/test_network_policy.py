"""Who may reach which port of which pod, under the NetworkPolicies of each rendered tree.

A small evaluator applies the policies as Kubernetes does (a pod selected by any Ingress policy
takes only what some rule of those policies allows; named ports resolve on the receiving pod;
`endPort` ranges; an empty `from` is everyone) and names each allowed source: a Deployment of the
tree, the gateway's proxies, any pod of the namespace, or a namespace. Each tree's table is then
compared whole with the intended one, so a rule that is missing, too wide or aimed at the wrong
pods fails. Kubelet probes come from the node, which NetworkPolicy always lets through.
"""

from __future__ import annotations

import json

import pytest

from tests.support.deploy_render import BASE, COMPOSITIONS, CPU_DEMO, DEPLOY, LLM_D, KUSTOMIZATIONS, OBSERVABILITY, named, of_kind, pod_labels, port_numbers, render, tree_id

# Pods a Gateway API implementation deploys for a Gateway carry this label (GEP-1762).
GATEWAY_LABEL = "gateway.networking.k8s.io/gateway-name"
MONITORING = "namespace monitoring"
NAMESPACE = "any pod of the namespace"
GATEWAY = "gateway proxies"
DECODE, PREFILL, EPP = "decode-server-decode", "decode-server-prefill", "decode-server-epp"
COLLECTOR = "decode-server-otel-collector"
TRACING_TREES = [t for t in COMPOSITIONS if t.component == DEPLOY / "components" / "otel-tracing"]
# UCX's TCP transport listens on ports from the kernel's default ip_local_port_range.
UCX_LOW, UCX_HIGH = 32768, 60999


def matches(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "Exists": present, "DoesNotExist": not present,
            "In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
        }[e["operator"]]
        if not ok:
            return False
    return True


def peer_name(peer: dict, deployments: list[dict]) -> set[str]:
    """The sources one `from` entry admits, by name."""
    if "namespaceSelector" in peer:
        ns = peer["namespaceSelector"].get("matchLabels", {}).get("kubernetes.io/metadata.name")
        assert ns and "podSelector" not in peer, f"unmodelled peer {peer}"
        return {f"namespace {ns}"}
    assert set(peer) == {"podSelector"}, f"unmodelled peer {peer}"
    selector = peer["podSelector"]
    if selector == {}:
        return {NAMESPACE}
    if selector == {"matchExpressions": [{"key": GATEWAY_LABEL, "operator": "Exists"}]}:
        return {GATEWAY}
    chosen = {d["metadata"]["name"] for d in deployments if matches(selector, pod_labels(d))}
    assert chosen, f"a peer selects no pod of these manifests: {selector}"
    return chosen


def port_allowed(rule_ports: list[dict] | None, port: int, target: dict) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        assert p.get("protocol", "TCP") == "TCP"
        number = p["port"] if isinstance(p["port"], int) else port_numbers(target).get(p["port"])
        if number is not None and number <= port <= p.get("endPort", number):
            return True
    return False


def sources(docs: list[dict], target: dict, port: int) -> set[str] | None:
    """Who may open `port` on the target's pods; None: no policy selects them (everyone)."""
    deployments = of_kind(docs, "Deployment")
    policies = [p for p in of_kind(docs, "NetworkPolicy")
                if matches(p["spec"]["podSelector"], pod_labels(target)) and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not policies:
        return None
    allowed: set[str] = set()
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if port_allowed(rule.get("ports"), port, target):
                peers = rule.get("from") or [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "*"}}}]
                for peer in peers:
                    allowed |= peer_name(peer, deployments)
    return allowed


def table(docs: list[dict], ports: dict[str, list[int]]) -> dict[str, dict[int, list[str] | None]]:
    out = {}
    for name, numbers in ports.items():
        target = named(docs, "Deployment", name)
        out[name] = {n: (None if (s := sources(docs, target, n)) is None else sorted(s)) for n in numbers}
    return out


def _server_port(docs: list[dict], name: str) -> int:
    return port_numbers(named(docs, "Deployment", name))["http"]


def _nixl_port(docs: list[dict], name: str) -> int:
    return port_numbers(named(docs, "Deployment", name))["nixl"]


UCX_PROBES = [UCX_LOW - 1, UCX_LOW, UCX_HIGH, UCX_HIGH + 1]


def test_base_policies():
    """Base: the server's port from any pod of the namespace and from Prometheus' namespace; the NIXL
    side channel and UCX's ports of each pool only from the other pool; nothing else."""
    docs = render(BASE)
    http, nixl = _server_port(docs, DECODE), _nixl_port(docs, DECODE)
    assert (http, nixl) == (_server_port(docs, PREFILL), _nixl_port(docs, PREFILL)) == (8000, 5600)
    got = table(docs, {DECODE: [http, nixl, 8200, *UCX_PROBES], PREFILL: [http, nixl, *UCX_PROBES]})
    web = sorted([NAMESPACE, MONITORING])
    assert got == {
        DECODE: {http: web, nixl: [PREFILL], 8200: [], UCX_LOW - 1: [], UCX_LOW: [PREFILL], UCX_HIGH: [PREFILL], UCX_HIGH + 1: []},
        PREFILL: {http: web, nixl: [DECODE], UCX_LOW - 1: [], UCX_LOW: [DECODE], UCX_HIGH: [DECODE], UCX_HIGH + 1: []},
    }


def test_llm_d_policies():
    """llm-d: port 8000 (the routing sidecar on decode pods) only from the gateway's proxies and the
    EPP; decode-server's own port on decode pods (8200) only from Prometheus (the sidecar reaches it
    over localhost); prefill pods' 8000 also from decode pods (the sidecar's prefill leg); NIXL and
    UCX only between the pools; the EPP's ext-proc from the gateway, its metrics from Prometheus."""
    docs = render(LLM_D)
    decode_http = _server_port(docs, DECODE)
    assert decode_http == 8200 and _server_port(docs, PREFILL) == 8000
    epp_ports = port_numbers(named(docs, "Deployment", EPP))
    got = table(docs, {
        DECODE: [8000, decode_http, 5600, UCX_LOW, UCX_HIGH + 1],
        PREFILL: [8000, 5600, UCX_HIGH, UCX_HIGH + 1],
        EPP: [epp_ports["grpc"], epp_ports["metrics"], epp_ports["grpc-health"]],
    })
    assert got == {
        DECODE: {8000: sorted([GATEWAY, EPP]), decode_http: [MONITORING], 5600: [PREFILL], UCX_LOW: [PREFILL], UCX_HIGH + 1: []},
        PREFILL: {8000: sorted([GATEWAY, EPP, MONITORING, DECODE]), 5600: [DECODE], UCX_HIGH: [DECODE], UCX_HIGH + 1: []},
        EPP: {epp_ports["grpc"]: [GATEWAY], epp_ports["metrics"]: [MONITORING], epp_ports["grpc-health"]: []},
    }


def test_cpu_demo_policies():
    """The demo's one pod: HTTP from the namespace and Prometheus; no KV transfer, so no NIXL rule."""
    docs = render(CPU_DEMO)
    http = _server_port(docs, DECODE)
    assert table(docs, {DECODE: [http, 5600, UCX_LOW]}) == {DECODE: {http: sorted([NAMESPACE, MONITORING]), 5600: [], UCX_LOW: []}}


@pytest.mark.parametrize("tree", TRACING_TREES, ids=tree_id)
def test_only_the_servers_send_spans_to_the_collector(tree):
    """The tracing component on either pool overlay: the collector's OTLP ports only from the pools'
    servers (both export), its health port from nobody but the kubelet; the pools' own rules as
    without the component."""
    docs = render(tree)
    ports = port_numbers(named(docs, "Deployment", COLLECTOR))
    got = table(docs, {COLLECTOR: [ports["otlp-grpc"], ports["otlp-http"], ports["health"]]})
    servers = sorted([DECODE, PREFILL])
    assert got == {COLLECTOR: {ports["otlp-grpc"]: servers, ports["otlp-http"]: servers, ports["health"]: []}}
    without = render(tree.overlay)
    pool_ports = {name: sorted(port_numbers(named(docs, "Deployment", name)).values()) for name in (DECODE, PREFILL)}
    assert table(docs, pool_ports) == table(without, pool_ports)


@pytest.mark.parametrize("directory", [*(t for t in KUSTOMIZATIONS if t != OBSERVABILITY), *TRACING_TREES], ids=tree_id)
def test_every_policy_selects_pods_and_their_ports(directory):
    """Each NetworkPolicy selects pods of the tree, by labels its Deployments give them, and each
    named port in its rules is a port of every pod it selects (a named port a pod lacks would
    silently allow nothing there)."""
    docs = render(directory)
    deployments = of_kind(docs, "Deployment")
    for policy in of_kind(docs, "NetworkPolicy"):
        what = f"NetworkPolicy/{policy['metadata']['name']}"
        selected = [d for d in deployments if matches(policy["spec"]["podSelector"], pod_labels(d))]
        assert selected, f"{what} selects no pod of {tree_id(directory)}"
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                peer_name(peer, deployments)
            for port in rule.get("ports", []):
                if isinstance(port["port"], str):
                    missing = [d["metadata"]["name"] for d in selected if port["port"] not in port_numbers(d)]
                    assert not missing, f"{what}: port {port['port']!r} is not a port of {missing}"


def test_the_evaluator_is_live():
    """A policy aimed at no pod, or a rule dropped, shows in the checks above."""
    docs = json.loads(json.dumps(render(BASE)))
    deployments = of_kind(docs, "Deployment")
    with pytest.raises(AssertionError, match="selects no pod"):
        peer_name({"podSelector": {"matchLabels": {"app.kubernetes.io/component": "decoder"}}}, deployments)
    metrics = named(docs, "NetworkPolicy", "decode-server-metrics")
    metrics["spec"]["ingress"] = []
    assert sources(docs, named(docs, "Deployment", DECODE), 8000) == {NAMESPACE}
    kv = named(docs, "NetworkPolicy", "decode-server-decode-kv-transfer")
    kv["spec"]["ingress"][0]["ports"] = None
    assert sources(docs, named(docs, "Deployment", DECODE), 8000) == {NAMESPACE, PREFILL}
