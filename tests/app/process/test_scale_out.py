"""`--api-server-count N`'s parent (decode_server/process/scale_out.py) without an engine or a process:
what it holds while its API processes serve. The real engine: tests/engine/test_scale_out.py."""

from __future__ import annotations

import argparse
import signal
from typing import Any


def test_the_parent_holds_the_engine_listeners_until_its_api_processes_are_shut_down(monkeypatch):
    """No engine: `serve` with its launch and supervision replaced, a collection forced mid-run."""
    import gc
    import weakref

    from decode_server.process import scale_out

    class Listeners:  # stands in for vLLM's EngineZmqListeners (unlinks its paths when collected)
        pass

    alive_while_serving = []

    def launch(*_: Any) -> tuple[Any, Any, Any]:
        listeners = Listeners()
        alive_while_serving.append(weakref.ref(listeners))
        return object(), object(), listeners

    def supervise(*_: Any) -> int:
        gc.collect()
        return 0 if alive_while_serving[0]() is not None else 1

    monkeypatch.setattr(scale_out, "_launch", launch)
    monkeypatch.setattr(scale_out, "_supervise", supervise)
    monkeypatch.setattr("vllm.v1.metrics.prometheus.setup_multiprocess_prometheus", lambda: None)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = scale_out.serve(argparse.Namespace(shutdown_timeout=1), None, "text")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 0, "the listeners were collected while the API processes ran"
