"""The container images' pinned Python packages exist and resolve, without building the images.

Each Dockerfile installs its image's pins from deploy/images/<image>/: `pip install -r
requirements.txt` (resolved together), then `pip install --no-deps -r no-deps.txt` (NIXL's meta
package, whose own requirements would add a second NIXL CUDA build). Here pip resolves those same
files, plus the project's own dependencies (`pip install /src` comes next in the Dockerfile),
against the package indexes for the image's Python version and platform:

    pip install --dry-run --ignore-installed --report - --only-binary=:all: \
        --python-version X.Y --platform manylinux_2_N_x86_64 ... -r requirements.txt

No Docker daemon, nothing installed. pip's own configuration (find-links, local indexes,
constraints) is ignored so the answer is the one a Docker build would get. The resolution reads
wheel metadata through HTTP range requests (pip's `fast-deps`) where an index publishes no
separate metadata files, so no multi-GB CUDA wheels are downloaded; each image takes well under
a minute on a normal link and is capped at RESOLVE_TIMEOUT_S.

The network part skips, saying so, only when an index cannot be reached. PyTorch's CPU index
(download.pytorch.org) serves one pin only, torch==2.13.0+cpu; when it is unreachable but a wheel
for exactly that pin lies in a local folder (DECODE_SERVER_WHEELS, or pip's configured
find-links), that wheel stands in for the index and the test says so. The static checks (pins
exact, one NIXL build, the Dockerfiles install these files, PID 1 is the server) need no network.

Overrides: DECODE_SERVER_PYPI_INDEX (a PyPI mirror), DECODE_SERVER_TORCH_INDEX (a PyTorch index
mirror), DECODE_SERVER_WHEELS (a folder of wheels); DECODE_SERVER_OFFLINE=1 skips the network part.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.support.image_pins import (
    IMAGES, NIXL_BUILDS, PYPI, RESOLVE_TIMEOUT_S, TORCH_CPU_INDEX, Image, image_id, pinned_version, pins,
    project_dependencies, python_and_glibc,
)

# ---------------------------------------------------------------- resolution (network)


def _context() -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cafile if cafile and os.path.exists(cafile) else None)


def unreachable(url: str) -> str | None:
    """Why url cannot be reached, or None when it answers (any HTTP status)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10, context=_context()).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {getattr(e, 'reason', e)}"
    return None


def local_wheel_dirs() -> list[Path]:
    dirs = [os.environ.get("DECODE_SERVER_WHEELS", "")]
    dirs += os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=30).stdout
        dirs += [d for m in re.finditer(r"find-links='([^']*)'", out) for d in m[1].split()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return [Path(d) for d in dict.fromkeys(dirs) if d and Path(d).is_dir()]


def local_wheel_for(req: Requirement, python: str) -> Path | None:
    want, py = pinned_version(req), "cp" + python.replace(".", "")
    for directory in local_wheel_dirs():
        for wheel in directory.glob("*.whl"):
            try:
                name, version, _, tags = parse_wheel_filename(wheel.name)
            except ValueError:
                continue
            if canonicalize_name(name) == canonicalize_name(req.name) and str(version) == want and any(
                t.interpreter in (py, "py3") and t.platform.endswith("x86_64") for t in tags
            ):
                return wheel
    return None


def platform_args(glibc: int) -> list[str]:
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc, 4, -1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return [arg for tag in tags for arg in ("--platform", tag)]


def pip_env() -> dict[str, str]:
    """pip without this machine's configuration (find-links, local indexes, constraints)."""
    keep = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_TRUSTED_HOST", "PIP_PROXY"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in keep}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def run_pip_report(args: list[str], report: Path, timeout: float) -> dict:
    base = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--report", str(report), "--timeout", "30", "--retries", "2"]
    for fast_deps in (["--use-feature=fast-deps"], []):
        try:
            out = subprocess.run([*base, *fast_deps, *args], capture_output=True, text=True, timeout=timeout, env=pip_env())
        except subprocess.TimeoutExpired:
            pytest.fail(f"pip did not resolve within {timeout:.0f} s: pip {' '.join(args)}")
        if out.returncode != 0 and fast_deps and "fast-deps" in out.stderr and "invalid choice" in out.stderr:
            continue  # a pip without the feature: resolve the slow way
        assert out.returncode == 0, f"pip could not resolve the pins:\n{out.stderr[-6000:]}"
        return json.loads(report.read_text())
    raise AssertionError("unreachable")


def _pypi() -> str:
    if os.environ.get("DECODE_SERVER_OFFLINE"):
        pytest.skip("DECODE_SERVER_OFFLINE is set: resolution against the package indexes not checked")
    reason = unreachable(PYPI.rstrip("/") + "/pip/")
    if reason:
        pytest.skip(f"package index unreachable, resolution not checked: {reason}")
    return PYPI


def resolve(image: Image, pypi: str, tmp_path: Path) -> tuple[dict, dict, list[str]]:
    """The pip reports for requirements.txt (+ the project's dependencies) and no-deps.txt."""
    resolved, no_deps = pins(image)
    python, glibc = python_and_glibc(image)
    target = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python, *platform_args(glibc)]
    index = ["--index-url", pypi]
    notes = []
    for option, url in resolved.options:
        assert option == "--extra-index-url", f"{option}: the images use PyPI plus extra indexes only"
        if url == TORCH_CPU_INDEX and os.environ.get("DECODE_SERVER_TORCH_INDEX"):
            url = os.environ["DECODE_SERVER_TORCH_INDEX"]
        reason = unreachable(url.rstrip("/") + "/")
        if reason is None:
            index += ["--extra-index-url", url]
            continue
        # Only PyTorch's "+cpu" builds come from that index; a local wheel of the same pin stands in.
        local = [r for r in resolved.requirements if Version(pinned_version(r)).local]
        wheels = [local_wheel_for(r, python) for r in local]
        if not local or not all(wheels):
            pytest.skip(f"package index unreachable, {image.name} image not resolved: {reason}; "
                        f"no local wheel for {', '.join(map(str, local)) or 'its pins'} either")
        index += [arg for w in wheels for arg in ("--find-links", str(w.parent))]
        notes.append(f"{url} unreachable ({reason}); {', '.join(w.name for w in wheels)} from a local folder stood in for it")
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both wait on the network, not the CPU
        main = pool.submit(
            run_pip_report,
            [*target, *index, *(str(r) for r in resolved.requirements), *project_dependencies()],
            tmp_path / "report.json",
            RESOLVE_TIMEOUT_S,
        )
        meta = pool.submit(
            run_pip_report,
            [*target, "--index-url", pypi, "--no-deps", *(str(r) for r in no_deps.requirements)],
            tmp_path / "no-deps.json",
            120,
        )
        main_report, meta_report = main.result(), meta.result()
    notes.append(f"resolved {len(main_report['install'])} packages in {time.monotonic() - started:.1f} s")
    return main_report, meta_report, notes


