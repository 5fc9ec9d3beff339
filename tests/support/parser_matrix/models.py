"""The model directory of a family row: the demo model with the family's tokens, or gpt-oss's.

gpt_oss is not a variant of the demo vocabulary (tests/support/harmony_model.py): it is built
from o200k_base (tests/support/o200k.py, cached with it), and openai_harmony must find that vocabulary in
TIKTOKEN_ENCODINGS_BASE, which is set here, for the rest of the process, to the hash-checked copy.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.family_tokenizers import build_family_model
from tests.support.harmony_model import CACHE_SUBDIR, build_harmony_model
from tests.support import o200k
from tests.support.parser_matrix import mistral_mode


def family_model(family: str, root: Path, demo_model: Path) -> Path:
    """`family`'s model directory under `root` (built once), on `demo_model`'s vocabulary."""
    if family == mistral_mode.FAMILY:
        return mistral_mode.build_mistral_model(root, demo_model)
    if family != "gpt_oss":
        return build_family_model(family, root / family, demo_model)
    vocabulary = o200k.ensure()
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(vocabulary)
    return build_harmony_model(vocabulary / CACHE_SUBDIR, vocabulary / o200k.FILE)
