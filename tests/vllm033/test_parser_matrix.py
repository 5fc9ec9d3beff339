"""tests/app/vllm/test_parser_matrix.py on vLLM 0.33's modules: our derender on 0.33 against 0.33's own
coupled chat over the same scripted outputs — every family row of 0.33's line
(tests/support/parser_matrix/families.ROWS, each with its chunking property; the names only 0.33 registers
have family rows of their own), the start-up refusals of names that cannot run on the demo vocabulary,
the completeness check on 0.33's registries, and docs/parsers.md's names table against them."""

from __future__ import annotations

import hashlib

import pytest

from tests.support import family_tokenizers
from tests.support.parser_matrix import families as fm
from tests.support.parser_matrix.coverage import NEW_IN_033
from tests.support.parser_matrix.models import family_model
from tests.app.vllm.test_parser_matrix import (  # noqa: F401 (collected here)
    demo_tokenizer,
    test_a_parser_a_new_vllm_registers_fails_the_completeness_check,
    test_a_parser_without_its_familys_tokens_is_refused_at_start_up_with_its_reason,
    test_a_stale_parsers_doc_fails_the_check,
    test_docs_parsers_md_is_generated_from_these_rows,
    test_every_registered_parser_is_in_the_matrix_or_listed_with_its_reason,
    test_family_row_matches_vllms_chat,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="session")
def family_dir(demo_model):
    # Next to the cached demo model, keyed by what the directories are built from: built once per
    # machine, not once per session (this tier runs on every suite run).
    key = hashlib.sha256(repr((demo_model.name, family_tokenizers.FAMILIES, family_tokenizers.MERGES)).encode()).hexdigest()[:12]
    root = demo_model.parent / f"families-{key}"
    return lambda family: family_model(family, root, demo_model)


def test_this_tier_runs_on_033_and_every_new_name_has_a_family_row():
    assert fm.LINE == "0.33"
    in_rows = {("tool", r.tool_parser) for r in fm.ROWS} | {("reasoning", r.reasoning_parser) for r in fm.ROWS}
    assert not NEW_IN_033 - in_rows, NEW_IN_033 - in_rows
