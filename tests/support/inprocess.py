"""The in-process tier: the real app over the scripted engine, in the test's own event loop.

`serve(model_dir, *flags)` does what `decode-server serve MODEL *flags` does up to uvicorn: vLLM's
parser and ours, `server_config`, the engine args, `server.Lifecycle`, `build_app` and its lifespan
(which starts our `Engine`), except that the Engine wraps a `ScriptedAsyncLLM`. Requests go through
`StreamingASGITransport` (streams arrive chunk by chunk; closing one is a client disconnect).

    async with serve(demo_model, "--api-key", "k") as s:
        r = await s.client.post(GENERATE, json=scripted([9707], [1, 2]))
        s.core.hold("req-1")  # the scripted engine core: see tests/support/scripted_engine/core.py
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sse_starlette.sse import AppStatus
from vllm.engine.arg_utils import AsyncEngineArgs
from decode_server.compat import cli_args

from decode_server.http.app import build_app
from decode_server.process.cli import build_parser, server_config
from decode_server.runtime.engine import Engine
from decode_server.runtime.peers import Peers
from decode_server.process.server import Lifecycle
from tests.support.asgi_stream import StreamingASGITransport
from tests.support.scripted_engine import ScriptedAsyncLLM, ScriptedCore, engine_setup
from tests.support.servers import ENGINE_FLAGS
from tests.support import GENERATE, metric_sum, scripted

BASE_URL = "http://decode-server.test"
PROMPT = [9707, 1879]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
_parser: argparse.ArgumentParser | None = None
_vllm_parser: argparse.ArgumentParser | None = None


def _own_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with its own copy of every default. A parser's default is one object shared by every
    parse, and vLLM mutates some in place (create_engine_config writes --reasoning-parser into the
    default StructuredOutputsConfig): with one parser reused across servers, a server started
    without --reasoning-parser would get the previous one's."""
    return argparse.Namespace(**copy.deepcopy(vars(args)))


def serve_args(model_dir: Path, *flags: str) -> argparse.Namespace:
    """`decode-server serve MODEL *ENGINE_FLAGS *flags`, parsed and checked as `cli.serve` does."""
    global _parser
    _parser = _parser or build_parser()  # vLLM's parser takes seconds to build; parsing is cheap
    args = _own_defaults(_parser.parse_args(["serve", str(model_dir), *ENGINE_FLAGS, *flags]))
    args.model = args.model_tag
    cli_args().validate_parsed_serve_args(args)
    if (args.api_server_count or 1) > 1:
        raise ValueError("--api-server-count > 1 runs several processes: a real-engine test")
    if args.tool_parser_plugin:
        from vllm.tool_parsers import ToolParserManager

        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    return args


def body_for(mode: str, script: list[int], **fields: Any) -> dict[str, Any]:
    """A scripted generate body at an output level (derender without thinking unless told)."""
    if mode == "derender":
        fields.setdefault("parse_context", NO_THINKING)
    return scripted(PROMPT, script, output_mode=mode, **fields)


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    """(status, message, param) of an error answer, whose body's code must be its status."""
    error = response.json()["error"]
    assert error["code"] == response.status_code, response.text
    return response.status_code, error["message"], error["param"]


def engine_args(args: argparse.Namespace) -> AsyncEngineArgs:
    built = AsyncEngineArgs.from_cli_args(args)
    if args.tokens_only:
        built.tokens_only = True  # as Engine.start
    return built


def scripted_llm(model_dir: Path, *flags: str) -> ScriptedAsyncLLM:
    """Only the engine (vLLM's EngineClient) a `decode-server serve` command line would build:
    to feed vLLM's own serving classes the same RequestOutputs as our app."""
    return ScriptedAsyncLLM(engine_setup(engine_args(serve_args(model_dir, *flags))))


@dataclass
class InProcess:
    app: Any
    client: httpx.AsyncClient
    llm: ScriptedAsyncLLM
    lifecycle: Lifecycle
    args: argparse.Namespace

    @property
    def core(self) -> ScriptedCore:
        return self.llm.core

    @property
    def state(self) -> Any:
        """The app's `routes.AppState`: config, metrics, the service (and its Engine)."""
        return self.app.state.decode_server

    @property
    def engine(self) -> Engine:
        return self.state.service.engine

    async def metric(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples on /metrics whose labels include `labels`."""
        return metric_sum((await self.client.get("/metrics")).text, name, **labels)

    async def events(self, body: dict[str, Any], **kw: Any) -> list[Any]:
        """Every `data:` payload of a generate stream, JSON-decoded, ending with "[DONE]"."""
        out: list[Any] = []
        async with self.client.stream("POST", GENERATE, json={**body, "stream": True}, **kw) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
        return out


@contextlib.asynccontextmanager
async def serve(model_dir: Path, *flags: str, peers: Peers | None = None) -> AsyncIterator[InProcess]:
    """`peers`: this app's end of the channel to other API processes' apps (--api-server-count N,
    each app one process; several can share the test's loop)."""
    args = serve_args(model_dir, *flags)
    llm = ScriptedAsyncLLM(engine_setup(engine_args(args)))
    lifecycle = Lifecycle(args.shutdown_timeout)
    app = build_app(lambda: Engine(llm, tokens_only=args.tokens_only), server_config(args), lifecycle, peers)
    try:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url=BASE_URL, timeout=30) as client:
                yield InProcess(app, client, llm, lifecycle, args)
    finally:
        AppStatus.should_exit = False  # process-global: a drain deadline in one test must not end the next one's streams


def vllm_serve_args(model_dir: Path, *flags: str) -> argparse.Namespace:
    """`vllm serve` (as tests/support/servers.py starts vLLM's own server), parsed and checked by vLLM."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    global _vllm_parser
    _vllm_parser = _vllm_parser or cli_args().make_arg_parser(FlexibleArgumentParser())
    args = _own_defaults(_vllm_parser.parse_args(["--model", str(model_dir), "--enable-scale-out", *ENGINE_FLAGS, *flags]))
    cli_args().validate_parsed_serve_args(args)
    return args


@contextlib.asynccontextmanager
async def vllm_serve(model_dir: Path, *flags: str) -> AsyncIterator[InProcess]:
    """vLLM's own API server (its FastAPI app, serving classes and lifespan) over the scripted
    engine: coupled chat, vLLM's generate and render get the same RequestOutputs as our app.
    `InProcess.state`/`engine`/`metric` are ours only; use `client`, `llm` and `core`."""
    import gc

    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app as build_vllm_app

    args = vllm_serve_args(model_dir, *flags)
    built = AsyncEngineArgs.from_cli_args(args)
    llm = ScriptedAsyncLLM(engine_setup(built))
    # `vllm serve` builds the engine config from these args, which writes --reasoning-parser into
    # args.structured_outputs_config, where its chat serving reads it; a cached setup skipped that.
    built.create_structured_outputs_config()
    tasks = await llm.get_supported_tasks()
    app = build_vllm_app(args, tasks, llm.model_config)
    try:
        await init_app_state(llm, app.state, args, tasks)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url=BASE_URL, timeout=30) as client:
                yield InProcess(app, client, llm, Lifecycle(), args)
    finally:
        llm.shutdown()
        gc.unfreeze()  # vLLM's lifespan freezes the heap for a long-lived server; a test process is not one
