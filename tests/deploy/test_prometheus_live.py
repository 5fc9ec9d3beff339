"""A real Prometheus (Debian's `prometheus`) scrapes a running server every second, with the labels
the base PodMonitor gives a decode pod, and evaluates the PrometheusRule's groups; the server takes
a short load and then the faults the alerts are for. Every dashboard panel's and variable's query,
through Prometheus' HTTP API, returns data, and each alert whose fault is injected fires (its `for`
cut to 0 here: the expression, the labels and the annotations are Prometheus' own evaluation).

The server is the in-process tier on a real socket (tests/support/loopback.py: the real app and uvicorn
over the scripted engine, vLLM's own stat loggers behind /metrics, the NixlConnector configured
so its series exist): the faults are the scripted engine's (a failed KV load, a stalled one, the
engine core's death). Which expressions cannot have data here is listed below, with why.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from decode_server.errors import ENGINE_DEAD
from protocol.generate import FINGERPRINT_HEADER
from tests.support.inprocess import body_for, error_of
from tests.support.loopback import loopback
from tests.support.observability_queries import dashboard_queries, load_dashboard, rule_groups
from tests.support.prometheus_server import Prometheus, prometheus
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE

NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
DECODE_LEG = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p0", "remote_host": "10.0.0.9",
              "remote_port": 5600, "remote_block_ids": [1]}
# Alerts whose fault this server cannot show, and why. The rest must fire.
NOT_FIRED_HERE = {
    "DecodeServerEngineDied": "two new process start times on the same pod: needs the process restarted (one process here)",
    "DecodeServerDrainAborts": "the drain's deadline aborting requests: test_drain.py and tests/engine/test_scale_out.py cut a drain with real engines",
    "DecodeServerQueueSaturated": "vLLM's scheduler waiting for capacity: the scripted engine has no capacity limit",
    "DecodeServerKVCacheFull": "a KV cache over 95 % full: the scripted engine has no KV cache",
    "DecodeServerDrainOverran": "kube-state-metrics' pod deletion timestamp: no Kubernetes here",
    # kube-state-metrics' and cAdvisor's series (no Kubernetes here); their promtool scenarios in
    # tests/deploy/test_alert_rules.py are what checks them.
    "DecodeServerCrashLooping": "kube-state-metrics' container restarts and waiting reason: no Kubernetes here",
    "DecodeServerPodsPending": "kube-state-metrics' pod phase: no Kubernetes here",
    "DecodeServerPoolUnavailable": "kube-state-metrics' Deployment replicas: no Kubernetes here",
    "DecodeServerMemoryNearLimit": "cAdvisor's working set and kube-state-metrics' limits: no Kubernetes here",
    "DecodeServerEPPDown": "llm-d's EPP: none runs here",
    "DecodeServerAutoscalerMaxedOut": "kube-state-metrics' HPA replicas: no Kubernetes here",
    "DecodeServerAutoscalerFailing": "kube-state-metrics' HPA conditions: no Kubernetes here",
    "DecodeServerTTFTSLO": "5% of first tokens after 2.5 s: the scripted engine answers at once, and a held request that long "
                           "would be most of this short run's requests",
    "DecodeServerITLSLO": "5% of inter-token gaps over 100 ms: the scripted engine emits tokens without delay",
}
BAD_REQUESTS = 60  # a rejection rate over 0.1/s on a 5 minute window


def _load(srv) -> None:
    """Every output mode, a client that goes away, a decode leg."""
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for i, mode in enumerate(["tokens", "text", "derender"] * 3):
            with client.stream("POST", GENERATE, json={**body_for(mode, [9707] * 8, request_id=f"load-{i}"), "stream": True}) as r:
                assert r.status_code == 200
                r.read()
        gone = srv.call(srv.core.hold, "gone", 1)
        with client.stream("POST", GENERATE, json={**body_for("tokens", [9707] * 4, request_id="gone"), "stream": True}):
            srv.wait(gone.reached())  # the client goes away mid-stream: an abort (client_disconnect)
        srv.call(gone.release)
        assert client.post(GENERATE, json=_leg("leg-ok")).status_code == 200


def _leg(request_id: str) -> dict[str, Any]:
    return body_for("tokens", [9707, 11], request_id=request_id, kv_transfer_params=DECODE_LEG)


def _faults(srv, round_: int) -> None:
    """Failed and stalled KV loads (502, 504), a flood of bad requests (400), drifted fingerprints
    (409). Sent in rounds a few scrapes apart, as a fault persists: a counter's first sample is
    its start, so only what comes after it is a rate."""
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for i in range(3):
            srv.call(srv.core.fail, f"leg-failed-{round_}-{i}", 0)
            assert error_of(client.post(GENERATE, json=_leg(f"leg-failed-{round_}-{i}")))[0] == 502
        gate = srv.call(srv.core.hold, f"leg-stalled-{round_}")
        assert error_of(client.post(GENERATE, json=_leg(f"leg-stalled-{round_}")))[0] == 504
        srv.call(gate.release)
        for _ in range(BAD_REQUESTS // 2):
            assert client.post(GENERATE, content=b"{not json").status_code == 400
        drifted = client.post(GENERATE, json=body_for("tokens", [9707]), headers={FINGERPRINT_HEADER: "0" * 16})
        assert error_of(drifted)[0] == 409


def test_a_real_prometheus_gets_data_for_every_panel_and_fires_each_alert_on_its_fault(demo_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S", "0.5")
    prometheus()  # missing: a failure that says how to install it, before the server starts
    with loopback(demo_model, *PARSER_FLAGS, "--kv-transfer-config", NIXL) as srv:
        prom = Prometheus(tmp_path, srv.url.removeprefix("http://"))
        try:
            prom.until(lambda: prom.query('up{job="decode-server"} == 1'), "scraping the server")
            _load(srv)
            for round_ in range(2):
                _faults(srv, round_)
                time.sleep(2.5)
            gate = srv.call(srv.core.hold, "open", 2)
            open_stream = httpx.Client(base_url=srv.url, timeout=60)
            pending = open_stream.build_request("POST", GENERATE, json={**body_for("text", [9707] * 4, request_id="open"), "stream": True})
            response = open_stream.send(pending, stream=True)
            srv.wait(gate.reached())
            time.sleep(4)  # a few scrapes after the load: every rate has two samples

            queries = dashboard_queries(load_dashboard())
            empty = [q for q in queries if not prom.query(q.promql)]
            assert not empty, "dashboard queries with no data:\n" + "\n".join(f"{q.where}: {q.promql}" for q in empty)

            srv.call(gate.release)
            response.close()
            open_stream.close()
            every = {r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r}
            expected = every - set(NOT_FIRED_HERE) - {"DecodeServerPoolDown"}
            prom.until(lambda: expected <= set(prom.firing()), f"firing {sorted(expected)} (firing: {sorted(prom.firing())})")
            firing = prom.firing()
            assert firing["DecodeServerRejectionSpike"]["labels"]["reason"] == "invalid_json"
            assert all(firing[a]["labels"].get("pool") == "decode" or "pod" in firing[a]["labels"] for a in expected)
            assert all(firing[a]["annotations"]["runbook"] for a in expected)
            # The engine killed: new requests get 503, then the server exits: its pool has no pod answering.
            srv.call(srv.core.die)
            assert error_of(httpx.post(srv.url + GENERATE, json=body_for("tokens", [9707]), timeout=10)) == (503, ENGINE_DEAD, None)
        except BaseException:
            prom.close()
            raise
    try:
        prom.until(lambda: "DecodeServerPoolDown" in prom.firing(), "firing DecodeServerPoolDown")
        assert prom.firing()["DecodeServerPoolDown"]["labels"]["pool"] == "decode"
        assert not set(NOT_FIRED_HERE) & set(prom.firing()), "an alert fired without its fault"
    finally:
        prom.close()
