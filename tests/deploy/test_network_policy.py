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

from tests.support.deploy_render import (
    BASE, COMPOSITIONS, CPU_DEMO, DEPLOY, LLM_D, KUSTOMIZATIONS, MONITORING, OBSERVABILITY, Composition, named, of_kind,
    pod_labels, port_numbers, render, tree_id,
)

# Pods a Gateway API implementation deploys for a Gateway carry this label (GEP-1762).
GATEWAY_LABEL = "gateway.networking.k8s.io/gateway-name"
PROMETHEUS = "namespace monitoring"  # the parameter's default (deploy/base/params.yaml)
LLM_D_PROMETHEUS = "namespace llm-d-monitoring"  # llm-d's (deploy/overlays/llm-d/params)
NAMESPACE = "any pod of the namespace"
GATEWAY = "gateway proxies (any namespace)"
# llm-d's router charts (llm-d-router config/charts/routerlib/templates/_helpers.tpl): the EPP's
# pods carry llm-d.ai/igw-mode (its standalone proxy runs in them by default); the standalone
# proxy in service mode carries llm-d-router-proxy.
IGW_MODE, ROUTER_PROXY = "llm-d.ai/igw-mode", "llm-d-router-proxy"
CHART_EPP, CHART_PROXY = "llm-d router chart EPP", "llm-d standalone router proxy"
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
    if peer.get("namespaceSelector") == {} and peer.get("podSelector") == {"matchExpressions": [{"key": GATEWAY_LABEL, "operator": "Exists"}]}:
        return {GATEWAY}
    if "ipBlock" in peer:
        assert set(peer) == {"ipBlock"}, f"unmodelled peer {peer}"
        return {f"ipBlock {peer['ipBlock']['cidr']}"}
    if "namespaceSelector" in peer:
        ns = peer["namespaceSelector"].get("matchLabels", {}).get("kubernetes.io/metadata.name")
        assert ns and "podSelector" not in peer, f"unmodelled peer {peer}"
        return {f"namespace {ns}"}
    assert set(peer) == {"podSelector"}, f"unmodelled peer {peer}"
    selector = peer["podSelector"]
    if selector == {}:
        return {NAMESPACE}
    if selector == {"matchExpressions": [{"key": IGW_MODE, "operator": "Exists"}]}:
        return {CHART_EPP}
    if selector == {"matchExpressions": [{"key": ROUTER_PROXY, "operator": "Exists"}]}:
        return {CHART_PROXY}
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


@pytest.mark.parametrize("tree", [BASE, Composition(BASE, MONITORING)], ids=tree_id)
def test_base_policies(tree):
    """Base: the server's port from any pod of the namespace (and, with the monitoring component,
    from Prometheus' namespace); the NIXL side channel and UCX's ports of each pool only from the
    other pool; nothing else."""
    docs = render(tree)
    http, nixl = _server_port(docs, DECODE), _nixl_port(docs, DECODE)
    assert (http, nixl) == (_server_port(docs, PREFILL), _nixl_port(docs, PREFILL)) == (8000, 5600)
    got = table(docs, {DECODE: [http, nixl, 8200, *UCX_PROBES], PREFILL: [http, nixl, *UCX_PROBES]})
    web = sorted([NAMESPACE, PROMETHEUS] if isinstance(tree, Composition) else [NAMESPACE])
    assert got == {
        DECODE: {http: web, nixl: [PREFILL], 8200: [], UCX_LOW - 1: [], UCX_LOW: [PREFILL], UCX_HIGH: [PREFILL], UCX_HIGH + 1: []},
        PREFILL: {http: web, nixl: [DECODE], UCX_LOW - 1: [], UCX_LOW: [DECODE], UCX_HIGH: [DECODE], UCX_HIGH + 1: []},
    }


def test_llm_d_policies():
    """llm-d: port 8000 (the routing sidecar on decode pods) only from llm-d's routers: gateway
    proxies in any namespace, the EPP of llm-d's router charts (and the standalone router in it or
    beside it) and this overlay's EPP; decode-server's own port on decode pods (8200) only from
    Prometheus in llm-d's monitoring namespace (the sidecar reaches it over localhost); prefill
    pods' 8000 also from decode pods (the sidecar's prefill leg); NIXL and UCX only between the
    pools; the EPP's ext-proc from the gateway, its metrics from Prometheus."""
    docs = render(LLM_D)
    decode_http = _server_port(docs, DECODE)
    assert decode_http == 8200 and _server_port(docs, PREFILL) == 8000
    epp_ports = port_numbers(named(docs, "Deployment", EPP))
    got = table(docs, {
        DECODE: [8000, decode_http, 5600, UCX_LOW, UCX_HIGH + 1],
        PREFILL: [8000, 5600, UCX_HIGH, UCX_HIGH + 1],
        EPP: [epp_ports["grpc"], epp_ports["metrics"], epp_ports["grpc-health"]],
    })
    routers = [GATEWAY, CHART_EPP, CHART_PROXY, EPP]
    assert got == {
        DECODE: {8000: sorted(routers), decode_http: [LLM_D_PROMETHEUS], 5600: [PREFILL], UCX_LOW: [PREFILL], UCX_HIGH + 1: []},
        PREFILL: {8000: sorted([*routers, LLM_D_PROMETHEUS, DECODE]), 5600: [DECODE], UCX_HIGH: [DECODE], UCX_HIGH + 1: []},
        EPP: {epp_ports["grpc"]: [GATEWAY], epp_ports["metrics"]: [LLM_D_PROMETHEUS], epp_ports["grpc-health"]: []},
    }


