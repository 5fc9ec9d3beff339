"""`--log-format json` for vLLM's own loggers too, in every process vLLM starts.

vLLM configures its `vllm` logger with a text handler of its own (`logger.py`) when it is imported,
and again in the engine core and each worker from the `LoggingConfig` its `VllmConfig` carries,
whose default config file is VLLM_LOGGING_CONFIG_PATH. Set before vLLM is imported, that variable
reaches every one of those processes: it names a `dictConfig` file here that sends `vllm` to the
root logger and gives the root our JSON handler, so every process writes the same
one-object-per-line format to stderr. Python warnings are routed into logging in each process as
the handler is built (a warning is otherwise a bare text line).

Lines that never pass through logging are wrapped on their way out (stdio_json.py).

An operator's own config file (VLLM_LOGGING_CONFIG_PATH, or `--logging-config.pylogging_config_file`,
which wins over it) or VLLM_CONFIGURE_LOGGING=0 is left as it is.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import logging.config
import os
import tempfile

from decode_server.process.stdio_json import relay_stdio_as_json
from decode_server.runtime.access_log import JsonFormatter


def stderr_handler() -> logging.Handler:
    """The JSON handler, as `dictConfig` builds it in each vLLM process."""
    logging.captureWarnings(True)
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    return handler


def dict_config(level: str) -> dict:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"json": {"()": f"{__name__}.stderr_handler"}},
        "loggers": {"vllm": {"level": level, "handlers": [], "propagate": True}},
        "root": {"level": level, "handlers": ["json"]},
    }


def use_json_logs(argv: list[str]) -> None:
    """With `serve ... --log-format json`: VLLM_LOGGING_CONFIG_PATH names a JSON `dictConfig`,
    before vLLM is first imported (it configures its loggers on import) and so for every process
    it starts (they inherit the environment; each builds its `LoggingConfig` from it). Unless the
    operator configured vLLM's logging themselves."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--log-format")
    early.add_argument("--log-level")
    known, _ = early.parse_known_args(argv)
    if known.log_format != "json" or os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        return
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    level = (known.log_level or os.environ.get("VLLM_LOGGING_LEVEL") or "INFO").upper()
    fd, path = tempfile.mkstemp(prefix="decode-server-logging-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(dict_config(level), f)
    atexit.register(_remove, path, os.getpid())
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    relay_stdio_as_json()  # the lines that bypass logging (a print, libtorch's C++ warnings)
    # This process logs from its first import on (vLLM warns while importing); a forked child
    # (vLLM's default start method) inherits it.
    logging.config.dictConfig(dict_config(level))


def _remove(path: str, owner: int) -> None:
    if os.getpid() != owner:  # a forked child inherits the hook; the file outlives it
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
