"""Abort by caller id across the API processes that share one engine core (--api-server-count N).

vLLM's API processes share only the engine core, and the core knows a request by an internal id
(the caller's id plus 8 random characters, added by the AsyncLLM of the process that admitted it),
so only that process can abort it. Each process binds one zmq ROUTER socket (ipc) and asks its
peers, over a DEALER to each, about every id it is asked to abort (held here or not: a caller's id
may name requests on several processes):

- `abort`: each peer aborts what it holds under those ids and says which ids it knows (live or
  just finished);
- `remember`: ids no process knows: every process remembers them as early aborts (the request
  may still be in transit to any of them), exactly as one process does on its own;
- `refresh`: set your sampled gauges now (before /metrics merges every process's series).

A peer that does not answer within PEER_TIMEOUT_S is skipped (it is starting, stopping or gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any

import msgspec
import zmq
import zmq.asyncio

log = logging.getLogger("decode_server.runtime.peers")

PEER_TIMEOUT_S = 2.0
_encode = msgspec.json.encode
_decode = msgspec.json.decode


class Peers:
    """This process's end of the channel: `addresses[index]` is its own socket."""

    def __init__(self, index: int, addresses: list[str]):
        self.index, self.addresses = index, list(addresses)
        self._ctx: zmq.asyncio.Context | None = None
        self._dealers: dict[str, tuple[zmq.asyncio.Socket, asyncio.Lock]] = {}
        self._seq = itertools.count()
        self._task: asyncio.Task | None = None
        self._engine: Any = None
        self._metrics: Any = None

    # ------------------------------------------------------------ lifecycle

    def start(self, engine: Any, metrics: Any) -> None:
        """On the serving loop, once the engine is up."""
        self._engine, self._metrics = engine, metrics
        self._ctx = zmq.asyncio.Context()
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.addresses[self.index])
        self._task = asyncio.ensure_future(self._serve(router))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sock, _ in self._dealers.values():
            sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)

    # ------------------------------------------------------------ asking

    async def abort(self, ids: list[str]) -> int:
        """Abort by caller id in every process holding each; returns the engine requests aborted.

        Every peer is asked whatever this process knows: a caller's id is not unique across
        processes (a retry of a request that just ended here may run on another, and one process
        aborts every request under an id), so knowing an id here never settles it."""
        engine = self._engine
        aborted = len(await engine.abort(ids, remember=False))
        known = {i for i in ids if engine.knows(i)}
        by_peers = 0
        for reply in await self._ask_all({"op": "abort", "ids": ids}):
            by_peers += reply["aborted"]
            known.update(reply["known"])
        rest = [i for i in ids if i not in known]
        if rest:  # nobody holds them (yet): every process remembers them, as one process would
            replies = await self._ask_all({"op": "remember", "ids": rest})
            by_peers += sum(r["aborted"] for r in replies)  # one that arrived there meanwhile
            aborted += len(await engine.abort(rest))
        if by_peers and self._metrics.peer_aborts is not None:
            self._metrics.peer_aborts.inc(by_peers)
        # One line per abort: the only trace of which process did what.
        log.info("abort %s: %d here, %d by peers (known: %s; remembered: %s)", ids, aborted, by_peers, sorted(known), rest)
        return aborted + by_peers

    async def refresh_metrics(self) -> None:
        await self._ask_all({"op": "refresh"})

    async def _ask_all(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        peers = [a for i, a in enumerate(self.addresses) if i != self.index]
        replies = await asyncio.gather(*(self._ask(a, message) for a in peers))
        return [r for r in replies if r is not None]

    async def _ask(self, address: str, message: dict[str, Any]) -> dict[str, Any] | None:
        sock, lock = self._dealer(address)
        seq = str(next(self._seq)).encode()
        async with lock:
            try:
                await sock.send_multipart([seq, _encode(message)], flags=zmq.NOBLOCK)
                async with asyncio.timeout(PEER_TIMEOUT_S):
                    while True:  # skip a late answer to an earlier question that timed out
                        got, payload = await sock.recv_multipart()
                        if got == seq:
                            return _decode(payload)
            except (TimeoutError, zmq.ZMQError):
                log.warning("API server peer %s did not answer %s", address, message.get("op"))
                return None

    def _dealer(self, address: str) -> tuple[zmq.asyncio.Socket, asyncio.Lock]:
        if address not in self._dealers:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            self._dealers[address] = (sock, asyncio.Lock())
        return self._dealers[address]

    # ------------------------------------------------------------ answering

    async def _serve(self, router: zmq.asyncio.Socket) -> None:
        try:
            while True:
                identity, seq, payload = await router.recv_multipart()
                try:
                    reply = await self._answer(_decode(payload))
                except Exception:
                    log.exception("could not answer an API server peer")
                    reply = {"aborted": 0, "known": []}
                await router.send_multipart([identity, seq, _encode(reply)])
        finally:
            with contextlib.suppress(Exception):
                router.close(linger=0)

    async def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        engine, op = self._engine, message["op"]
        if op == "refresh":
            self._metrics.refresh(engine)
            return {}
        ids = message["ids"]
        aborted = len(await engine.abort(ids, remember=op == "remember"))
        known = [i for i in ids if engine.knows(i)]
        log.info("peer %s %s: %d aborted here, known here: %s", op, ids, aborted, known)
        return {"aborted": aborted, "known": known}
