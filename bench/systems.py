"""Systems under test as loopback subprocesses, all on the same engine configuration.

- ours: `python -m decode_server.process.cli serve DIR ...` with the qwen3/hermes parsers;
- vllm: `python -m vllm.entrypoints.openai.api_server --model DIR --enable-scale-out ...`
  with the same parser flags (it serves generate, coupled chat and /render);
- inproc: `python -m bench.inproc --bench-serve` (AsyncLLM in-process, no HTTP), same engine
  flags, kept up as an `InprocWorker` that takes one scenario at a time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPLAY = "decode_server.tools.replay:ReplayLogitsProcessor"
SERVE_MODULE = "decode_server.process.cli"
MODEL_NAME = "demo"
MODEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "decode-server" / "bench-demo-model"


def engine_flags() -> list[str]:
    """The engine configuration every system gets (so every system produces the same tokens).

    All three engines are up at once: a 512 MiB KV cache each (this 2-layer model's cache is 2 layers
    x K+V x 1 KV head x 64 x 4 bytes = 1 KiB/token in float32, so ~0.5M tokens: 10x what 64 x 790
    tokens need, 16x the 4 x 8024 of the 8k-prompt cell) keeps three engines well inside a 24 GiB machine.

    float32, not the model's bfloat16: on a CPU without native bf16 (this machine's AVX2-only EPYC)
    vLLM's CPU engine steps bf16 about 7x slower (32 sequences x 128 tokens, `LLM.generate`: 137
    against 907 tok/s), and the engine, not the frontends, would then be nearly all of every run."""
    return [
        "--load-format", "dummy",
        "--served-model-name", MODEL_NAME,
        "--max-model-len", "10240",
        "--max-num-seqs", "64",
        "--kv-cache-memory-bytes", str(512 * 1024**2),
        "--logits-processors", REPLAY,
        "--seed", "0",
        "--dtype", "float32",
        "--reasoning-parser", "qwen3",
    ]  # fmt: skip


TOOL_FLAGS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def child_env(bind: str) -> dict[str, str]:
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": bind}
    # The engine core is a spawned process: it must find the replay processor and bench.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p)
    return env


class Server:
    def __init__(self, name: str, argv: list[str], log_path: Path, bind: str):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*argv, "--port", str(self.port)]
        self.log_path = log_path
        self.env = child_env(bind)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 420) -> Server:
        self.launch()
        return self.wait_healthy(timeout_s)

    def launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self._t0 = time.monotonic()
        # Deliberately *not* start_new_session: with the kernel's CFS autogroups (enabled here), a
        # new session is a new scheduling group, and the server tree (frontend + two spinning
        # engine processes) then gets bursty, multi-second-late token delivery whenever other
        # sessions load the machine. Same session as the load generator = one group for the test.
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, cwd=repo_root()
        )

    def wait_healthy(self, timeout_s: float = 420) -> Server:
        assert self.proc is not None
        t0 = self._t0
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2, trust_env=False).status_code == 200:
                    self.startup_s = round(time.monotonic() - t0, 1)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not become healthy in {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 60) -> None:
        if self.proc is None:
            return
        stop_tree(self.proc, timeout_s)
        self._log.close()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_tree(proc: subprocess.Popen, timeout_s: float = 60, children: list[psutil.Process] | None = None) -> None:
    """SIGTERM (then SIGKILL) a process we started, then kill its leftover children (by pid)."""
    children = _children(proc.pid) if children is None else children
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    # Engine children of a killed server must not linger on a 2-core machine (ours, by pid).
    _, alive = psutil.wait_procs(children, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def ours(model_dir: Path, log_dir: Path, bind: str, flags: list[str]) -> Server:
    argv = [
        sys.executable, "-m", SERVE_MODULE, "serve", str(model_dir),
        "--host", "127.0.0.1", "--drain-timeout", "5", *flags, *TOOL_FLAGS,
    ]  # fmt: skip
    return Server("ours", argv, log_dir / "ours.log", bind)


def vllms_own(model_dir: Path, log_dir: Path, bind: str, flags: list[str]) -> Server:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--enable-scale-out", *flags, *TOOL_FLAGS,
    ]  # fmt: skip
    return Server("vllm", argv, log_dir / "vllm.log", bind)


def ensure_model() -> Path:
    """The demo model, built once with `decode-server demo-model DIR`."""
    if not (MODEL_CACHE / "config.json").exists():
        MODEL_CACHE.parent.mkdir(parents=True, exist_ok=True)
        subprocess.check_call([sys.executable, "-m", SERVE_MODULE, "demo-model", str(MODEL_CACHE)], cwd=repo_root())
    return MODEL_CACHE


class InprocWorker:
    """`bench.inproc --bench-serve`: the in-process floor, kept up between scenarios.

    Scenarios go to its stdin one JSON line each; each result comes back as WORK/<name>.json.
    """

    def __init__(self, model_dir: Path, log_dir: Path, bind: str, flags: list[str], workload: Path, work: Path):
        self.name = "inproc"
        self.work = work
        self.argv = [
            sys.executable, "-m", "bench.inproc", "--bench-workload", str(workload), "--bench-serve", str(work),
            "--model", str(model_dir), *flags,
        ]  # fmt: skip
        self.log_path = log_dir / "inproc.log"
        self.env = child_env(bind)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, timeout_s: float = 420) -> InprocWorker:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "ready").unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=repo_root()
        )
        self._wait_for(self.work / "ready", timeout_s, "warm-up")
        self.startup_s = round(time.monotonic() - t0, 1)
        return self

    def _wait_for(self, path: Path, timeout_s: float, what: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"inproc exited with {self.proc.returncode} during {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"inproc: no {what} result in {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def run(self, scenario: dict, timeout_s: float) -> dict:
        """Run one scenario (a dict with name, length, concurrency, requests, batch, time_limit_s, ...)."""
        assert self.proc is not None and self.proc.stdin is not None
        result = self.work / f"{scenario['name']}.json"
        result.unlink(missing_ok=True)
        self.proc.stdin.write((json.dumps(scenario) + "\n").encode())
        self.proc.stdin.flush()
        self._wait_for(result, timeout_s, scenario["name"])
        return json.loads(result.read_text())

    def stop(self, timeout_s: float = 60) -> None:
        if self.proc is None:
            return
        children = _children(self.proc.pid)
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # EOF: the worker shuts AsyncLLM down and exits
            self.proc.wait(timeout_s)
        except (subprocess.TimeoutExpired, OSError):
            pass
        stop_tree(self.proc, 10, children)
        self._log.close()
