"""schemathesis against our own /openapi.json: no response ≥ 500, every 4xx a valid error body.

The real app over the scripted engine on a loopback socket (vLLM's InputProcessor and
SamplingParams checks are real; see tests/support/loopback.py), with a 64-token context as before so
length rules are reached. CI runs a small fixed-seed run (FUZZ_EXAMPLES, default 60 per mode and
operation); the nightly size is `FUZZ_EXAMPLES=500 ./dev test -m reliability -k fuzz`.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.support.loopback import loopback

pytestmark = pytest.mark.reliability

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
OPERATIONS = [("/inference/v1/generate", "POST"), ("/inference/v1/abort_requests", "POST")]


@pytest.fixture(scope="module")
def fuzz_server(demo_model):
    # Later flags win in argparse, so the small context overrides the shared one.
    with loopback(demo_model, "--max-model-len", "64", "--max-request-bytes", "65536") as srv:
        yield srv


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
@pytest.mark.parametrize("path,method", OPERATIONS, ids=["generate", "abort"])
def test_no_5xx_and_every_4xx_has_an_error_body(fuzz_server, mode, path, method):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operation = schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(base_url=fuzz_server.url, timeout=60)
        assert response.status_code < 500, (response.status_code, response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error["message"], str) and error["message"]
            assert error["code"] == response.status_code

    check()
    assert fuzz_server.inproc.engine.live_request_count() == 0, "every fuzzed request ended"
