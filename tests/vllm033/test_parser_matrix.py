"""tests/app/vllm/test_parser_matrix.py's family rows on vLLM 0.33's modules: our derender on 0.33 against
0.33's own coupled chat over the same scripted outputs, each family's tokens and output format
(every row of tests/support/parser_matrix/families.ROWS)."""

from __future__ import annotations

import hashlib

import pytest

from tests.support import family_tokenizers
from tests.support.parser_matrix.models import family_model
from tests.app.vllm.test_parser_matrix import test_family_row_matches_vllms_chat  # noqa: F401 (collected here)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="session")
def family_dir(demo_model):
    # Next to the cached demo model, keyed by what the directories are built from: built once per
    # machine, not once per session (this tier runs on every suite run).
    key = hashlib.sha256(repr((demo_model.name, family_tokenizers.FAMILIES, family_tokenizers.MERGES)).encode()).hexdigest()[:12]
    root = demo_model.parent / f"families-{key}"
    return lambda family: family_model(family, root, demo_model)
