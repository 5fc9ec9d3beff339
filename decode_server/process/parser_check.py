"""Start-up refusal: the parser flags must work with the served tokenizer, checked before the engine starts.

vLLM's ParserManager constructs the composed parser against a tokenizer and, when it cannot work
(`--tool-call-parser llama3_json` on a vocabulary without `<|python_tag|>`), raises one message
naming the flag, the parser and what the tokenizer lacks. `vllm serve` finds out once its engine
is up; here the tokenizer the engine will load is loaded first, where the engine will find it
(only when a parser flag is set), so a wrong flag costs no engine start and no traceback.
"""

from __future__ import annotations

import argparse
from typing import Any

from decode_server.config import DerenderConfig
from decode_server.generate.pipeline.derender_plan import compose_parser


def _model_type(args: argparse.Namespace) -> str | None:
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(args.model, revision=args.revision, trust_remote_code=args.trust_remote_code)
    except Exception:  # no config.json (e.g. a Mistral-format checkpoint): the engine reports that itself
        return None
    return config.get("model_type")


def _tokenizer(args: argparse.Namespace) -> Any:
    """The engine's tokenizer, loaded as the engine loads it: through vLLM's memo, keyed by the
    model config, so that the engine's own load in this process finds it (1.3 s of each start
    with the demo vocabulary, paid once, not twice)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.tokenizers.registry import cached_tokenizer_from_config

    return cached_tokenizer_from_config(AsyncEngineArgs.from_cli_args(args).create_model_config())


def _flags(config: DerenderConfig) -> str:
    flags = [f"--tool-call-parser {config.tool_call_parser}"] if config.tool_call_parser else []
    return " and ".join(flags + ([f"--reasoning-parser {config.reasoning_parser}"] if config.reasoning_parser else []))


def parser_refusal(args: argparse.Namespace, config: DerenderConfig, tokenizer: Any = None) -> str | None:
    """Why the server must not start with these parser flags, in one line; None when they work.
    `tokenizer`: the served one when already loaded (else it is loaded as the engine will)."""
    parsers = config.reasoning_parser or (config.tool_call_parser and config.enable_auto_tool_choice)
    if not parsers or args.skip_tokenizer_init or getattr(args, "tokens_only", False):
        return None  # no parser, or no tokenizer to parse with (the derender level is off)
    try:
        compose_parser(config, tokenizer or _tokenizer(args), args.model, _model_type(args))
    except Exception as e:  # vLLM's TypeError names the flags; the hf and Cohere paths raise their own
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return message if "--" in message else f"{_flags(config)} cannot be used with {args.model!r}: {message}"
    return None
