"""With `--log-format json`, every line on stdout and stderr is one JSON object, bare writes included.

Python logging is JSON in every process (vllm_logs.py), but some lines never pass through it: a
library's `print` while vLLM is imported in a freshly spawned engine core (before its logging is
configured), a C++ warning from libtorch written to fd 2, multiprocessing's resource tracker
warning at exit. All of them reach this process's file descriptors 1 and 2 (the engine processes
inherit them), so the server points both at pipes and a relay thread copies each line to the
original descriptor: a JSON object as it is, anything else wrapped as a record whose `logger` names
the stream. The writer of a bare line is not known (every process shares the pipe), so such a
record's `process` is "unattributed" and its `pid` null.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import sys
import threading
import time

# How long the exit hook keeps reading after this process let go of the pipes: a child (an engine
# core still shutting down) may hold their write ends, so no end-of-file need come.
_DRAIN_QUIET_S = 0.3
_DRAIN_MAX_S = 3.0
_LEVELS = {1: "info", 2: "warning"}
_LOGGERS = {1: "stdout", 2: "stderr"}


def as_json_line(line: bytes, fd: int, now: float | None = None) -> bytes:
    """`line` (no newline) as one JSON object: itself when it is one, else wrapped."""
    text = line.decode("utf-8", errors="replace")
    if text.startswith("{"):
        try:
            if isinstance(json.loads(text), dict):
                return line
        except ValueError:
            pass
    now = time.time() if now is None else now
    record = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z",
        "level": _LEVELS[fd],
        "logger": _LOGGERS[fd],
        "process": "unattributed",
        "pid": None,
        "message": text.rstrip("\r"),
    }
    return json.dumps(record, ensure_ascii=False).encode()


class _Relay:
    def __init__(self) -> None:
        self._targets: dict[int, int] = {}  # pipe read end -> the original descriptor's copy
        self._streams: dict[int, int] = {}  # pipe read end -> 1 or 2
        self._pending: dict[int, bytes] = {}
        self._selector = selectors.DefaultSelector()
        for fd in (1, 2):
            original = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self._targets[read_end], self._streams[read_end], self._pending[read_end] = original, fd, b""
            self._selector.register(read_end, selectors.EVENT_READ)
        self._owner = os.getpid()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stdio-json-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        quiet_since = None
        while self._selector.get_map():
            events = self._selector.select(timeout=0.1)
            for key, _ in events:
                self._pump(key.fd)
            if not self._stopping.is_set():
                continue
            # Exiting: read what is left until every writer is gone or the pipes stay quiet.
            if events:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > _DRAIN_QUIET_S:
                break
        for read_end in list(self._selector.get_map()):
            self._flush_partial(read_end)

    def _pump(self, read_end: int) -> None:
        chunk = os.read(read_end, 65536)
        if not chunk:  # every writer closed its end
            self._flush_partial(read_end)
            self._selector.unregister(read_end)
            os.close(read_end)
            return
        *lines, self._pending[read_end] = (self._pending[read_end] + chunk).split(b"\n")
        if lines:
            self._write(read_end, b"".join(as_json_line(line, self._streams[read_end]) + b"\n" for line in lines))

    def _flush_partial(self, read_end: int) -> None:
        rest, self._pending[read_end] = self._pending.get(read_end, b""), b""
        if rest:
            self._write(read_end, as_json_line(rest, self._streams[read_end]) + b"\n")

    def _write(self, read_end: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._targets[read_end], view):]

    def stop(self) -> None:
        """At exit: this process writes to the original descriptors again, and the relay copies
        what the pipes still hold."""
        if os.getpid() != self._owner:  # a forked child inherits the hook, not the thread
            return
        _stop_resource_tracker()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for read_end, fd in self._streams.items():
            os.dup2(self._targets[read_end], fd)  # drops this process's write end of the pipe
        self._stopping.set()
        self._thread.join(_DRAIN_MAX_S)


def _stop_resource_tracker() -> None:
    """multiprocessing's resource tracker (a child sharing the pipes) reports leaks when this
    process's end of its channel closes, which is otherwise after the relay stopped: stopped here,
    its lines still pass through."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_pid", None) is not None and hasattr(tracker, "_stop"):
        try:
            tracker._stop()
        except Exception:  # exiting anyway; the relay still copies what came
            pass


_relay: _Relay | None = None


def relay_stdio_as_json() -> None:
    """Once per process, before anything else writes (the CLI calls it first in JSON mode)."""
    global _relay
    if _relay is None:
        _relay = _Relay()
        atexit.register(_relay.stop)
