"""tests/app/process/test_cli_flags.py's checks on vLLM 0.33's argument parser (its flags, its command lines)."""

from tests.app.process.test_cli_flags import *  # noqa: F401,F403  (the same checks, collected here on 0.33)
