"""What the server is configured with, and every default, written once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# As vLLM: no --host binds every interface.
DEFAULT_HOST = "0.0.0.0"
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
# vLLM's `--shutdown-timeout` governs the drain; vLLM's own default is 0 (no drain), ours 30 s.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# After the drain deadline, how long aborted streams get to send their last chunk.
DRAIN_FLUSH_S = 2.0
# After the engine dies, how long open streams get to send their error event before exit.
ENGINE_DEATH_GRACE_S = 2.0
ENGINE_WATCH_INTERVAL_S = 0.5
STATS_LOG_INTERVAL_S = 10.0
RETRY_AFTER_S = 1
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
