"""`decode-server serve [MODEL]` and `decode-server demo-model DIR`: argv → config → server.

Every vLLM engine flag comes from vLLM's own `AsyncEngineArgs.add_cli_args`, so
they behave exactly as in `vllm serve`; the server's own flags are added here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from decode_server.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_PORT,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    DEMO_KV_CACHE_BYTES,
    DEMO_MAX_MODEL_LEN,
    DerenderConfig,
    ServerConfig,
)


def _env_api_keys() -> list[str] | None:
    key = os.environ.get("VLLM_API_KEY") or os.environ.get("DECODE_SERVER_API_KEY")
    return [key] if key else None


def _server_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decode-server")
    group.add_argument("--host", default=DEFAULT_HOST, help="Address to bind (default: %(default)s).")
    group.add_argument("--port", type=int, default=DEFAULT_PORT, help="Port to bind (default: %(default)s).")
    group.add_argument(
        "--api-key",
        nargs="+",
        default=_env_api_keys(),
        help="Require 'Authorization: Bearer KEY' (any of the keys given) on /inference/* and the abort "
        "routes (default: $VLLM_API_KEY, else $DECODE_SERVER_API_KEY, else no auth).",
    )
    group.add_argument(
        "--tokens-only",
        action="store_true",
        help="Load no tokenizer and force detokenize off: only output_mode='tokens' is served "
        "(a prefill pool). text/derender requests and stop strings get 400.",
    )
    group.add_argument("--tool-call-parser", default=None, help="vLLM tool parser for output_mode='derender' (e.g. hermes).")
    group.add_argument(
        "--enable-auto-tool-choice", action="store_true", help="Parse tool calls under tool_choice='auto' (as vllm serve)."
    )
    group.add_argument(
        "--drain-timeout",
        type=int,
        dest="shutdown_timeout",
        help="Deprecated alias of --shutdown-timeout.",
    )
    group.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="Server log lines as text or one JSON object per line (default: %(default)s).",
    )
    group.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="Larger request bodies get 413 before parsing (default: %(default)s).",
    )


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="decode-server", description="Decode-tier server for vLLM's token-in generate protocol.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="Serve /inference/v1/generate on an AsyncLLM.",
        description="Serve /inference/v1/generate. With no MODEL, serve the embedded demo model "
        "(random weights: its text is meaningless).",
    )
    serve.add_argument("model_tag", nargs="?", default=None, help="Model path or name (default: the demo model).")
    _server_flags(serve)
    AsyncEngineArgs.add_cli_args(serve)
    _document_shutdown_timeout(serve)

    demo = sub.add_parser("demo-model", help="Write the demo model (config, tokenizer, chat template) to DIR.")
    demo.add_argument("dir", type=Path)
    # Listed for --help only: main() hands `pd-proxy ...` to decode_server.pd_proxy before this
    # parser (and vLLM) is built; `decode-server pd-proxy --help` shows its flags.
    sub.add_parser(
        "pd-proxy",
        add_help=False,
        help="Route /inference/v1/generate through a prefill and a decode server (NIXL), as llm-d's sidecar does.",
    )
    return parser


def _document_shutdown_timeout(serve: argparse.ArgumentParser) -> None:
    """vLLM's own --shutdown-timeout is the one drain knob; our default drains instead of aborting."""
    serve.set_defaults(shutdown_timeout=int(DEFAULT_SHUTDOWN_TIMEOUT_S))
    for action in serve._actions:
        if action.dest == "shutdown_timeout" and action.option_strings == ["--shutdown-timeout"]:
            action.help = (
                "On SIGTERM: /ready turns 503 and new requests get 503 at once; in-flight requests run up to "
                "this many seconds, then the rest are aborted (streams end with finish_reason 'abort'), the "
                "engine shuts down and the process exits 0 (default: %(default)s; vLLM's is 0)."
            )


def _apply_demo_defaults(args: argparse.Namespace, parser_defaults: dict) -> None:
    from decode_server.demo_model import DEMO_MODEL_NAME, ensure_demo_model

    args.model = str(ensure_demo_model())
    args.load_format = "dummy"
    if args.served_model_name is None:
        args.served_model_name = [DEMO_MODEL_NAME]
    if args.kv_cache_memory_bytes is None and args.gpu_memory_utilization == parser_defaults["gpu_memory_utilization"]:
        args.kv_cache_memory_bytes = DEMO_KV_CACHE_BYTES
    if args.max_model_len is None:
        args.max_model_len = DEMO_MAX_MODEL_LEN


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        served_model_names=tuple(args.served_model_name or [args.model]),
        tokens_only=args.tokens_only,
        derender=DerenderConfig(
            reasoning_parser=args.reasoning_parser or None,
            tool_call_parser=args.tool_call_parser,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
        ),
        api_keys=tuple(args.api_key or ()),
        max_request_bytes=args.max_request_bytes,
    )


def serve(args: argparse.Namespace, parser_defaults: dict) -> int:
    import uvicorn
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.utils.constants import H11_MAX_INCOMPLETE_EVENT_SIZE_DEFAULT

    from decode_server.access_log import configure as configure_logging
    from decode_server.app import build_app
    from decode_server.engine import Engine
    from decode_server.server import Lifecycle, run

    if args.model_tag is not None:
        args.model = args.model_tag
    elif args.model == parser_defaults["model"]:
        _apply_demo_defaults(args, parser_defaults)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    lifecycle = Lifecycle(args.shutdown_timeout)
    app = build_app(lambda: Engine.start(engine_args, tokens_only=args.tokens_only), server_config(args), lifecycle)
    level = (getattr(args, "log_level", None) or "info").lower()
    configure_logging(level, args.log_format)
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        log_level=level,
        log_config=None,  # keep our handler/format for uvicorn's loggers too
        access_log=False,  # our access line (decode_server.access) carries request ids and tokens
        # The drain aborts what is left at the shutdown timeout; this only bounds a stuck connection.
        timeout_graceful_shutdown=int(args.shutdown_timeout) + 10,
        # Header limits as vLLM sets them (CVE-2025-48956).
        h11_max_incomplete_event_size=H11_MAX_INCOMPLETE_EVENT_SIZE_DEFAULT,
    )
    return run(uv_config, lifecycle)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pd-proxy"]:
        from decode_server.pd_proxy import main as pd_proxy_main

        pd_proxy_main(argv[1:])
        return
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo-model":
        from decode_server.demo_model import build_demo_model

        print(build_demo_model(args.dir))
        return
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    defaults = {a.dest: a.default for a in serve_parser._actions}
    sys.exit(serve(args, defaults))


if __name__ == "__main__":
    main(sys.argv[1:])
