"""While it drains, the server keeps listening: Prometheus scrapes /metrics (decode_server_draining
at 1), the readiness probe and new generate requests get their 503 on new connections, and the
process stops serving as soon as the last in-flight request has ended, not at the deadline.

On a real socket (tests/support/loopback.py: our uvicorn with the production configuration, over the
scripted engine); the drain is started as SIGTERM starts it, through `DrainingServer.handle_exit`
(off the main thread uvicorn installs no signal handler). A real process under a real signal:
tests/engine/test_drain.py, and on a real engine the end of tests/engine/prod/test_operations.py's server."""

from __future__ import annotations

import signal
import time

import httpx

from decode_server.errors import DRAINING
from tests.support.inprocess import body_for, error_of
from tests.support.loopback import loopback
from tests.support.stream_reader import StreamReader
from tests.support import GENERATE, finish_reason, joined_tokens, metric_sum

IM_END = 151645
SCRIPT = [9707] * 6


def test_a_draining_server_is_scraped_and_refuses_new_requests_then_stops_when_the_last_stream_ends(demo_model):
    with loopback(demo_model, "--shutdown-timeout", "30") as srv:
        gate = srv.call(srv.core.hold, "open", 2)
        stream = StreamReader(srv.url, body_for("tokens", SCRIPT, request_id="open"))
        srv.wait(gate.reached())
        assert metric_sum(httpx.get(srv.url + "/metrics").text, "decode_server_draining") == 0

        srv.call(srv.server.handle_exit, signal.SIGTERM, None)
        srv.call(srv.server.handle_exit, signal.SIGTERM, None)  # a second SIGTERM changes nothing
        for _ in range(3):  # a new connection each time: the listener is open
            with httpx.Client(base_url=srv.url, timeout=10) as fresh:
                scrape = fresh.get("/metrics")
                assert scrape.status_code == 200, scrape.text
                assert metric_sum(scrape.text, "decode_server_draining") == 1
                assert metric_sum(scrape.text, "decode_server_requests_in_flight") == 1
                assert error_of(fresh.get("/ready")) == (503, "draining", None)
                refused = fresh.post(GENERATE, json=body_for("tokens", SCRIPT, request_id="late"))
                assert error_of(refused) == (503, DRAINING, None)
                assert refused.headers["retry-after"] == "1"
            time.sleep(0.3)
        assert not srv.server.should_exit and not stream.done()

        released = time.monotonic()
        srv.call(gate.release)
        stream.join(30)
        assert (finish_reason(stream.payloads()), joined_tokens(stream.payloads())) == ("stop", SCRIPT + [IM_END])
        while not srv.server.should_exit:
            assert time.monotonic() - released < 5, "the server kept serving after its last stream ended"
            time.sleep(0.05)
        assert srv.metric("decode_server_aborts_total", cause="drain") == 0
