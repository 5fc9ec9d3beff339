"""CPU accounting around a scenario (psutil), machine-contention checks, and /metrics scraping.

Frontend CPU is the user+system time of the API-server process(es) only (all their
threads), not of their children (vLLM's EngineCore and CPU worker processes, and
the multiprocessing resource tracker). The engine's CPU (the children) and the
machine's "foreign" CPU (busy time of every process that is neither the server
under test nor this benchmark process) are recorded next to it for context.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import httpx
import psutil

_GEN_TOKENS = re.compile(r"^vllm:generation_tokens_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def proc_cpu_s(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def machine_busy_s() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


@dataclass
class Snapshot:
    at: float
    frontend: float
    engine: float
    bench: float
    machine: float
    loadavg1: float


class CpuMeter:
    """Snapshots of the server's frontend / engine CPU, this process's CPU and the machine's busy time."""

    def __init__(self, frontend_pid: int | list[int] | None):
        pids = [] if not frontend_pid else [frontend_pid] if isinstance(frontend_pid, int) else list(frontend_pid)
        self.frontends = [psutil.Process(pid) for pid in pids]
        self.me = psutil.Process(os.getpid())

    def _engine_procs(self) -> list[psutil.Process]:
        procs: list[psutil.Process] = []
        for f in self.frontends:
            try:
                procs += f.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        return procs

    def snapshot(self) -> Snapshot:
        return Snapshot(
            at=time.perf_counter(),
            frontend=sum(proc_cpu_s(f) for f in self.frontends),
            engine=sum(proc_cpu_s(p) for p in self._engine_procs()),
            bench=proc_cpu_s(self.me),
            machine=machine_busy_s(),
            loadavg1=os.getloadavg()[0],
        )

    @staticmethod
    def delta(a: Snapshot, b: Snapshot) -> dict[str, float]:
        wall = b.at - a.at
        ours = (b.frontend - a.frontend) + (b.engine - a.engine) + (b.bench - a.bench)
        foreign = max(0.0, (b.machine - a.machine) - ours)
        return {
            "wall_s": round(wall, 3),
            "frontend_cpu_s": round(b.frontend - a.frontend, 4),
            "engine_cpu_s": round(b.engine - a.engine, 4),
            "bench_client_cpu_s": round(b.bench - a.bench, 4),
            "foreign_cpu_s": round(foreign, 3),
            "foreign_cores": round(foreign / wall, 3) if wall > 0 else None,
            "loadavg1_before": round(a.loadavg1, 2),
            "loadavg1_after": round(b.loadavg1, 2),
        }


def foreign_cores(meter: CpuMeter, window_s: float = 2.0) -> float:
    """How many cores other processes kept busy over a short window."""
    a = meter.snapshot()
    time.sleep(window_s)
    d = CpuMeter.delta(a, meter.snapshot())
    return d["foreign_cores"] or 0.0


def wait_quiet(meter: CpuMeter, max_wait_s: float, threshold_cores: float = 0.35) -> dict[str, float]:
    """Wait (bounded) until other processes use < threshold cores; returns what was seen."""
    start = time.monotonic()
    seen = foreign_cores(meter, 1.5)
    while seen >= threshold_cores and time.monotonic() - start < max_wait_s:
        seen = foreign_cores(meter, 2.0)
    return {"waited_s": round(time.monotonic() - start, 1), "foreign_cores_at_start": round(seen, 3)}


def scrape(base_url: str) -> dict[str, float]:
    """What a run reads of a server's /metrics: vLLM's own `vllm:generation_tokens_total` (summed
    over engines) as `generation_tokens`, and ours' stream counters (`decode_server_stream_*_total`:
    the one-pass consumer's passes, the writers it woke, the writes) as `passes`, `wakeups`,
    `writes`; a series the server does not have is absent."""
    try:
        r = httpx.get(base_url + "/metrics", timeout=10, trust_env=False)
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:
        return {}
    out = {}
    for name, pattern in (("generation_tokens", _GEN_TOKENS), *_STREAM_COUNTERS):
        values = [float(m) for m in pattern.findall(r.text)]
        if values:
            out[name] = sum(values)
    return out


def _series(name: str) -> re.Pattern:
    return re.compile(rf"^{name}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)\s*$", re.M)


_STREAM_COUNTERS = tuple((k, _series(f"decode_server_stream_{k}_total")) for k in ("passes", "wakeups", "writes"))


def server_counters(before: dict[str, float], after: dict[str, float], tokens: int) -> dict[str, float | None] | None:
    """Ours' stream counters over a run (issue #30): wake-ups per engine step (per pass of the
    one-pass consumer) and writes per output token. None for a server without them (vLLM's)."""
    if "writes" not in after:
        return None
    delta = {k: after[k] - before.get(k, 0.0) for k, _ in _STREAM_COUNTERS if k in after}
    passes, wakeups, writes = delta.get("passes"), delta.get("wakeups"), delta.get("writes")
    return {
        **delta,
        "wakeups_per_step": round(wakeups / passes, 3) if passes else None,
        "writes_per_token": round(writes / tokens, 4) if tokens and writes is not None else None,
    }


def tree_rss_gib(pid: int) -> float | None:
    """Resident memory of a process and all its children (GiB; shared pages counted per process)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return round(total / 1024**3, 2)


def available_gib() -> float:
    return round(psutil.virtual_memory().available / 1024**3, 2)
