"""The vLLM 0.33 tier as a background process: tests/vllm033 in its own pytest session with 0.33's
pure-Python modules first on the path (a process imports one vLLM; tests/vllm_wheel.py has them).

It is one single-threaded process of 2-3 minutes that shares nothing with the main session, so
conftest starts it once collection selects tests/test_vllm033.py and it runs on the second core
beside the rest of the suite; that test waits for its verdict, and a session that ends first (`-x`,
Ctrl+C) stops it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests import vllm_wheel

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1200


class Tier:
    def __init__(self) -> None:
        self._done = threading.Event()
        self._failure = ""
        self._proc: subprocess.Popen | None = None
        self._stopped = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="vllm033-tier", daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def failure(self) -> str:
        """Waits for the tier: why it failed, or "" when it passed."""
        if not self._done.wait(TIMEOUT_S + 600):
            return f"tests/vllm033 gave no verdict in {TIMEOUT_S + 600} s"
        return self._failure

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def _run(self) -> None:
        try:
            self._failure = self._verdict()
        except Exception as e:  # the waiting test reports it, whatever it was
            self._failure = f"the vLLM {vllm_wheel.VERSION} tier could not run: {e!r}"
        finally:
            self._done.set()

    def _verdict(self) -> str:
        try:
            paths = vllm_wheel.ensure()
        except vllm_wheel.WheelUnavailable as e:
            return f"vLLM {vllm_wheel.VERSION}'s wheel is needed for this tier: {e}"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]),
            "VLLM_TARGET_DEVICE": "cpu",
            # vLLM keys its model-class cache by class name, not version: a cache shared with 0.32 is
            # stale for each line in turn, and a miss inspects the class in a subprocess (~10 s).
            "VLLM_CACHE_ROOT": str(vllm_wheel.CACHE / "vllm-cache-root"),
        }
        with tempfile.TemporaryFile("w+") as out:
            with self._lock:
                if self._stopped:
                    return "stopped before it ran"
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "pytest", "tests/vllm033", "-q", "-p", "no:cacheprovider"],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                )
            try:
                code = self._proc.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                code = f"killed after {TIMEOUT_S} s"
            out.seek(0)
            output = out.read()
        if code:
            return f"tests/vllm033 on vLLM {vllm_wheel.VERSION} failed ({code}):\n{output[-15000:]}"
        return ""


_tier: Tier | None = None


def start() -> Tier:
    """The tier, started once per session."""
    global _tier
    if _tier is None:
        _tier = Tier()
    return _tier


def running() -> bool:
    """Whether the tier was started this session and has not finished."""
    return _tier is not None and not _tier.done()


def stop() -> None:
    if _tier is not None:
        _tier.stop()
