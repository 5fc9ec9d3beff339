"""Every `vllm serve` command line parses here, and every frontend flag is accounted for (issue #13).

The CLI is vLLM's own parser; `decode_server.process.frontend_flags` says what each frontend flag does
here, and the table in docs/configuration.md is that list. These checks build parsers only (no engine).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from decode_server.process.cli import build_parser, server_config
from decode_server.process.frontend_flags import ADDED_IN, IMPLEMENTED, NO_MEANING, frontend_dests, log_flags_without_meaning

CONFIGURATION = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"

# A decode-pod command line as llm-d's decode guide writes it for `vllm serve`.
LLM_D_DECODE = [
    "Qwen/Qwen3-0.6B", "--port", "8200", "--enforce-eager", "--block-size", "64",
    "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    "--disable-access-log-for-endpoints", "/health,/metrics,/ready", "--disable-uvicorn-access-log",
    "--uvicorn-log-level", "warning", "--shutdown-timeout", "60", "--enable-prompt-tokens-details",
    "--max-num-seqs", "256", "--gpu-memory-utilization", "0.9",
]
# One from vLLM's own docs: several keys, CORS, TLS, a root path, tool parsing, scale-out.
VLLM_DOCS = [
    "Qwen/Qwen3-8B", "--api-key", "K1", "K2", "--allowed-origins", '["https://a.example"]', "--allow-credentials",
    "--root-path", "/llm", "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
    "--chat-template", "tpl.jinja", "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--return-tokens-as-token-ids", "--sse-keep-alive-interval", "15", "--enable-request-id-headers",
    "--max-log-len", "100", "--enable-scale-out", "--enable-server-load-tracking",
    "--h11-max-header-count", "128", "--middleware", "my.module.Middleware", "--enable-log-outputs",
    "--enable-log-requests",
]


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.fixture(scope="module")
def serve(parser):
    return parser._subparsers._group_actions[0].choices["serve"]


def _engine_dests() -> set[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return {a.dest for a in AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())._actions}


def _own_dests() -> set[str]:
    return {"shutdown_timeout", "log_format", "max_request_bytes", "request_body_timeout"}


def test_every_frontend_flag_is_implemented_or_says_why_it_has_no_meaning(serve):
    dests = [d for d in frontend_dests(serve, _engine_dests()) if d not in _own_dests()]
    both = set(IMPLEMENTED) & set(NO_MEANING)
    assert not both, f"listed twice: {both}"
    missing = [d for d in dests if d not in IMPLEMENTED and d not in NO_MEANING]
    assert not missing, f"vLLM frontend flags with no entry in frontend_flags.py: {missing}"
    stale = (set(IMPLEMENTED) | set(NO_MEANING)) - set(dests)
    assert not stale, f"entries for flags vLLM no longer has: {stale}"


def _documented_rows() -> dict[str, str]:
    section = CONFIGURATION.read_text().split("## Every `vllm serve` flag", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `--([a-z0-9-]+)`[^|]*\| (.+?) \|$", section, re.M))


def test_the_documented_table_is_the_flag_list():
    rows = _documented_rows()
    expected = {d.replace("_", "-"): f"implemented: {v}" for d, v in IMPLEMENTED.items() if d != "model_tag"}
    expected |= {d.replace("_", "-"): f"no meaning here: {v}" for d, v in NO_MEANING.items()}
    # Every supported vLLM line's rows: the flags a later line added are listed, marked with it.
    expected |= {d.replace("_", "-"): f"no meaning here: {v}" for flags in ADDED_IN.values() for d, v in flags.items()}
    assert rows == expected


@pytest.mark.parametrize("argv", [LLM_D_DECODE, VLLM_DOCS], ids=["llm-d-decode-guide", "vllm-docs"])
def test_vllm_serve_command_lines_parse_unchanged(parser, argv):
    args = parser.parse_args(["serve", *argv])
    config = server_config(args)
    assert args.model_tag == argv[0]
    if argv is LLM_D_DECODE:
        assert args.shutdown_timeout == 60, "--shutdown-timeout is the drain knob"
        assert config.access_log is False and config.access_log_skip_paths == {"/health", "/metrics", "/ready"}
        assert config.prompt_tokens_details and args.kv_transfer_config.kv_connector == "NixlConnector"
    else:
        assert config.api_keys == ("K1", "K2")
        assert config.cors.allowed_origins == ("https://a.example",) and config.cors.allow_credentials
        assert config.derender.default_chat_template_kwargs == {"enable_thinking": False}
        assert config.derender.chat_template == "tpl.jinja" and config.return_tokens_as_token_ids
        assert config.sse_keep_alive_s == 15 and config.load_tracking and config.middleware == ("my.module.Middleware",)


def test_flags_without_meaning_are_named_in_one_log_line_each(parser, serve, caplog):
    args = parser.parse_args(["serve", *VLLM_DOCS])
    defaults = {a.dest: a.default for a in serve._actions}
    with caplog.at_level("WARNING", logger="decode_server.flags"):
        named = log_flags_without_meaning(args, defaults)
    assert named == ["max_log_len", "enable_log_outputs"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"--max-log-len has no meaning for decode-server and is ignored: {NO_MEANING['max_log_len']}",
        f"--enable-log-outputs has no meaning for decode-server and is ignored: {NO_MEANING['enable_log_outputs']}",
    ]


def test_the_drain_timeout_alias_and_the_default_drain(parser):
    assert parser.parse_args(["serve"]).shutdown_timeout == 30, "ours drains 30 s by default (vLLM: 0, abort)"
    assert parser.parse_args(["serve", "--drain-timeout", "5"]).shutdown_timeout == 5


def test_the_request_body_timeout_flag(parser, capsys):
    """30 s by default, any seconds >= 0 (0: no bound), into the server config; negative refused."""
    assert server_config(parser.parse_args(["serve"])).request_body_timeout_s == 30
    assert server_config(parser.parse_args(["serve", "--request-body-timeout", "2.5"])).request_body_timeout_s == 2.5
    assert server_config(parser.parse_args(["serve", "--request-body-timeout", "0"])).request_body_timeout_s == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--request-body-timeout", "-1"])
    assert "expected seconds >= 0, got -1" in capsys.readouterr().err


def test_vllm_api_key_from_the_environment_unless_the_flag_is_given(parser, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert server_config(parser.parse_args(["serve"])).api_keys == ("from-env",)
    assert server_config(parser.parse_args(["serve", "--api-key", "K"])).api_keys == ("K",), "the flag wins, as on vLLM"
