"""`HistogramTally` (the inter-token samples a stream counts without prometheus_client's locks)
must leave the histogram exactly as the same samples observed one by one would: every bucket, the
count and the sum, in one process and in multiprocess mode (--api-server-count N's files). It reads
prometheus_client's private bucket and sum values, so a prometheus_client that changes them fails
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import prometheus_client
from prometheus_client import CollectorRegistry, Histogram

from decode_server.runtime.metrics import HistogramTally

BUCKETS = (0.001, 0.01, 0.1, 1.0)
# On a bound, between bounds, below the first, above the last (+Inf), zero; with repeat counts.
SAMPLES = [(0.001, 1), (0.0005, 3), (0.05, 2), (0.1, 1), (0.7, 5), (3.0, 2), (0.0, 4)]


def exposition(tallied: bool) -> str:
    registry = CollectorRegistry()
    child = Histogram("itl", "doc", ["mode"], buckets=BUCKETS, registry=registry).labels("tokens")
    if tallied:
        tally = HistogramTally(child)
        for value, n in SAMPLES[:4]:
            tally.observe(value, n)
        tally.flush()  # a flush mid-way, then more samples: nothing counted twice
        for value, n in SAMPLES[4:]:
            tally.observe(value, n)
        tally.flush()
        tally.flush()
    else:
        for value, n in SAMPLES:
            for _ in range(n):
                child.observe(value)
    page = prometheus_client.generate_latest(registry).decode()
    return "\n".join(line for line in page.splitlines() if "_created" not in line)  # when each was made


def test_a_flushed_tally_shows_what_observing_each_sample_shows():
    tallied, observed = exposition(True), exposition(False)
    assert 'itl_bucket{le="0.001",mode="tokens"} 8.0' in observed, observed  # 0.001, 3 × 0.0005, 4 × 0.0
    assert "itl_count{mode=\"tokens\"} 18.0" in observed, observed
    assert tallied == observed


def test_an_unflushed_tally_shows_nothing_yet():
    registry = CollectorRegistry()
    child = Histogram("itl", "doc", buckets=BUCKETS, registry=registry)
    HistogramTally(child).observe(0.5, 3)
    assert registry.get_sample_value("itl_count") == 0.0


def test_in_multiprocess_mode_too(tmp_path):
    # prometheus_client picks its value class (mmap files) at import: a process of its own.
    script = textwrap.dedent(f"""
        import json, prometheus_client
        from prometheus_client import CollectorRegistry, Histogram, multiprocess
        from decode_server.runtime.metrics import HistogramTally
        a = Histogram("a", "doc", buckets={BUCKETS!r})
        b = Histogram("b", "doc", buckets={BUCKETS!r})
        tally = HistogramTally(a)
        for value, n in {SAMPLES!r}:
            tally.observe(value, n)
            for _ in range(n):
                b.observe(value)
        tally.flush()
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)
        page = prometheus_client.generate_latest(merged).decode().splitlines()
        print(json.dumps([[line[1:] for line in page if line.startswith(x)] for x in "ab"]))
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    tallied, observed = json.loads(out)
    assert any(line.startswith('_bucket{le="0.1"} 11.0') for line in observed), observed
    assert tallied == observed
