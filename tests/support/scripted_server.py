"""`decode-server serve` over the scripted engine, as a real process: for what only a process shows
(signals, uvicorn's shutdown, the exit code) without an engine to start or to wait for.

    python -m tests.support.scripted_server [--hold ID:N]... [--hold-until-drain ID:N]... MODEL [serve flags]

Everything `cli.serve` runs is the same (the parser, `server_config`, `Lifecycle`, `build_app`,
`server.run` with its uvicorn and `DrainingServer`) except the engine: our `Engine` over a
`ScriptedAsyncLLM` (tests/scripted). Its gates, set from the command line, put requests where a test
needs them without racing an engine: `--hold ID:N` stops request ID after N output tokens for good;
`--hold-until-drain ID:N` stops it there until the drain begins (it is in flight at SIGTERM, by
construction, then finishes inside the window).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from decode_server.http.app import build_app
from decode_server.process.cli import server_config
from decode_server.process.server import Lifecycle, run, uvicorn_config
from decode_server.runtime.access_log import configure as configure_logging
from decode_server.runtime.engine import Engine
from tests.support import servers
from tests.support.inprocess import engine_args, serve_args
from tests.support.scripted_engine import Gate, ScriptedAsyncLLM, engine_setup

HOLD, HOLD_UNTIL_DRAIN = "--hold", "--hold-until-drain"


class _ReleasingLifecycle(Lifecycle):
    """The process's Lifecycle; the drain's start also opens the `--hold-until-drain` gates."""

    gates: list[Gate]
    serving_loop: asyncio.AbstractEventLoop

    def attach(self, engine: Any, metrics: Any) -> None:
        super().attach(engine, metrics)
        self.serving_loop = asyncio.get_running_loop()

    def begin_drain(self) -> bool:
        draining = super().begin_drain()
        for gate in self.gates:  # from the signal handler: the gates live on the serving loop
            self.serving_loop.call_soon_threadsafe(gate.release)
        return draining


def _gates(argv: list[str]) -> tuple[dict[str, list[tuple[str, int]]], list[str]]:
    gates: dict[str, list[tuple[str, int]]] = {HOLD: [], HOLD_UNTIL_DRAIN: []}
    while argv and argv[0] in gates:
        request_id, _, tokens = argv[1].rpartition(":")
        gates[argv[0]].append((request_id, int(tokens)))
        argv = argv[2:]
    return gates, argv


def main(argv: list[str]) -> int:
    gates, rest = _gates(argv)
    args = serve_args(Path(rest[0]), *rest[1:])
    configure_logging((getattr(args, "log_level", None) or "info").lower(), args.log_format)
    setup = engine_setup(engine_args(args))  # the slow part (config, tokenizer): before serving
    lifecycle = _ReleasingLifecycle(args.shutdown_timeout)

    def scripted_engine() -> Engine:
        llm = ScriptedAsyncLLM(setup)
        for request_id, tokens in gates[HOLD]:
            llm.core.hold(request_id, after_tokens=tokens)
        lifecycle.gates = [llm.core.hold(request_id, after_tokens=tokens) for request_id, tokens in gates[HOLD_UNTIL_DRAIN]]
        return Engine(llm, tokens_only=args.tokens_only)

    config = server_config(args)
    app = build_app(scripted_engine, config, lifecycle)
    return run(uvicorn_config(app, args, config), lifecycle)


def scripted_process(
    name: str,
    model_dir: Path,
    log_dir: Path,
    *flags: str,
    hold: dict[str, int] | None = None,
    hold_until_drain: dict[str, int] | None = None,
) -> servers.Server:
    """A `servers.Server` running this module; `hold`, `hold_until_drain`: request id → tokens."""
    argv = [sys.executable, "-m", "tests.support.scripted_server"]
    for flag, held in ((HOLD, hold), (HOLD_UNTIL_DRAIN, hold_until_drain)):
        argv += [part for request_id, tokens in (held or {}).items() for part in (flag, f"{request_id}:{tokens}")]
    return servers.Server(name, [*argv, str(model_dir), *flags], log_dir, engine=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
