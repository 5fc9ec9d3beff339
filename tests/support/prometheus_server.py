"""A real Prometheus (Debian's `prometheus` package) for tests: scrapes one target every second with
the labels the base PodMonitor gives a decode pod, evaluates the PrometheusRule's groups every
second with their `for` cut to 0 (a test cannot wait minutes; the expression, labels and
annotations are Prometheus' own evaluation), and answers queries through its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.observability_queries import rule_groups
from tests.support.servers import free_port

# What the base PodMonitor's relabelings give a decode pod's series (tests/deploy/test_observability.py checks them there).
TARGET = {"namespace": "ns", "pod": "decode-server-decode-0", "pool": "decode", "container": "decode-server", "endpoint": "http"}


def prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus not found: Debian's prometheus package (apt-get install -y prometheus); `./dev setup test` installs it")
    return path


class Prometheus:
    def __init__(self, directory: Path, target: str):
        rules = {"groups": [{**g, "rules": [{k: v for k, v in r.items() if k != "for"} for r in g["rules"]]} for g in rule_groups()]}
        (directory / "rules.yml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(directory / "rules.yml")],
            "scrape_configs": [{"job_name": "decode-server", "static_configs": [{"targets": [target], "labels": TARGET}]}],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(directory / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [prometheus(), f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.until(lambda: httpx.get(self.url + "/-/ready", timeout=2).status_code == 200, "ready")

    def until(self, check: Any, what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, f"prometheus exited:\n{Path(self.log.name).read_text()[-3000:]}"
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"prometheus: not {what} in {timeout_s} s"
            time.sleep(0.5)

    def query(self, promql: str) -> list[dict]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=10).json()
        assert r["status"] == "success", (promql, r)
        return r["data"]["result"]

    def firing(self) -> dict[str, dict]:
        alerts = httpx.get(self.url + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
