"""A generate stream from a real server, read on its own thread while the test acts (signals,
kills): what arrived and when, so a test orders its actions by events, not by sleeps."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Any

import httpx

from tests.support import GENERATE, joined_tokens

INDEX = "x-api-server-index"


class StreamReader(threading.Thread):
    """`target`: a server URL, or a client whose connection the stream must use (scale-out tests
    pick the API process that way). `events`: (arrival time, `data:` payload JSON-decoded, "[DONE]")."""

    def __init__(self, target: str | httpx.Client, body: dict[str, Any]):
        super().__init__(daemon=True)
        self._client = httpx.Client(base_url=target, timeout=120) if isinstance(target, str) else target
        self._owns_client = isinstance(target, str)
        self.body = {**body, "stream": True}
        self.events: list[tuple[float, Any]] = []
        self.index: str | None = None  # the API process that served it (X-Api-Server-Index)
        self.start()

    def run(self) -> None:
        import json

        try:
            with self._client.stream("POST", GENERATE, json=self.body) as r:
                self.index = r.headers.get(INDEX)
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        payload = line[6:]
                        self.events.append((time.monotonic(), payload if payload == "[DONE]" else json.loads(payload)))
        finally:
            if self._owns_client:
                self._client.close()

    def payloads(self) -> list[Any]:
        return [payload for _, payload in self.events]

    def done(self) -> bool:
        return bool(self.events) and self.events[-1][1] == "[DONE]"

    def wait_events(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.events) < count:
            assert time.monotonic() < deadline, f"{len(self.events)} events in {timeout_s} s"
            time.sleep(0.01)

    def tokens_per_s(self, over_s: float = 2.0, timeout_s: float = 120) -> float:
        """The stream's average speed since its first event, once that spans `over_s` (a process
        that fell behind sends its backlog in one chunk: a short window overstates the speed)."""
        deadline = time.monotonic() + timeout_s
        while len(self.events) < 2 or self.events[-1][0] - self.events[0][0] < over_s:
            assert time.monotonic() < deadline and not self.done(), "the stream stopped"
            time.sleep(0.05)
        events = list(self.events)
        return len(joined_tokens([payload for _, payload in events[1:]])) / (events[-1][0] - events[0][0])


def connection_to(stack: ExitStack, url: str, index: int, timeout_s: float = 60) -> httpx.Client:
    """A kept-alive client whose one connection is served by API process `index` of an
    `--api-server-count` server. Which process accepts is vLLM's least-loaded pick, and a process
    with an open connection is not the least loaded: so connections are opened, the others kept
    open in `stack`, until one lands on process `index` (every response names it: INDEX)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        client = stack.enter_context(httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=1)))
        if client.get("/health").headers[INDEX] == str(index):
            return client
        time.sleep(0.05)  # this one stays open: the next connection goes to the other process
    raise AssertionError(f"no connection reached API process {index} in {timeout_s}s")
