"""The request corpus of the vLLM differential test (tests/app/vllm/test_differential.py).

Every case is sent, unchanged, to vLLM 0.32's own server and to ours. Outputs are
deterministic: every body that can reach the engine carries a replay script
(`sampling_params.extra_args.replay_token_ids`, see decode_server/tools/replay.py), so
both engines emit the same tokens; the few bodies that cannot carry one (no
`sampling_params` at all, or an empty one) use a prompt that leaves at most 6
tokens of context and are compared by shape only.

Two parts:

- `HAND_WRITTEN`: every field of vLLM's `GenerateRequest` and `SamplingParams`,
  valid, invalid, at the boundary and of the wrong type; batch and stream; the
  tokens, text and derender levels; with and without an `X-Request-Id` header;
  bodies that are not JSON or not sent as JSON.
- `GENERATED`: bodies drawn by hypothesis from the two schemas (vLLM's
  `GenerateRequest.model_fields` and `SamplingParams` struct fields), fixed
  derandomized seed, `GENERATED_COUNT` of them, with bounded lengths so every
  one finishes in a few tokens.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from tests.support import scripted

PROMPT = [9707, 1879]  # "Hello world"
SCRIPT = [9707, 11, 1879, 0]  # "Hello, world!" (then the replay processor forces EOS)
EOS = 151645  # <|im_end|>
VOCAB_SIZE = 151936  # the demo model's embedding rows (= vLLM's out-of-vocabulary bound here)
MAX_MODEL_LEN = 4096  # tests/support/servers.py ENGINE_FLAGS
MAX_NUM_SEQS = 16
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
LONG = 4090  # a prompt that leaves 6 tokens of context: bounds a request with no max_tokens
GENERATED_COUNT = 30

_UNSET = object()


@dataclass(frozen=True)
class Case:
    """One request, sent identically to both servers."""

    id: str
    body: Any = None  # JSON-encoded unless `raw` is given
    raw: bytes | None = None  # sent as is (bodies that are not JSON)
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = "application/json"  # None: no Content-Type header at all
    # "exact": every field compared (ids and timestamps normalised);
    # "shape": output tokens are not scripted, so only status and field names are compared.
    compare: str = "exact"
    # A substring both servers' error messages must contain (where the message is meaningful).
    message: str | None = None
    generated: bool = False

    def encoded(self) -> bytes:
        return self.raw if self.raw is not None else json.dumps(self.body).encode()

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.content_type is not None:
            headers["Content-Type"] = self.content_type
        return headers


def _body(case_id: str, script: list[int] | None = SCRIPT, sp: dict[str, Any] | None = None, *,
          rid: Any = _UNSET, prompt: list[int] | None = None, **top: Any) -> dict[str, Any]:
    """A scripted body; request_id is `dc-<case id>` unless `rid` says otherwise (`None`: omitted)."""
    sp = {"max_tokens": 8} if sp is None else sp
    body = scripted(PROMPT if prompt is None else prompt, list(script or []), sampling_params=sp, **top)
    if script is None:
        del body["sampling_params"]["extra_args"]["replay_token_ids"]
        if not body["sampling_params"]["extra_args"]:
            del body["sampling_params"]["extra_args"]
    if rid is _UNSET:
        body = {"request_id": f"dc-{case_id}", **body}
    elif rid is not None:
        body = {"request_id": rid, **body}
    return body


def C(case_id: str, script: list[int] | None = SCRIPT, sp: dict[str, Any] | None = None, *,
      rid: Any = _UNSET, prompt: list[int] | None = None, headers: dict[str, str] | None = None,
      message: str | None = None, compare: str = "exact", **top: Any) -> Case:
    return Case(case_id, _body(case_id, script, sp, rid=rid, prompt=prompt, **top), headers=headers or {},
                message=message, compare=compare)


def SP(case_id: str, sp: dict[str, Any], script: list[int] | None = SCRIPT, *, message: str | None = None,
       **top: Any) -> Case:
    """A case about one sampling parameter: max_tokens 8 unless the case sets it."""
    return C(case_id, script, {"max_tokens": 8, **sp}, message=message, **top)


def _with(case: Case, case_id: str, **top: Any) -> Case:
    """A twin of `case` with more top-level fields; ids (body and header) stay unique, absent ones absent."""
    body = {**case.body, **top}
    if "request_id" in body:
        body["request_id"] = f"dc-{case_id}"
    headers = {k: f"{v}-{case_id}" for k, v in case.headers.items()}
    return Case(case_id, body, headers=headers, message=case.message, compare=case.compare)


# ---------------------------------------------------------------- hand-written

_success = [
    # request-level fields, tokens level
    C("minimal_scripted"),
    C("request_id_in_body", rid="dc-explicit-id"),
    C("request_id_absent", rid=None),
    C("request_id_header_only", rid=None, headers={"X-Request-Id": "dc-hdr-only"}),
    C("request_id_header_and_body", rid="dc-body-wins-or-not", headers={"X-Request-Id": "dc-hdr-and-body"}),
    C("request_id_empty_string", rid=""),
    C("request_id_long", rid="dc-" + "x" * 300),
    C("model_served", model="demo"),
    C("model_null", model=None),
    C("output_mode_tokens_explicit", output_mode="tokens"),
    C("stream_false", stream=False),
    C("stream_null", stream=None),
    C("return_token_ids", return_token_ids=True),
    C("return_token_ids_false", return_token_ids=False),
    C("cache_salt_ok", cache_salt="dc-salt-0123456789abcdef"),
    C("cache_salt_128_chars", cache_salt="s" * 128),
    C("priority_zero", priority=0),
    C("kv_transfer_params_empty", kv_transfer_params={}),
    C("kv_transfer_params_null", kv_transfer_params=None),
    C("ec_transfer_params_empty", ec_transfer_params={}),
    C("token_offsets", token_offsets=[[0, 5], [5, 11]]),
    C("content_parts_empty", content_parts=[]),
    C("reasoning_ended_true", reasoning_ended=True),
    C("reasoning_ended_false", reasoning_ended=False),
    C("reasoning_parser_kwargs", reasoning_parser_kwargs={"chat_template_kwargs": {"enable_thinking": False}}),
    C("unknown_top_level_field", future_field={"x": 1}),
    C("parse_context_at_tokens_level", parse_context={"tools": None}),
    C("stream_options_in_batch", stream_options={"include_usage": True}),
    C("token_id_last_in_vocab", prompt=[VOCAB_SIZE - 1]),
    C("token_id_zero", prompt=[0]),
    C("max_tokens_exact_fit", [], {"max_tokens": 8, "ignore_eos": True}, prompt=[9707] * (MAX_MODEL_LEN - 8)),
    C("max_tokens_defaulted_scripted", SCRIPT, {}),
    # sampling params, tokens level
    SP("n_1", {"n": 1}),
    SP("n_2", {"n": 2}),
    SP("presence_penalty", {"presence_penalty": 0.5}),
    SP("frequency_penalty", {"frequency_penalty": -0.5}),
    SP("repetition_penalty", {"repetition_penalty": 1.2}),
    SP("temperature_zero", {"temperature": 0}),
    SP("temperature_half", {"temperature": 0.5}),
    SP("top_p_half", {"top_p": 0.5}),
    SP("top_k_minus_one", {"top_k": -1}),
    SP("top_k_five", {"top_k": 5}),
    SP("min_p", {"min_p": 0.5}),
    SP("seed", {"seed": 42}),
    SP("seed_null", {"seed": None}),
    SP("stop_token_ids", {"stop_token_ids": [1879]}),
    SP("stop_token_ids_empty", {"stop_token_ids": []}),
    SP("ignore_eos", {"ignore_eos": True, "max_tokens": 6}),
    SP("max_tokens_1", {"max_tokens": 1}),
    SP("max_tokens_null_scripted", {"max_tokens": None}),
    SP("min_tokens", {"min_tokens": 2}),
    SP("logprobs_0", {"logprobs": 0}),
    SP("logprobs_5", {"logprobs": 5}),
    SP("logprobs_20", {"logprobs": 20}),
    SP("logprobs_null", {"logprobs": None}),
    SP("prompt_logprobs_0", {"prompt_logprobs": 0}),
    SP("prompt_logprobs_2", {"prompt_logprobs": 2}),
    SP("logprob_token_ids", {"logprobs": 1, "logprob_token_ids": [11, 1879]}),
    SP("flat_logprobs", {"logprobs": 2, "flat_logprobs": True}),
    SP("detokenize_false_tokens_level", {"detokenize": False}),
    SP("output_kind_client_sent", {"output_kind": 2}),
    SP("stream_interval", {"stream_interval": 2}),
    SP("skip_clone", {"skip_clone": True}),
    SP("structured_outputs_choice", {"structured_outputs": {"choice": ["Hello"]}}, [9707]),
    SP("structured_outputs_regex", {"structured_outputs": {"regex": "Hello, world!"}}),
    SP("logit_bias", {"logit_bias": {"9707": 5.0, "11": -5.0}}),
    SP("allowed_token_ids", {"allowed_token_ids": [*SCRIPT, EOS]}),
    SP("extra_args_other_key", {"extra_args": {"something_else": 1}}),
    SP("bad_words", {"bad_words": ["foo"]}),
    SP("skip_reading_prefix_cache", {"skip_reading_prefix_cache": True}),
    SP("repetition_detection", {"repetition_detection": {"max_pattern_size": 4, "min_count": 3}}),
    SP("routed_experts_prompt_start", {"routed_experts_prompt_start": 0}),
    SP("watermarking_false", {"watermarking": False}),
    SP("stop_string_tokens_level", {"stop": ["world"]}),
    SP("spaces_between_special_tokens_tokens_level", {"spaces_between_special_tokens": False}),
    # text level
    SP("text_plain", {}, output_mode="text"),
    SP("text_stop_string", {"stop": [" world"]}, output_mode="text"),
    SP("text_stop_string_single", {"stop": "!"}, output_mode="text"),
    SP("text_include_stop_str", {"stop": [" world"], "include_stop_str_in_output": True}, output_mode="text"),
    SP("text_logprobs_3", {"logprobs": 3}, output_mode="text"),
    SP("text_prompt_logprobs", {"prompt_logprobs": 1}, output_mode="text"),
    SP("text_n_2", {"n": 2}, output_mode="text"),
    SP("text_skip_special_tokens_false", {"skip_special_tokens": False, "ignore_eos": True, "max_tokens": 6},
       output_mode="text"),
    SP("text_spaces_between_special_tokens", {"skip_special_tokens": False, "spaces_between_special_tokens": False},
       [151644, 151644, 9707], output_mode="text"),
    SP("text_output_text_buffer_length", {"output_text_buffer_length": 3}, output_mode="text"),
    SP("text_bad_words", {"bad_words": ["foo"]}, output_mode="text"),
    SP("text_return_token_ids", {}, output_mode="text", return_token_ids=True),
]

# Stream twins: the successes worth seeing chunk by chunk.
_STREAM_TWINS = [
    "minimal_scripted", "request_id_absent", "request_id_header_only", "request_id_header_and_body",
    "return_token_ids", "n_2", "logprobs_5", "prompt_logprobs_2", "stop_token_ids", "ignore_eos",
    "stream_interval", "structured_outputs_choice", "text_plain", "text_stop_string", "text_include_stop_str",
    "text_logprobs_3", "text_n_2", "text_skip_special_tokens_false", "text_return_token_ids",
    "max_tokens_defaulted_scripted",
]
_by_id = {c.id: c for c in _success}
_streams = [_with(_by_id[i], f"stream_{i}", stream=True) for i in _STREAM_TWINS]
_streams += [
    C("stream_include_usage", stream=True, stream_options={"include_usage": True}),
    C("stream_continuous_usage", stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
    C("stream_continuous_usage_without_include", stream=True, stream_options={"continuous_usage_stats": True}),
    C("stream_options_null", stream=True, stream_options=None),
    SP("stream_text_usage_n_2", {"n": 2}, output_mode="text", stream=True, stream_options={"include_usage": True}),
    SP("stream_max_tokens_length", {"max_tokens": 2}, stream=True),
    SP("stream_text_stop_held_back", {"stop": ["!x"]}, output_mode="text", stream=True),
]

_DERENDER_CTX = {"tools": None, "tool_choice": "none", "include_reasoning": True}
_derender = [
    SP("derender_batch", {}, output_mode="derender", parse_context=_DERENDER_CTX),
    SP("derender_stream", {}, output_mode="derender", parse_context=_DERENDER_CTX, stream=True),
    SP("derender_no_context", {}, output_mode="derender"),
    SP("chat_request_at_tokens_level", {}, chat_request={"messages": [{"role": "user", "content": "hi"}]}),
]

_errors = [
    # request-level: missing, wrong type, boundary
    Case("no_sampling_params", {"request_id": "dc-no_sampling_params", "token_ids": [9707] * LONG}, compare="shape"),
    Case("sampling_params_null", {"request_id": "dc-sampling_params_null", "token_ids": PROMPT, "sampling_params": None}),
    Case("sampling_params_empty", {"request_id": "dc-sampling_params_empty", "token_ids": [9707] * LONG,
                                   "sampling_params": {}}, compare="shape"),
    Case("sampling_params_wrong_type", {"request_id": "dc-sampling_params_wrong_type", "token_ids": PROMPT,
                                        "sampling_params": [1, 2]}),
    Case("no_token_ids", {"request_id": "dc-no_token_ids", "sampling_params": {"max_tokens": 1}}),
    C("token_ids_empty", prompt=[]),
    C("token_ids_negative", prompt=[-1]),
    C("token_ids_beyond_vocab", prompt=[VOCAB_SIZE]),
    C("token_ids_far_beyond_vocab", prompt=[10**9]),
    C("token_ids_float_integral", prompt=[9707.0, 1879.0]),
    C("token_ids_float_fraction", prompt=[9707.5]),
    C("token_ids_string_digits", prompt=["9707"]),
    C("token_ids_bool", prompt=[True]),
    Case("token_ids_not_a_list", {"request_id": "dc-token_ids_not_a_list", "token_ids": "Hello",
                                  "sampling_params": {"max_tokens": 1}}),
    C("token_ids_int64_overflow", prompt=[2**64]),
    C("prompt_fills_context", [], {"max_tokens": 1}, prompt=[9707] * MAX_MODEL_LEN),
    C("prompt_beyond_context", [], {"max_tokens": 1}, prompt=[9707] * (MAX_MODEL_LEN + 1)),
    C("max_tokens_beyond_context_scripted", SCRIPT, {"max_tokens": MAX_MODEL_LEN - 1}),
    C("max_tokens_beyond_context_length", [], {"max_tokens": 8, "ignore_eos": True}, prompt=[9707] * LONG),
    C("request_id_wrong_type", rid=123),
    Case("request_id_null", {"request_id": None, **_body("request_id_null", rid=None)}),
    C("model_empty", model=""),
    C("model_unknown", model="not-served"),
    C("model_wrong_type", model=5),
    C("output_mode_unknown", output_mode="poetry"),
    C("output_mode_null", output_mode=None),
    C("output_mode_wrong_type", output_mode=1),
    C("stream_string_true", stream="true"),
    C("stream_int_1", stream=1),
    C("stream_string_yes", stream="yes"),
    C("stream_options_unknown_key", stream=True, stream_options={"bogus": 1}),
    C("stream_options_wrong_type", stream=True, stream_options="usage"),
    C("return_token_ids_string", return_token_ids="yes"),
    C("return_token_ids_string_true", return_token_ids="true"),
    C("reasoning_ended_string", reasoning_ended="false"),
    C("reasoning_parser_kwargs_unknown_key", reasoning_parser_kwargs={"bogus": 1}),
    C("cache_salt_empty", cache_salt=""),
    C("cache_salt_path_traversal", cache_salt="../../etc"),
    C("cache_salt_200_chars", cache_salt="s" * 200),
    C("cache_salt_1025_chars", cache_salt="s" * 1025),
    C("cache_salt_at_sign", cache_salt="user@host"),
    C("cache_salt_backslash", cache_salt="a\\b"),
    C("cache_salt_nul", cache_salt="a\x00b"),
    C("cache_salt_wrong_type", cache_salt=5),
    C("priority_nonzero", priority=1),
    C("priority_negative", priority=-1),
    C("priority_beyond_int64", priority=2**63),
    C("priority_string", priority="1"),
    C("priority_float", priority=1.5),
    C("kv_transfer_params_wrong_type", kv_transfer_params="x"),
    C("ec_transfer_params_wrong_type", ec_transfer_params=[1]),
    C("features_multimodal", features={"mm_hashes": {"image": ["h"]}, "mm_placeholders": {"image": [{"offset": 0, "length": 1}]}}),
    C("features_and_content_parts", features={"mm_hashes": {}, "mm_placeholders": {}}, content_parts=[{"type": "text"}]),
    C("content_parts_text", content_parts=[{"type": "text", "text": "hi"}]),
    C("token_offsets_wrong_type", token_offsets="0-5"),
    # sampling params: invalid, boundary, wrong type
    SP("n_0", {"n": 0}),
    SP("n_17_above_max_num_seqs", {"n": MAX_NUM_SEQS + 1}, message="max_num_seqs"),
    SP("n_string", {"n": "2"}),
    SP("n_float_integral", {"n": 2.0}),
    SP("presence_penalty_out_of_range", {"presence_penalty": 3.0}, message="presence_penalty"),
    SP("frequency_penalty_out_of_range", {"frequency_penalty": -3.0}, message="frequency_penalty"),
    SP("repetition_penalty_zero", {"repetition_penalty": 0}, message="repetition_penalty"),
    SP("temperature_negative", {"temperature": -1}, message="temperature must be non-negative"),
    SP("temperature_string", {"temperature": "hot"}),
    SP("temperature_numeric_string", {"temperature": "0.5"}),
    SP("top_p_zero", {"top_p": 0}, message="top_p must be in (0, 1]"),
    SP("top_p_two", {"top_p": 2}, message="top_p must be in (0, 1]"),
    SP("top_k_minus_two", {"top_k": -2}, message="top_k"),
    SP("min_p_two", {"min_p": 2}, message="min_p"),
    SP("seed_string", {"seed": "42"}),
    SP("seed_beyond_int64", {"seed": 2**64}),
    SP("stop_wrong_type", {"stop": 5}),
    SP("stop_empty_list", {"stop": []}),
    SP("stop_token_ids_wrong_type", {"stop_token_ids": "x"}),
    SP("ignore_eos_string", {"ignore_eos": "true"}),
    SP("max_tokens_0", {"max_tokens": 0}, message="max_tokens"),
    SP("max_tokens_negative", {"max_tokens": -1}, message="max_tokens"),
    SP("max_tokens_string", {"max_tokens": "8"}),
    SP("max_tokens_word", {"max_tokens": "eight"}),
    SP("max_tokens_float_integral", {"max_tokens": 8.0}),
    SP("max_tokens_float_fraction", {"max_tokens": 8.5}),
    SP("max_tokens_beyond_int64", {"max_tokens": 2**63}),
    SP("min_tokens_above_max_tokens", {"min_tokens": 9}, message="min_tokens"),
    SP("logprobs_minus_one", {"logprobs": -1}),
    SP("logprobs_21_above_max", {"logprobs": MAX_LOGPROBS + 1}),
    SP("logprobs_string", {"logprobs": "5"}),
    SP("prompt_logprobs_minus_one", {"prompt_logprobs": -1}),
    SP("prompt_logprobs_21_above_max", {"prompt_logprobs": MAX_LOGPROBS + 1}),
    # vLLM's CPU (V1 runner) answer names the runner; a V2-runner vLLM scores the ids (200).
    SP("prompt_logprob_token_ids", {"prompt_logprob_token_ids": [[11, 1879]]}, message="model runner"),
    SP("prompt_logprob_token_ids_stream", {"prompt_logprob_token_ids": [[11, 1879]]}, stream=True,
       message="not available when stream=true"),
    SP("prompt_logprob_start", {"prompt_logprobs": 1, "prompt_logprob_start": 1}),
    SP("detokenize_false_text_level", {"detokenize": False}, output_mode="text", message="detokenize"),
    SP("skip_special_tokens_string", {"skip_special_tokens": "no"}),
    SP("include_stop_str_in_output_int", {"include_stop_str_in_output": 1}),
    SP("structured_outputs_two_kinds", {"structured_outputs": {"regex": "a", "choice": ["a"]}}),
    SP("structured_outputs_bad_regex", {"structured_outputs": {"regex": "("}}),
    SP("structured_outputs_unknown_key", {"structured_outputs": {"bogus": 1}}),
    SP("structured_outputs_wrong_type", {"structured_outputs": "json"}),
    SP("logit_bias_bad_key", {"logit_bias": {"abc": 1.0}}),
    SP("allowed_token_ids_empty", {"allowed_token_ids": []}),
    SP("allowed_token_ids_beyond_vocab", {"allowed_token_ids": [VOCAB_SIZE + 10]}),
    Case("extra_args_wrong_type", {"request_id": "dc-extra_args_wrong_type", "token_ids": PROMPT,
                                   "sampling_params": {"max_tokens": 8, "extra_args": "x"}}, compare="shape"),
    SP("bad_words_wrong_type", {"bad_words": "foo"}),
    SP("thinking_token_budget", {"thinking_token_budget": 4}),
    SP("repetition_detection_unknown_key", {"repetition_detection": {"bogus": 1}}),
    SP("trace_decode_token_ids", {"trace_decode_token_ids": SCRIPT}),
    SP("watermarking_true", {"watermarking": True}),
    SP("unknown_sampling_key", {"temperatur": 0.5}),
    SP("private_sampling_key", {"_eos_token_id": 1}),
    # bodies that are not JSON, or not sent as JSON
    Case("body_not_json", raw=b"this is not json"),
    Case("body_empty", raw=b""),
    Case("body_json_array", body=[1, 2, 3]),
    Case("body_json_null", body=None),
    Case("body_truncated_json", raw=b'{"token_ids": [9707, 1879], "sampling_params": {'),
    Case("content_type_text_plain", _body("content_type_text_plain"), content_type="text/plain"),
    Case("content_type_absent", _body("content_type_absent"), content_type=None),
    Case("content_type_json_charset", _body("content_type_json_charset"), content_type="application/json; charset=utf-8"),
]

HAND_WRITTEN: list[Case] = [*_success, *_streams, *_derender, *_errors]


# ---------------------------------------------------------------- generated from the schemas


def _field_strategies():
    """One hypothesis strategy per field of vLLM's GenerateRequest and public SamplingParams,
    derived from the field's annotation (with boundary values and, sometimes, a wrong type),
    then bounded where an unbounded value would make a request long."""
    import msgspec
    from hypothesis import strategies as st
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
    from vllm.sampling_params import SamplingParams

    wrong = st.sampled_from(["8", "true", 1.5, [], {}, None, -1, True])
    ints = st.sampled_from([-1, 0, 1, 2, 3, 8]) | st.integers(-3, 8)
    floats = st.sampled_from([-2.5, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0]) | st.floats(-3, 3, allow_nan=False)
    short_text = st.sampled_from(["", "!", " world", "Hello", "x", "a@b", "../x"]) | st.text(max_size=6)

    def from_annotation(tp: Any):
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            return st.one_of([from_annotation(a) for a in typing.get_args(tp) if a is not type(None)] + [st.none()])
        if origin is typing.Literal:
            return st.sampled_from(list(typing.get_args(tp)))
        if tp is bool:
            return st.booleans()
        if tp is int:
            return ints
        if tp is float:
            return floats
        if tp is str:
            return short_text
        if origin is list:
            (item,) = typing.get_args(tp) or (int,)
            return st.lists(from_annotation(item), max_size=3)
        if origin is dict or tp is dict:
            return st.dictionaries(short_text, st.integers(0, 3), max_size=2)
        return st.just({})

    def field_strategy(name: str, tp: Any):
        return st.one_of(from_annotation(tp), from_annotation(tp), from_annotation(tp), wrong)

    # Fields whose random values would make a request long, non-deterministic, or the subject
    # of a hand-written case only (multimodal, structured outputs, prompt ids).
    sp_overrides = {
        "max_tokens": st.sampled_from([1, 2, 4, 8, 0, -1, "4", 4.0, None]),
        "min_tokens": st.sampled_from([0, 1, 2, 9]),
        "n": st.sampled_from([1, 2, 3, 0, "2", MAX_NUM_SEQS + 1]),
        "logprobs": st.sampled_from([None, 0, 1, 5, -1, MAX_LOGPROBS + 1, "2"]),
        "prompt_logprobs": st.sampled_from([None, 0, 1, 3, MAX_LOGPROBS + 1]),
        "stop_token_ids": st.lists(st.sampled_from([0, 11, 1879, 9707, -1]), max_size=2),
        "allowed_token_ids": st.sampled_from([[*SCRIPT, EOS], [], None]),
        "logit_bias": st.sampled_from([{"11": 1.0}, {"x": 1.0}, {}, None]),
        "output_kind": st.sampled_from([0, 1, 2, 7]),
        "stream_interval": st.sampled_from([None, 1, 2, 0]),
        "seed": st.sampled_from([None, 0, 42, -1, "7"]),
        "top_k": st.sampled_from([-2, -1, 0, 1, 5]),
    }
    sp_skip = {"extra_args", "structured_outputs", "prompt_logprob_token_ids", "trace_decode_token_ids",
               "repetition_detection", "ignore_eos", "skip_clone", "flat_logprobs", "bad_words"}
    sp_fields = {
        f.name: sp_overrides[f.name] if f.name in sp_overrides else field_strategy(f.name, f.type)
        for f in msgspec.structs.fields(SamplingParams)
        if not f.name.startswith("_") and f.name not in sp_skip
    }
    req_overrides = {
        "output_mode": st.sampled_from(["tokens", "text", "derender", "poetry", None]),
        "stream": st.sampled_from([True, False, None, "true", 1]),
        "stream_options": st.sampled_from([None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}, {"bogus": 1}]),
        "model": st.sampled_from(["demo", "", "other", None, 3]),
        "cache_salt": st.sampled_from(["salt", "", "a/b", "s" * 129, None, 7]),
        "priority": st.sampled_from([0, 1, -1, "0"]),
        "reasoning_parser_kwargs": st.sampled_from([None, {"chat_template_kwargs": {}}, {"bogus": 1}]),
        "kv_transfer_params": st.sampled_from([None, {}, {"do_remote_decode": False}]),
        "ec_transfer_params": st.sampled_from([None, {}]),
    }
    req_skip = {"request_id", "token_ids", "sampling_params", "features", "content_parts", "token_offsets"}
    req_fields = {
        name: req_overrides[name] if name in req_overrides else field_strategy(name, f.annotation)
        for name, f in GenerateRequest.model_fields.items()
        if name not in req_skip
    }
    return st, sp_fields, req_fields


def generated_cases(count: int = GENERATED_COUNT) -> list[Case]:
    from hypothesis import HealthCheck, Phase, given, settings

    st, sp_fields, req_fields = _field_strategies()

    @st.composite
    def bodies(draw):
        sp_keys = draw(st.lists(st.sampled_from(sorted(sp_fields)), max_size=4, unique=True))
        sp = {k: draw(sp_fields[k]) for k in sp_keys}
        sp["max_tokens"] = draw(sp_fields["max_tokens"])
        script = draw(st.lists(st.sampled_from([9707, 11, 1879, 0, 220]), min_size=1, max_size=5))
        sp["extra_args"] = {"replay_token_ids": script}
        req_keys = draw(st.lists(st.sampled_from(sorted(req_fields)), max_size=4, unique=True))
        body: dict[str, Any] = {k: draw(req_fields[k]) for k in req_keys}
        body["token_ids"] = draw(st.lists(st.sampled_from([9707, 1879, 11, 0, 151644]), min_size=1, max_size=4))
        body["sampling_params"] = sp
        id_mode = draw(st.sampled_from(["body", "body", "header", "none"]))
        return body, id_mode

    # Hypothesis explores by mutating recent examples, so consecutive draws are often near
    # duplicates: draw more than needed and keep the first example of each new field set.
    drawn: list[tuple[dict[str, Any], str]] = []
    seen: set[tuple] = set()

    @settings(max_examples=count * 20, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(bodies())
    def collect(example):
        body, id_mode = example
        signature = (tuple(sorted(body)), tuple(sorted(body["sampling_params"])), id_mode)
        if len(drawn) < count and signature not in seen:
            seen.add(signature)
            drawn.append(example)

    collect()
    cases = []
    for i, (body, id_mode) in enumerate(drawn):
        case_id = f"gen_{i:03d}"
        headers = {}
        if id_mode == "body":
            body = {"request_id": f"dc-{case_id}", **body}
        elif id_mode == "header":
            headers = {"X-Request-Id": f"dc-hdr-{case_id}"}
        cases.append(Case(case_id, body, headers=headers, generated=True))
    return cases


GENERATED: list[Case] = generated_cases()
CORPUS: list[Case] = [*HAND_WRITTEN, *GENERATED]
assert len({c.id for c in CORPUS}) == len(CORPUS), "case ids must be unique"
