"""Real servers as subprocesses on loopback: ours (`decode-server serve`) and vLLM's own (the oracle).

Engine start costs ~30 s, so a configuration is started once by the module (or package) fixture of
the tests that use it (`running`), and stopped when they are done.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

REPLAY = "decode_server.tools.replay:ReplayLogitsProcessor"
MODEL_NAME = "demo"


def engine_dtype() -> str:
    """The demo model's bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32.
    Without native bf16 (an AVX2-only EPYC here) vLLM's CPU engine steps bf16 about 7x slower than
    float32 (32 sequences x 128 tokens: 137 against 907 tok/s), and every stream, drain and load
    test waits on those steps; with it, bf16 is the faster (a Xeon with AMX: 1,852 against 1,267).
    Both sides of every comparison get the same dtype."""
    with contextlib.suppress(OSError):
        flags = set(Path("/proc/cpuinfo").read_text().split())
        if flags & {"avx512_bf16", "amx_bf16"}:
            return "bfloat16"
    return "float32"


# Shared by our servers and vLLM's so both produce the same tokens for the same script.
ENGINE_FLAGS = [
    "--load-format", "dummy",
    "--served-model-name", MODEL_NAME,
    "--max-model-len", "4096",
    "--max-num-seqs", "16",
    "--kv-cache-memory-bytes", str(256 * 1024 * 1024),
    "--logits-processors", REPLAY,
    "--seed", "0",
    # No torch.compile: both sides of every comparison here run these flags, and compiling (with its
    # warm-up run) costs each engine start 10-40 s on a 2-core machine.
    "--enforce-eager",
    "--dtype", engine_dtype(),
]
PARSER_FLAGS = ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]


# Ports for servers come from below the kernel's ephemeral range (32768-60999 by default), where
# nothing else here binds: a port the kernel handed out as free is, by the time a server binds it
# (after its engine started, a minute later), as likely to be the kernel's next pick for one of
# the many engines starting beside it (it was, once: "address already in use").
_PORTS_BELOW = 32768
_PORTS_FROM = 20000 + (os.getpid() * 7919) % 8000  # concurrent sessions start in different places
_given: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A port nobody listens on now and that this session has not handed out before."""
    with _ports_lock:
        for offset in range(_PORTS_BELOW - 20000):
            port = 20000 + (_PORTS_FROM - 20000 + offset) % (_PORTS_BELOW - 20000)
            if port in _given:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    continue
            _given.add(port)
            return port
    raise RuntimeError("no free port below the ephemeral range")


# What a server's processes hold once it is up (RSS, measured here): an API process with its engine
# core and worker 2.9 GB, each further API process (--api-server-count) 1.1 GB. A start waits until
# the memory free now, less what the servers still starting will yet take, holds its own and some
# headroom (the test process, the vLLM 0.33 tier): on 24 GiB, engines started all at once beside
# them ran the machine out of memory, and the kernel's reclaim stalled everything for minutes.
ENGINE_GB = 3.0
API_PROCESS_GB = 1.1
HEADROOM_GB = 3.0
MEMORY_WAIT_S = 300  # then it starts anyway (and a start that fails says why)
_starting: list[Server] = []
_memory_lock = threading.Lock()


def _available_gb() -> float:
    return psutil.virtual_memory().available / 2**30


class Server:
    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None, engine: bool = True):
        self.name = name
        self.engine = engine  # False: a process without a vLLM engine (a scripted server, a proxy)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*argv, "--port", str(self.port)]
        self.log_path = log_dir / f"{name}.log"
        # Several engines share 2 cores in a test run: let the OS schedule them
        # (pinning each to the same cores by "auto" slows all of them down).
        self.env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind", **(env or {})}
        # Variables in `env` that hold a port of the server's own (a side channel): picked anew with
        # the server's port when a start finds one taken.
        self.port_env: tuple[str, ...] = ()
        # A session (so, with Linux's autogroup, a CPU scheduling group) of its own; else a process
        # group of its own in the test's session, scheduled beside what else the test runs there.
        self.own_session = True
        self.proc: subprocess.Popen | None = None

    @property
    def footprint_gb(self) -> float:
        if not self.engine:
            return 0.5
        count = self.argv[self.argv.index("--api-server-count") + 1] if "--api-server-count" in self.argv else "1"
        return ENGINE_GB + API_PROCESS_GB * (int(count) - 1)

    def _rss_gb(self) -> float:
        if self.proc is None:
            return 0.0
        try:
            root = psutil.Process(self.proc.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**30
        except psutil.Error:
            return 0.0

    def _wait_for_memory(self) -> None:
        deadline = time.monotonic() + MEMORY_WAIT_S
        while True:
            with _memory_lock:
                to_come = sum(max(0.0, s.footprint_gb - s._rss_gb()) for s in _starting)
                if _available_gb() - to_come >= self.footprint_gb + HEADROOM_GB or time.monotonic() > deadline:
                    _starting.append(self)
                    return
            time.sleep(1)

    def start(self, timeout_s: float = 420, attempts: int = 3) -> Server:
        """Started and healthy; on fresh ports again when one it was given was taken meanwhile."""
        self._wait_for_memory()
        try:
            return self._start(timeout_s, attempts)
        finally:
            with _memory_lock:
                _starting.remove(self)

    def _start(self, timeout_s: float, attempts: int) -> Server:
        for attempt in range(attempts):
            try:
                return self._start_once(timeout_s, "wb" if attempt == 0 else "ab")
            except RuntimeError as e:
                if "address already in use" not in str(e) or attempt == attempts - 1:
                    raise
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.argv[-1] = str(self.port)  # after "--port"
            self.env.update({name: str(free_port()) for name in self.port_env})
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float, log_mode: str) -> Server:
        self._log = open(self.log_path, log_mode)
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=self.own_session, process_group=None if self.own_session else 0,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"{self.name} did not become healthy in {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._log.close()


def ours(name: str, model_dir: Path, log_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Server:
    argv = [sys.executable, "-m", "decode_server.process.cli", "serve", str(model_dir), *ENGINE_FLAGS, *extra]
    return Server(name, argv, log_dir, env)


def vllms_own(name: str, model_dir: Path, log_dir: Path, *extra: str) -> Server:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--enable-scale-out", *ENGINE_FLAGS, *extra,
    ]
    return Server(name, argv, log_dir)


def start_all(to_start: list[Server]) -> list[Server]:
    """Start them at once (the wait is one start-up, not several); the started ones, in order."""
    started: list[Server] = []
    if not to_start:
        return started
    with concurrent.futures.ThreadPoolExecutor(len(to_start)) as pool:
        futures = {pool.submit(s.start): s for s in to_start}
        for f in concurrent.futures.as_completed(futures):
            started.append(futures[f])
            f.result()
    return started


def stop_all(to_stop: list[Server]) -> None:
    # A NIXL engine's worker does not exit on its own (vLLM kills it after 5 s): stop them at once.
    if to_stop:
        with concurrent.futures.ThreadPoolExecutor(len(to_stop)) as pool:
            list(pool.map(lambda s: s.stop(), to_stop))


@contextlib.contextmanager
def running(*to_start: Server) -> Iterator[tuple[Server, ...]]:
    """The body of a module's (or package's) server fixture: these started together, and stopped
    when the fixture ends, so that the next module's engines start into the memory they leave."""
    try:
        start_all(list(to_start))
        yield to_start
    finally:
        stop_all(list(to_start))
