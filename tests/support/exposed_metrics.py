"""The series decode-server's /metrics exposes: names, label names, and the label values created up
front. Ours come from a `Metrics` registry. vLLM's come from vLLM's own Prometheus stat logger,
built for the demo model with the NixlConnector (so the KV-transfer series exist), in a fresh
process (`python -m tests.support.exposed_metrics` prints them as JSON), since vLLM registers into
prometheus_client's global registry; that registry also holds the process_* and python_* series
the server renders beside vLLM's.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

# The sample names each metric type exposes (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def families(registry: Any) -> dict[str, dict]:
    """Family name -> {"type", "labels": label names, "values": {label: values seen}}."""
    declared = {
        c._name: tuple(c._labelnames)  # a labelled metric with no child yet has no samples to read them from
        for c in list(registry._collector_to_names)
        if hasattr(c, "_name") and hasattr(c, "_labelnames")
    }
    out = {}
    for family in registry.collect():
        labels, values = set(declared.get(family.name, ())), {}
        for sample in family.samples:
            for key, value in sample.labels.items():
                if key not in ("le", "quantile"):
                    labels.add(key)
                    values.setdefault(key, set()).add(value)
        out[family.name] = {"type": family.type, "labels": sorted(labels), "values": {k: sorted(v) for k, v in values.items()}}
    return out


def series(fams: dict[str, dict]) -> dict[str, dict]:
    """Sample name -> {"labels": set of label names, "values": {label: set}}, per family type."""
    out = {}
    for name, family in fams.items():
        for suffix in SUFFIXES[family["type"]]:
            labels = set(family["labels"])
            if suffix == "_bucket":
                labels.add("le")
            if family["type"] == "summary" and suffix == "":
                labels.add("quantile")
            out[name + suffix] = {"labels": labels, "values": {k: set(v) for k, v in family["values"].items()}}
    return out


def ours() -> dict[str, dict]:
    from decode_server.runtime.metrics import Metrics

    return families(Metrics("m").registry)


def vllms() -> dict[str, dict]:
    import prometheus_client
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    from decode_server.tools.demo_model import build_demo_model

    with tempfile.TemporaryDirectory(prefix="decode-server-metrics-") as tmp:
        model = build_demo_model(Path(tmp) / "demo")
        kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        config = AsyncEngineArgs(model=str(model), load_format="dummy", kv_transfer_config=kv).create_engine_config()
        PrometheusStatLogger(config, [0])
    return families(prometheus_client.REGISTRY)


if __name__ == "__main__":
    print(json.dumps(vllms()))
