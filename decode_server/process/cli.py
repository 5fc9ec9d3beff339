"""`decode-server serve [MODEL]` and `decode-server demo-model DIR`: argv → config → server.

`serve` takes exactly `vllm serve`'s command line: the parser is vLLM's own
(`make_arg_parser`: every frontend and engine flag), plus a few flags of ours. What each
frontend flag does here is in `frontend_flags.py`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from decode_server.config import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_REQUEST_BODY_TIMEOUT_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    DEMO_KV_CACHE_BYTES,
    DEMO_MAX_MODEL_LEN,
    CorsConfig,
    DerenderConfig,
    ServerConfig,
)


def _seconds(value: str) -> float:
    seconds = float(value)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {value}")
    return seconds


def _own_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decode-server")
    group.add_argument("--drain-timeout", type=int, dest="shutdown_timeout", help="Deprecated alias of --shutdown-timeout.")
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
    group.add_argument(
        "--request-body-timeout",
        type=_seconds,
        default=DEFAULT_REQUEST_BODY_TIMEOUT_S,
        metavar="S",
        help="A request body not received whole within S seconds of its head gets 408 and the connection "
        "is closed (0: no bound; default: %(default)s).",
    )


def _adjust_vllm_flags(serve: argparse.ArgumentParser) -> None:
    """vLLM's own --shutdown-timeout is the one drain knob; our default drains instead of aborting."""
    serve.set_defaults(shutdown_timeout=int(DEFAULT_SHUTDOWN_TIMEOUT_S))
    for action in serve._actions:
        if action.option_strings == ["--shutdown-timeout"]:
            action.help = (
                "On SIGTERM: /ready turns 503 and new requests get 503 at once; in-flight requests run up to "
                "this many seconds, then the rest are aborted (streams end with finish_reason 'abort'), the "
                "engine shuts down and the process exits 0 (default: %(default)s; vLLM's is 0)."
            )


def build_parser() -> argparse.ArgumentParser:
    from decode_server.compat import cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="decode-server", description="Decode-tier server for vLLM's token-in generate protocol.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="Serve /inference/v1/generate on an AsyncLLM (takes every `vllm serve` flag).",
        description="Serve /inference/v1/generate. Takes `vllm serve`'s flags. With no MODEL, serve the "
        "embedded demo model (random weights: its text is meaningless).",
    )
    cli_args().make_arg_parser(serve)
    _own_flags(serve)
    _adjust_vllm_flags(serve)

    demo = sub.add_parser("demo-model", help="Write the demo model (config, tokenizer, chat template) to DIR.")
    demo.add_argument("dir", type=Path)
    # Listed for --help only: main() hands `pd-proxy ...` to decode_server.tools.pd_proxy before this
    # parser (and vLLM) is built; `decode-server pd-proxy --help` shows its flags.
    sub.add_parser(
        "pd-proxy",
        add_help=False,
        help="Route /inference/v1/generate through a prefill and a decode server (NIXL), as llm-d's sidecar does.",
    )
    return parser


def _apply_demo_defaults(args: argparse.Namespace, parser_defaults: dict) -> None:
    from decode_server.tools.demo_model import DEMO_MODEL_NAME, ensure_demo_model

    args.model = str(ensure_demo_model())
    args.load_format = "dummy"
    if args.served_model_name is None:
        args.served_model_name = [DEMO_MODEL_NAME]
    if args.kv_cache_memory_bytes is None and args.gpu_memory_utilization == parser_defaults["gpu_memory_utilization"]:
        args.kv_cache_memory_bytes = DEMO_KV_CACHE_BYTES
    if args.max_model_len is None:
        args.max_model_len = DEMO_MAX_MODEL_LEN


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    if args.api_key:
        return tuple(args.api_key)
    key = os.environ.get("VLLM_API_KEY") or os.environ.get("DECODE_SERVER_API_KEY")
    return (key,) if key else ()


