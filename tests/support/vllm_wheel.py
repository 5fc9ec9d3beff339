"""vLLM 0.33's pure-Python modules for the CPU venv: its wheel, cached, unpacked without native code.

`ensure(cache)` downloads `vllm==0.33.0` (no deps, binary only) into `cache/wheels` unless a wheel
is there, unpacks its `vllm/` package into `cache/vllm` without `.so` files, the `vllm-rs` binary
and C/C++/CUDA sources (re-unpacked when the wheel changes), byte-compiles it once, puts `orjson` (0.33 needs it; the CPU
build does not) into `cache/extra` unless importable, and returns the PYTHONPATH entries.
Raises `WheelUnavailable` with the reason when the wheel cannot be had.
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.33.0"
CACHE = Path(os.environ.get("DECODE_SERVER_VLLM033_CACHE", Path.home() / ".cache" / "decode-server" / f"vllm-{VERSION}"))
_NATIVE_SOURCES = (".h", ".hpp", ".cuh", ".cu", ".cpp", ".cc", ".c", ".inl")


class WheelUnavailable(RuntimeError):
    pass


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def _wheel(cache: Path) -> Path:
    wheels = cache / "wheels"
    found = sorted(wheels.glob(f"vllm-{VERSION}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    done = _pip("download", f"vllm=={VERSION}", "--no-deps", "--only-binary=:all:", "-d", str(wheels))
    found = sorted(wheels.glob(f"vllm-{VERSION}-*.whl"))
    if done.returncode or not found:
        raise WheelUnavailable(
            f"cannot download the vllm=={VERSION} wheel into {wheels} (offline? no package index?); put it there "
            f"by hand or set DECODE_SERVER_VLLM033_CACHE. pip said:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return found[0]


def _unpacked(wheel: Path, cache: Path) -> Path:
    dest = cache / "vllm"
    stamp = dest / ".unpacked-from"
    if stamp.is_file() and stamp.read_text() == wheel.name:
        return dest
    tmp = cache / "vllm.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            base = name.rsplit("/", 1)[-1]
            # Native code cannot run without its GPU build; only the Python modules are tested.
            if (not name.startswith("vllm/") or re.search(r"\.so(\.|$)", base) or name == "vllm/vllm-rs"
                    or base.endswith(_NATIVE_SOURCES)):
                continue
            z.extract(info, tmp)
    (tmp / ".unpacked-from").write_text(wheel.name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _compiled(dest: Path) -> Path:
    """Byte-compiled once: a run under PYTHONDONTWRITEBYTECODE would compile the ~700 modules it
    imports on every start (seconds)."""
    marker = dest / ".byte-compiled"
    if marker.is_file():
        return dest
    if not compileall.compile_dir(dest / "vllm", quiet=1):
        raise WheelUnavailable(f"cannot byte-compile vLLM {VERSION}'s modules in {dest}")
    marker.touch()
    return dest


def _extra(cache: Path) -> Path:
    extra = cache / "extra"
    if (extra / "orjson").is_dir() or subprocess.run([sys.executable, "-c", "import orjson"], capture_output=True).returncode == 0:
        extra.mkdir(parents=True, exist_ok=True)
        return extra
    done = _pip("install", "--quiet", "--target", str(extra), "orjson")
    if done.returncode:
        raise WheelUnavailable(f"cannot install orjson into {extra}:\n{done.stderr[-2000:]}")
    return extra


def ensure(cache: Path = CACHE) -> list[str]:
    """PYTHONPATH entries that make `import vllm` vLLM 0.33's modules."""
    return [str(_compiled(_unpacked(_wheel(cache), cache))), str(_extra(cache))]
