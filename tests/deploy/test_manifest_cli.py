"""The manifests against the server itself: every pod's argv parses with decode-server's CLI, and
the routes the probes and scrapes name are served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.deploy_render import (
    COMPOSITIONS, KUSTOMIZATIONS, Composition, kustomize_cmd, render, tree_id,
)
from tests.support.manifests import (
    SHUTDOWN_TIMEOUT_FLAG, expand, flag_value, server_container, server_deployments,
)

# ---------------------------------------------------------------- against the server itself


@pytest.fixture(scope="module")
def serve_parser():
    from decode_server.process.cli import build_parser

    return build_parser()


def _all_server_deployments():
    out = []
    for directory in [*KUSTOMIZATIONS, *COMPOSITIONS]:
        if kustomize_cmd() is None:
            continue
        out += [(directory, d) for d in server_deployments(render(directory))]
    return out


@pytest.mark.parametrize(
    "directory,deployment",
    _all_server_deployments(),
    ids=lambda v: tree_id(v) if isinstance(v, (Path, Composition)) else v["metadata"]["name"],
)
def test_server_cli_accepts_the_manifest_args(serve_parser, directory, deployment):
    """The argv each pod runs parses with decode-server's own CLI (vLLM engine flags included)."""
    argv = expand(server_container(deployment))
    assert argv[0] == "decode-server"
    try:
        args = serve_parser.parse_args(argv[1:])
    except SystemExit as e:  # argparse reports on stderr and exits 2
        pytest.fail(f"decode-server rejects {argv[1:]} (exit {e.code}); see captured stderr")
    assert args.command == "serve"
    assert args.host == "0.0.0.0" and args.port == int(flag_value(argv, "--port"))
    assert args.shutdown_timeout == int(flag_value(argv, SHUTDOWN_TIMEOUT_FLAG))
    if "--kv-transfer-config" in argv:
        kv = json.loads(flag_value(argv, "--kv-transfer-config"))
        assert args.kv_transfer_config.kv_connector == "NixlConnector"
        assert args.kv_transfer_config.kv_role == kv["kv_role"]
        if args.tokens_only:
            assert kv["kv_role"] == "kv_producer"
    if "--otlp-traces-endpoint" in argv:  # the tracing component: vLLM's engine tracing, and the server span
        assert args.otlp_traces_endpoint == flag_value(argv, "--otlp-traces-endpoint")


def test_server_serves_the_probed_and_scraped_routes():
    """/ready and /health (the probes) and /metrics (the PodMonitor, the EPP) are routes of the app."""
    from decode_server.http.app import build_app

    try:
        from decode_server.config import ServerConfig
    except ImportError:  # older layout
        from decode_server.generate.service import ServerConfig

    # Built, not started: the engine factory and the lifecycle are only used by the lifespan.
    app = build_app(lambda: None, ServerConfig(served_model_names=("probe",)), None)
    paths = {getattr(r, "path", None) for r in app.routes}
    assert {"/ready", "/health", "/metrics"} <= paths