@pytest.mark.parametrize("tree", [CPU_DEMO, Composition(CPU_DEMO, MONITORING)], ids=tree_id)
def test_cpu_demo_policies(tree):
    """The demo's one pod: HTTP from the namespace (and Prometheus with the opt-in monitoring
    component); no KV transfer, so no NIXL rule."""
    docs = render(tree)
    http = _server_port(docs, DECODE)
    web = sorted([NAMESPACE, PROMETHEUS] if isinstance(tree, Composition) else [NAMESPACE])
    assert table(docs, {DECODE: [http, 5600, UCX_LOW]}) == {DECODE: {http: web, 5600: [], UCX_LOW: []}}


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
    docs = json.loads(json.dumps(render(Composition(BASE, MONITORING))))
    deployments = of_kind(docs, "Deployment")
    with pytest.raises(AssertionError, match="selects no pod"):
        peer_name({"podSelector": {"matchLabels": {"app.kubernetes.io/component": "decoder"}}}, deployments)
    metrics = named(docs, "NetworkPolicy", "decode-server-metrics")
    metrics["spec"]["ingress"] = []
    assert sources(docs, named(docs, "Deployment", DECODE), 8000) == {NAMESPACE}
    kv = named(docs, "NetworkPolicy", "decode-server-decode-kv-transfer")
    kv["spec"]["ingress"][0]["ports"] = None
    assert sources(docs, named(docs, "Deployment", DECODE), 8000) == {NAMESPACE, PREFILL}


# ---------------------------------------------------------------- concrete pods against the llm-d policies

POOL_NS = "llm"  # the namespace the pools are built into (tests/support/deploy_render.py's compositions use others)


def admits(docs: list[dict], target: dict, port: int, source: dict, source_ns: str, ns_labels: dict | None = None) -> bool:
    """Whether a pod with labels `source` in namespace `source_ns` may open `port` on the target's
    pods (the pools in POOL_NS), as Kubernetes evaluates Ingress NetworkPolicies: a podSelector alone
    is the policy's namespace; a namespaceSelector alone every pod of the namespaces it selects; both
    in one peer, pods of those namespaces with those labels."""
    ns_labels = {"kubernetes.io/metadata.name": source_ns, **(ns_labels or {})}
    policies = [p for p in of_kind(docs, "NetworkPolicy") if matches(p["spec"]["podSelector"], pod_labels(target))]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if not port_allowed(rule.get("ports"), port, target):
                continue
            for peer in rule.get("from") or [{"namespaceSelector": {}}]:
                if "ipBlock" in peer:
                    continue
                in_ns = matches(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer else source_ns == POOL_NS
                if in_ns and matches(peer.get("podSelector", {}), source):
                    return True
    return False


# Pod labels as llm-d-router's charts render them for a release "qwen" (routerlib _helpers.tpl:
# selectorLabels + modeLabels on the EPP's pod template; labels + proxySelectorLabels on the
# service-mode proxy's), and a Gateway's proxy pod (GEP-1762).
CHART_PODS = {
    "llm-d-router-gateway EPP": {"llm-d-router-gateway": "qwen-epp", "llm-d.ai/igw-mode": "llm-d-router-gateway"},
    "llm-d-router-standalone EPP (proxy in the pod)": {"llm-d-router-standalone": "qwen-epp", "llm-d.ai/igw-mode": "llm-d-router-standalone"},
    "standalone proxy, service mode": {"app.kubernetes.io/name": "qwen-epp", "app.kubernetes.io/version": "v0.10.0", "llm-d-router-proxy": "qwen-proxy"},
}
GATEWAY_POD = {GATEWAY_LABEL: "inference-gateway", "app.kubernetes.io/name": "inference-gateway-istio"}


@pytest.mark.parametrize("who", sorted(CHART_PODS))
def test_llm_d_admits_the_router_charts_pods(who):
    docs = render(LLM_D)
    for pool in (DECODE, PREFILL):
        target = named(docs, "Deployment", pool)
        assert admits(docs, target, 8000, CHART_PODS[who], POOL_NS), (who, pool)
        # The same pod in another namespace is not this pool's router.
        assert not admits(docs, target, 8000, CHART_PODS[who], "elsewhere"), (who, pool)
    # decode-server's own port behind the sidecar stays closed to it.
    assert not admits(docs, named(docs, "Deployment", DECODE), 8200, CHART_PODS[who], POOL_NS)


def test_llm_d_admits_a_gateway_in_another_namespace_and_refuses_other_pods():
    docs = render(LLM_D)
    decode, epp = named(docs, "Deployment", DECODE), named(docs, "Deployment", EPP)
    for ns in (POOL_NS, "gateway-system"):
        assert admits(docs, decode, 8000, GATEWAY_POD, ns), ns
        assert admits(docs, epp, port_numbers(epp)["grpc"], GATEWAY_POD, ns), ns
    for stranger, ns in [({"app": "client"}, POOL_NS), ({"app": "client"}, "gateway-system"), ({}, "llm-d-monitoring")]:
        assert not admits(docs, decode, 8000, stranger, ns), (stranger, ns)
    # Prometheus scrapes from llm-d's monitoring namespace.
    assert admits(docs, decode, 8200, {"app.kubernetes.io/name": "prometheus"}, "llm-d-monitoring")
    assert not admits(docs, decode, 8200, {"app.kubernetes.io/name": "prometheus"}, "monitoring")


def test_gke_proxy_only_subnet_component():
    """The opt-in component admits port 8000 from the proxy-only subnet set as the parameter, and the
    default is no CIDR at all (the API server refuses it until set, instead of admitting a guess)."""
    docs = render(Composition(LLM_D, DEPLOY / "components" / "gke-proxy-only-subnet"))
    policy = named(docs, "NetworkPolicy", "decode-server-gke-proxy-only-subnet")
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "set-your-proxy-only-subnet-cidr"}}] and rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
