"""What the server is configured with, and every default, written once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# As vLLM: no --host binds every interface.
DEFAULT_HOST = "0.0.0.0"
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
# A request body must arrive whole within this many seconds of its head (--request-body-timeout):
# a client that dribbles its body in gets 408 instead of holding a connection and a handler
# forever (uvicorn, and so vLLM's server, bounds neither). Generous for any body this server
# takes (8 MiB at 300 KB/s); 0: no bound.
DEFAULT_REQUEST_BODY_TIMEOUT_S = 30.0
# vLLM's `--shutdown-timeout` governs the drain; vLLM's own default is 0 (no drain), ours 30 s.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# After the drain deadline, how long aborted streams get to send their last chunk.
DRAIN_FLUSH_S = 2.0
# How often the drain checks whether a request is still in flight (uvicorn polls its exit flag as often).
DRAIN_POLL_S = 0.1
# After the engine dies, how long open streams get to send their error event before exit.
ENGINE_DEATH_GRACE_S = 2.0
ENGINE_WATCH_INTERVAL_S = 0.5
STATS_LOG_INTERVAL_S = 10.0
RETRY_AFTER_S = 1
# An abort naming an id this server does not hold (yet) is remembered this long, so a request
# still being read or processed when its abort arrives is aborted as soon as it starts.
EARLY_ABORT_TTL_S = 2.0
EARLY_ABORT_MAX_IDS = 10_000
# Request ids travel in the X-Request-Id header: bounded and printable.
MAX_REQUEST_ID_CHARS = 256
MAX_JSON_DEPTH = 64
# The demo model: the host-memory KV cache default would reserve most of the machine for a toy.
DEMO_KV_CACHE_BYTES = 512 * 1024 * 1024
DEMO_MAX_MODEL_LEN = 16384


@dataclass(frozen=True)
class DerenderConfig:
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    # --default-chat-template-kwargs: under each request's own chat_template_kwargs.
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None  # --chat-template; parsing depends on it (fingerprint)
    response_role: str = "assistant"


@dataclass(frozen=True)
class CorsConfig:
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]
    tokens_only: bool = False
    derender: DerenderConfig = field(default_factory=DerenderConfig)
    api_keys: tuple[str, ...] = ()
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # --request-body-timeout: the whole body within this many seconds of the handler's first read; 0: off.
    request_body_timeout_s: float = DEFAULT_REQUEST_BODY_TIMEOUT_S
    # SSE `: keep-alive` comments every this many seconds; 0: none (vLLM's default: data lines only).
    sse_keep_alive_s: float = 0
    return_tokens_as_token_ids: bool = False
    prompt_tokens_details: bool = False
    load_tracking: bool = False  # GET /load
    openapi: bool = True
    access_log: bool = True
    access_log_skip_paths: frozenset[str] = frozenset()
    cors: CorsConfig = field(default_factory=CorsConfig)
    middleware: tuple[str, ...] = ()  # import paths of extra ASGI middleware (--middleware)
    # --lora-modules (vLLM's LoRAModulePath list); served as models named by the adapter.
    lora_modules: tuple[Any, ...] = ()
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING: /v1/load_lora_adapter and /v1/unload_lora_adapter.
    runtime_lora_updating: bool = False
    # Bounds from the environment (as vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE), read when the config is
    # built; 0: off. A request head (request line + headers) must be complete this long after the
    # connection opens, or after the first byte of a kept-alive connection's next request.
    request_head_timeout_s: float = field(default_factory=lambda: _env_seconds("DECODE_SERVER_REQUEST_HEAD_TIMEOUT_S", 10))
    # A stream whose client reads nothing for this long (every buffer full) is cut and aborted (499).
    stream_send_timeout_s: float = field(default_factory=lambda: _env_seconds("DECODE_SERVER_STREAM_SEND_TIMEOUT_S", 60))
    # A remote-prefill (P/D decode-leg) request with no first token this long after it started is
    # aborted with a 504 (runtime/kv_transfer.py): vLLM's NixlConnector does not bound a stalled KV
    # transfer. Queueing for a slot counts, and so does a `recompute` of a failed load.
    remote_prefill_timeout_s: float = field(default_factory=lambda: _env_seconds("DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S", 8))
    # Streams read by the one consumer, one pass per engine step (generate/one_pass.py); 0: each
    # stream its own vLLM `generate()` loop, as a vLLM without the collector it reads must have.
    one_pass_streams: bool = field(default_factory=lambda: os.environ.get("DECODE_SERVER_ONE_PASS", "1") != "0")


def _env_seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))