def server_config(args: argparse.Namespace) -> ServerConfig:
    from vllm import envs

    skip = frozenset(p.strip() for p in (args.disable_access_log_for_endpoints or "").split(",") if p.strip())
    return ServerConfig(
        served_model_names=tuple(args.served_model_name or [args.model]),
        tokens_only=args.tokens_only,
        derender=DerenderConfig(
            reasoning_parser=args.reasoning_parser or None,
            tool_call_parser=args.tool_call_parser,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            default_chat_template_kwargs=dict(args.default_chat_template_kwargs or {}),
            chat_template=args.chat_template,
            response_role=args.response_role,
        ),
        api_keys=_api_keys(args),
        max_request_bytes=args.max_request_bytes,
        request_body_timeout_s=args.request_body_timeout,
        sse_keep_alive_s=args.sse_keep_alive_interval,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        load_tracking=args.enable_server_load_tracking,
        openapi=not args.disable_fastapi_docs,
        access_log=not args.disable_uvicorn_access_log,
        access_log_skip_paths=skip,
        cors=CorsConfig(
            allowed_origins=tuple(args.allowed_origins),
            allowed_methods=tuple(args.allowed_methods),
            allowed_headers=tuple(args.allowed_headers),
            allow_credentials=args.allow_credentials,
        ),
        middleware=tuple(args.middleware),
        lora_modules=tuple(args.lora_modules or ()),
        runtime_lora_updating=bool(envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING),
    )


def serve(args: argparse.Namespace, parser_defaults: dict) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from decode_server.compat import cli_args

    from decode_server.runtime.access_log import configure as configure_logging
    from decode_server.http.app import build_app
    from decode_server.runtime.engine import Engine
    from decode_server.process.engine_session import engine_session
    from decode_server.process.frontend_flags import log_flags_without_meaning
    from decode_server.process.parser_check import parser_refusal
    from decode_server.process.server import Lifecycle, run, uvicorn_config

    if args.model_tag is not None:
        args.model = args.model_tag
    elif args.model == parser_defaults["model"]:
        _apply_demo_defaults(args, parser_defaults)
    cli_args().validate_parsed_serve_args(args)
    if args.tool_parser_plugin:
        from vllm.tool_parsers import ToolParserManager

        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    configure_logging((getattr(args, "log_level", None) or "info").lower(), args.log_format)
    log_flags_without_meaning(args, parser_defaults)
    config = server_config(args)
    refusal = parser_refusal(args, config.derender)
    if refusal:
        print(f"decode-server: {refusal}", file=sys.stderr)
        return 2  # as argparse's own refusal of a flag
    if (args.api_server_count or 1) > 1:
        from decode_server.process.scale_out import serve as serve_scaled_out

        return serve_scaled_out(args, config, args.log_format)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    lifecycle = Lifecycle(args.shutdown_timeout)

    def start_engine() -> Engine:
        with engine_session():  # a signal to our process group drains; it does not kill the engine
            return Engine.start(engine_args, tokens_only=args.tokens_only)

    app = build_app(start_engine, config, lifecycle)
    return run(uvicorn_config(app, args, config), lifecycle)


def serve_defaults(parser: argparse.ArgumentParser) -> dict:
    """Each `serve` flag's default, by destination (what `serve` compares the parsed args with)."""
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return {a.dest: a.default for a in serve_parser._actions}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pd-proxy"]:
        from decode_server.tools.pd_proxy import main as pd_proxy_main

        pd_proxy_main(argv[1:])
        return
    if argv[:1] == ["serve"]:
        from decode_server.process.vllm_logs import use_json_logs

        use_json_logs(argv)  # before vLLM is imported: it configures its loggers on import
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo-model":
        from decode_server.tools.demo_model import build_demo_model

        print(build_demo_model(args.dir))
        return
    sys.exit(serve(args, serve_defaults(parser)))


if __name__ == "__main__":
    main(sys.argv[1:])