_resolutions: dict[str, concurrent.futures.Future] = {}


def _resolve_in(image: Image, directory: Path) -> tuple[dict, dict, list[str]]:
    directory.mkdir(parents=True)
    return resolve(image, _pypi(), directory)


def _start() -> dict[str, concurrent.futures.Future]:
    if not _resolutions:
        pool = concurrent.futures.ThreadPoolExecutor(len(IMAGES), thread_name_prefix="image-resolution")
        root = Path(tempfile.mkdtemp(prefix="image-resolution-"))
        _resolutions.update({image.name: pool.submit(_resolve_in, image, root / image.name) for image in IMAGES})
        pool.shutdown(wait=False)
    return _resolutions


@pytest.fixture(scope="module")
def resolutions():
    """Each test waits for its own image and fails or skips alone (a skip or failure raised in the
    worker is raised again by the test's `result()`)."""
    return _start()


def installed(report: dict) -> dict[str, dict]:
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_image_pins_resolve(image, resolutions, record_property):
    main, meta_report, notes = resolutions[image.name].result()
    for note in notes:
        print(f"[{image.name}] {note}")
    record_property("resolution", "; ".join(notes))
    got = installed(main)
    resolved, _ = pins(image)
    for req in resolved.requirements:
        name = canonicalize_name(req.name)
        assert name in got and got[name]["version"] == pinned_version(req), f"{req} resolved to {got.get(name, {}).get('version')}"

    # The project's own requirements, the image extras' included, resolve with the pins (they are
    # ranges, not pinned; vLLM itself requires the same OpenTelemetry packages as `tracing`).
    for req in map(Requirement, project_dependencies()):
        name = canonicalize_name(req.name)
        assert name in got and req.specifier.contains(got[name]["version"], prereleases=True), f"{req}: {got.get(name, {}).get('version')}"

    # Exactly one NIXL CUDA build, and nothing else pulls in the meta package or the other build.
    builds = sorted(n for n in got if n in NIXL_BUILDS)
    assert len(builds) == 1, f"NIXL builds in the {image.name} image: {builds}"
    assert "nixl" not in got, "something requires NIXL's meta package, which would bring both builds"
    build = builds[0]

    # The meta package (installed --no-deps) finds what it needs, bar the other CUDA build.
    (meta,) = meta_report["install"]
    assert canonicalize_name(meta["metadata"]["name"]) == "nixl"
    for line in meta["metadata"].get("requires_dist", []):
        req = Requirement(line)
        if req.marker and "extra" in str(req.marker):
            continue
        name = canonicalize_name(req.name)
        if name in NIXL_BUILDS and name != build:
            continue  # left out on purpose
        assert name in got and req.specifier.contains(got[name]["version"], prereleases=True), f"nixl needs {req}"

    torch = got["torch"]
    if image.name == "gpu":
        # torch's CUDA (cuda-toolkit / nvidia-*-cuXX requirements) is the NIXL build's.
        cuda = {int(m) for line in torch.get("requires_dist", [])
                for m in re.findall(r"(?:cuda-toolkit\S*==|-cu)(\d+)", line)}
        assert cuda == {NIXL_BUILDS[build]}, f"torch {torch['version']} is built for CUDA {cuda}, NIXL for {NIXL_BUILDS[build]}"
    else:
        assert Version(torch["version"]).local == "cpu"
        cuda_stack = sorted(n for n in got if n.startswith(("nvidia-", "cuda-")))
        assert cuda_stack == [], f"the CPU image would install CUDA packages: {cuda_stack}"
