"""What each of `vllm serve`'s frontend flags does here.

The CLI is built on vLLM's own argument definitions (`make_arg_parser`: `FrontendArgs` plus
`AsyncEngineArgs`), so every `vllm serve` command line parses. Engine flags all go to the
engine unchanged. Each frontend flag is listed below as implemented (what it does here) or as
having no meaning for a decode server (why); setting one of the latter logs that reason once at
start. The flag table in docs/configuration.md is this table (tests/app/process/test_cli_flags.py keeps them equal).
"""

from __future__ import annotations

import logging
from typing import Any

from decode_server.compat import VLLM_LINE

log = logging.getLogger("decode_server.flags")

IMPLEMENTED: dict[str, str] = {
    "model_tag": "the model to serve (default: the demo model)",
    "config": "read flags from a YAML file (vLLM's FlexibleArgumentParser)",
    "host": "bind address (default: all interfaces, as vLLM)",
    "port": "bind port",
    "uds": "serve on a Unix domain socket instead of host/port",
    "api_key": "one or more keys (or `$VLLM_API_KEY`); `Authorization: Bearer K` on `/inference/*` and the abort routes",
    "tokens_only": "a prefill pool: no tokenizer, detokenize off, only `output_mode=tokens`",
    "tool_call_parser": "vLLM tool parser of the derender level",
    "tool_parser_plugin": "imports a plugin that registers tool parsers for `--tool-call-parser`",
    "enable_auto_tool_choice": "parse tool calls under `tool_choice=auto`; part of the parser fingerprint",
    "chat_template": "part of the parser fingerprint (the template the render tier must have used)",
    "default_chat_template_kwargs": "default `chat_template_kwargs` of the derender parsers (the request's win); in the fingerprint",
    "response_role": "the role of derender messages and deltas",
    "return_tokens_as_token_ids": "text-level logprob tokens as `token_id:N`",
    "enable_prompt_tokens_details": "`usage.prompt_tokens_details.cached_tokens` (prefix-cache hits)",
    "enable_server_load_tracking": "`GET /load` answers the number of requests in flight",
    "sse_keep_alive_interval": "`: keep-alive` comment lines every N seconds on streams (0: none)",
    "uvicorn_log_level": "uvicorn's own log level",
    "disable_uvicorn_access_log": "no access line (this server's access line is `decode_server.access`)",
    "disable_access_log_for_endpoints": "no access line for these comma-separated paths",
    "allowed_origins": "CORS",
    "allowed_methods": "CORS",
    "allowed_headers": "CORS",
    "allow_credentials": "CORS",
    "ssl_keyfile": "TLS",
    "ssl_certfile": "TLS",
    "ssl_ca_certs": "TLS",
    "ssl_cert_reqs": "TLS",
    "ssl_ciphers": "TLS",
    "root_path": "ASGI root path behind a path-prefixing proxy",
    "middleware": "extra ASGI middleware (import path of a class or an `async def (request, call_next)`)",
    "enable_request_id_headers": "accepted; every response carries `X-Request-Id` here anyway",
    "disable_fastapi_docs": "no `/openapi.json`",
    "h11_max_incomplete_event_size": "h11 header limit (CVE-2025-48956)",
    "h11_max_header_count": "h11 header count limit",
    "enable_scale_out": "accepted; the generate endpoints are always served here",
    "lora_modules": "LoRA adapters (`name=path` or JSON) served as models: a request's `model` picks one (with `--enable-lora`)",
    "api_server_count": "N API processes on one socket, sharing the engine core (vLLM's machinery); abort by caller id reaches "
    "any process, `/metrics` merges all, SIGTERM drains all (see Scale-out)",
}

NO_MEANING: dict[str, str] = {
    "headless": "there is no engine-only mode: this server is the API server",
    "grpc": "no gRPC frontend; HTTP only",
    "grpc_port": "no gRPC frontend; HTTP only",
    "chat_template_content_format": "no chat rendering here (the render tier renders)",
    "trust_request_chat_template": "no chat rendering here (the render tier renders)",
    "trust_request_mm_kwargs": "multimodal input is refused with 400",
    "exclude_tools_when_tool_choice_none": "no chat rendering here (the render tier renders)",
    "tool_strict_level": "structural tags are built when rendering; the render tier sends structured_outputs",
    "tool_server": "no Responses API or built-in tools here",
    "max_log_len": "prompts are never logged here",
    "enable_per_request_metrics": "per-request timing is in the access line and /metrics",
    "enable_force_include_usage": "batch bodies always carry usage; streams follow stream_options",
    "enable_tokenizer_info_endpoint": "no tokenizer endpoints here",
    "enable_log_outputs": "outputs are never logged here",
    "enable_log_deltas": "outputs are never logged here",
    "cohere_is_reasoning_model": "no Cohere API here",
    "cohere_format": "no Cohere API here",
    "anthropic_disabled_thinking_effort": "no Anthropic API here",
    "log_error_stack": "5xx errors always log their stack here; 4xx never do",
    "fingerprint_mode": "generate responses have no system_fingerprint (see X-Parser-Fingerprint)",
    "fingerprint_value": "generate responses have no system_fingerprint (see X-Parser-Fingerprint)",
    "data_parallel_supervisor_port": "no multi-port data-parallel supervisor here",
    "dp_supervisor_probe_interval_s": "no multi-port data-parallel supervisor here",
    "dp_supervisor_probe_timeout_s": "no multi-port data-parallel supervisor here",
    "dp_supervisor_probe_failure_threshold": "no multi-port data-parallel supervisor here",
    "enable_ssl_refresh": "certificates are read at start; restart the pod to rotate them",
    "enable_offline_docs": "no docs UI here; /openapi.json is the schema",
    "enable_flash_late_interaction": "pooling models are not served here",
}


# Frontend flags a vLLM line added, by line: the running line's table is NO_MEANING plus every
# line's up to it (docs/configuration.md's table lists them all, marked with the line).
ADDED_IN: dict[str, dict[str, str]] = {
    "0.33": {"reasoning_effort_map": "the render tier applies it (reasoning_effort → chat_template_kwargs)"},
}
for _line, _flags in ADDED_IN.items():
    if tuple(map(int, _line.split("."))) <= tuple(map(int, VLLM_LINE.split("."))):
        NO_MEANING.update(_flags)


def frontend_dests(parser: Any, engine_dests: set[str]) -> list[str]:
    """The `vllm serve` flags that are not engine flags, in the parser's order."""
    return [a.dest for a in parser._actions if a.dest not in engine_dests and a.dest != "help"]


def log_flags_without_meaning(args: Any, defaults: dict[str, Any]) -> list[str]:
    """One line per flag the operator set that does nothing here; returns their names."""
    named = []
    for dest, reason in NO_MEANING.items():
        value = getattr(args, dest, None)
        if dest in defaults and value != defaults[dest]:
            log.warning("--%s has no meaning for decode-server and is ignored: %s", dest.replace("_", "-"), reason)
            named.append(dest)
    return named
