"""The container images' pins as their files under deploy/images/ and their Dockerfiles state them,
and the project's own dependencies: what tests/deploy/test_image_pins.py checks statically and
tests/deploy/test_images_resolve.py resolves."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
IMAGES_DIR = ROOT / "deploy" / "images"
PYPI = os.environ.get("DECODE_SERVER_PYPI_INDEX", "https://pypi.org/simple")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
RESOLVE_TIMEOUT_S = 300
NIXL_BUILDS = {canonicalize_name(f"nixl-cu{major}"): major for major in (12, 13)}

# Base images -> (Python minor, glibc minor) of their python3.
UBUNTU = {"22.04": ("3.10", 35), "24.04": ("3.12", 39)}
DEBIAN_SLIM_GLIBC = 36  # python:X.Y-slim is Debian bookworm (glibc 2.36) or newer


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: str

    @property
    def dir(self) -> Path:
        return IMAGES_DIR / self.name

    @property
    def text(self) -> str:
        return (ROOT / self.dockerfile).read_text()


IMAGES = [Image("gpu", "Dockerfile"), Image("cpu", "Dockerfile.cpu")]
# The project's extras every image installs with it (`pip install "/src[...]"`): OpenTelemetry, so
# deploy/components/otel-tracing needs no other image.
IMAGE_EXTRAS = ("tracing",)


def image_id(image: Image) -> str:
    return image.name


# ---------------------------------------------------------------- reading the pins


@dataclass
class PinFile:
    options: list[tuple[str, str]]  # (option, value), e.g. ("--extra-index-url", URL)
    requirements: list[Requirement]


def read_pins(path: Path) -> PinFile:
    """A requirements file restricted to what these images use: index options and exact pins."""
    options, requirements = [], []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            m = re.fullmatch(r"(--(?:extra-)?index-url)(?:=|\s+)(\S+)", line)
            assert m, f"{path.name}: unsupported option line {raw!r}"
            options.append((m[1], m[2]))
            continue
        requirements.append(Requirement(line))
    return PinFile(options, requirements)


def pinned_version(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==" and "*" not in spec.version, f"{req} is not an exact pin"
    return spec.version


def pins(image: Image) -> tuple[PinFile, PinFile]:
    return read_pins(image.dir / "requirements.txt"), read_pins(image.dir / "no-deps.txt")


def project_dependencies() -> list[str]:
    """What `pip install "/src[extras]"` in the images adds: the dependencies and IMAGE_EXTRAS'."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(r for extra in IMAGE_EXTRAS for r in project["optional-dependencies"][extra])]


def optional_dependencies() -> dict[str, list[Requirement]]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {k: [Requirement(r) for r in v] for k, v in extras.items()}


def python_and_glibc(image: Image) -> tuple[str, int]:
    # The base is the default of `ARG BASE_IMAGE` (FROM ${BASE_IMAGE}; tests/deploy/test_images.py).
    m = re.search(r"^ARG\s+BASE_IMAGE=(\S+)", image.text, re.M)
    assert m, f"{image.dockerfile}: no ARG BASE_IMAGE=<default>"
    base = m[1]
    m = re.fullmatch(r"python:(\d+\.\d+)-slim(?:-bookworm)?", base)
    if m:
        return m[1], DEBIAN_SLIM_GLIBC
    m = re.fullmatch(r"nvidia/cuda:[\w.-]+?-ubuntu(\d+\.\d+)", base)
    assert m, f"{image.dockerfile}: unknown base image {base}"
    assert m[1] in UBUNTU, f"{image.dockerfile}: add Ubuntu {m[1]}'s python3 and glibc to UBUNTU"
    return UBUNTU[m[1]]


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    return out
