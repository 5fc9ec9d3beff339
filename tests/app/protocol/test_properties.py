"""Property tests of the request decoder and the validation rules (pure stages, no engine).

Any JSON value becomes a GenerateRequest or a clean 4xx (`Rejected` / msgspec's
error with a message) — never another exception escaping to a 500.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decode_server.runtime.engine import EngineLimits
from decode_server.errors import Rejected
from decode_server.generate.admission import checked_sampling_params
from decode_server.generate.modes import MODES
from protocol.generate import GenerateRequest, SamplingParams

pytestmark = pytest.mark.reliability

LIMITS = EngineLimits(
    vocab_size=151936, max_model_len=4096, max_num_seqs=16, max_logprobs=20, has_tokenizer=True
)
SAMPLING_KEYS = list(msgspec.structs.fields(SamplingParams))

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
sampling_dicts = st.dictionaries(st.sampled_from([f.name for f in SAMPLING_KEYS]), json_values, max_size=6)
request_dicts = st.fixed_dictionaries(
    {"token_ids": st.lists(st.integers(-5, 200_000), max_size=8)},
    optional={
        "sampling_params": sampling_dicts,
        "output_mode": st.sampled_from(["tokens", "text", "derender", "x"]) | json_values,
        "stream": json_values,
        "stream_options": json_values,
        "priority": json_values,
        "cache_salt": json_values,
        "kv_transfer_params": json_values,
        "request_id": json_values,
    },
)


def _decode_and_validate(raw: bytes) -> None:
    try:
        req = msgspec.json.decode(raw, type=GenerateRequest)
    except msgspec.MsgspecError as e:
        assert str(e)  # the 400 message
        return
    try:
        checked_sampling_params(req, MODES[req.output_mode], LIMITS, tokens_only=False, generation_defaults={})
    except Rejected as e:
        assert e.status in (400, 404, 413) and e.message


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(json_values)
def test_any_json_value_is_a_request_or_a_clean_error(value):
    _decode_and_validate(msgspec.json.encode(value))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(request_dicts)
def test_request_shaped_json_is_a_request_or_a_clean_error(value):
    _decode_and_validate(msgspec.json.encode(value))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_the_decoder(raw):
    _decode_and_validate(raw)
