"""The mistral-mode family row's model and scripts (tests/support/parser_matrix/mistral_mode.py): vLLM
loads the directory as mistral_common's tokenizer, and a script's control tokens are their ids."""

from __future__ import annotations

import pytest

from tests.support.parser_matrix import families as fm
from tests.support.parser_matrix.formats import FORMATS
from tests.support.parser_matrix.mistral_mode import build_mistral_model, script_of

CALLS = FORMATS["mistral_v3"].calls([("get_weather", fm.WEATHER_ARGS), ("search", fm.SEARCH_ARGS)])


@pytest.fixture(scope="module")
def mistral_tokenizer(tmp_path_factory, demo_model):
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(build_mistral_model(tmp_path_factory.mktemp("mistral"), demo_model)), tokenizer_mode="mistral")


def test_the_row_is_served_by_mistral_commons_tekken_v3(mistral_tokenizer):
    assert type(mistral_tokenizer).__name__ == "MistralTokenizer"
    assert (mistral_tokenizer.is_tekken, mistral_tokenizer.version) == (True, 3)  # pre-v11: the JSON-list calls
    assert "[THINK]" not in mistral_tokenizer.get_vocab() and mistral_tokenizer.eos_token_id == 2


def test_a_scripts_control_tokens_are_their_ids(mistral_tokenizer):
    tool_calls = mistral_tokenizer.get_vocab()["[TOOL_CALLS]"]
    script = script_of(mistral_tokenizer, "Let me check. " + CALLS)
    assert script.count(tool_calls) == 1
    assert mistral_tokenizer.decode(script, skip_special_tokens=False) == "Let me check. " + CALLS
    # mistral_common's own encode reads `[TOOL_CALLS]` as text: a script from it holds no call marker.
    assert tool_calls not in mistral_tokenizer.encode(CALLS, add_special_tokens=False)


def test_an_hf_tokenizers_script_is_its_own_encoding(tokenizer):
    text = "<tool_call>\n" + CALLS + "\n</tool_call>"
    assert script_of(tokenizer, text) == tokenizer.encode(text, add_special_tokens=False)
