"""What every benchmark entry point shares: the demo model, the event loop, machine facts.

Imported by bench.run, bench.bindsweep and bench.profile (none of which import each other).
"""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import systems

DEFAULT_BIND = "auto"  # measured fastest for one instance on this 2-core machine: see bench/README.md
MODEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "decode-server" / "bench-demo-model"


def arun(coro):
    """Run the load generator on uvloop when available (less client CPU on a shared 2-core box)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def ensure_model() -> Path:
    """The demo model, built once with `decode-server demo-model DIR`."""
    if not (MODEL_CACHE / "config.json").exists():
        MODEL_CACHE.parent.mkdir(parents=True, exist_ok=True)
        subprocess.check_call([sys.executable, "-m", "decode_server.process.cli", "demo-model", str(MODEL_CACHE)], cwd=systems.repo_root())
    return MODEL_CACHE


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_info() -> dict[str, Any]:
    import psutil

    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception:
        vllm_version = "unknown"
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=systems.repo_root(), text=True).strip()
    except Exception:
        commit = None
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "python": platform.python_version(),
        "vllm": vllm_version,
        "git_commit": commit,
    }
