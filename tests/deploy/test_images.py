"""The Dockerfiles, checked without building them (deploy/images/smoke.sh builds and runs them).

What the image check found when the images were first built (issue 32) and what can be seen in the
files themselves: the `docker run` usage lines need `--shm-size` (the default 64 MB /dev/shm stops the
engine at start); the base is `ARG BASE_IMAGE` (smoke.sh builds on stand-ins); build-time settings are
ARGs, never ENV (an ENV stays in every container's environment); nothing is mounted into a build
from the Dockerfile; the HEALTHCHECK asks the port the server was started with, not a fixed 8000.
The healthcheck script itself runs here against a local HTTP server.
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.image_pins import IMAGES, ROOT, dockerfile_instructions

HEALTHCHECK_SCRIPT = ROOT / "deploy" / "images" / "healthcheck.sh"
SMOKE = ROOT / "deploy" / "images" / "smoke.sh"
# Settings a build needs that no container should carry: pip's (index, CA, find-links, cache),
# apt's front end, CA bundles, proxies.
BUILD_TIME_ENV = re.compile(r"^(PIP_\w+|DEBIAN_FRONTEND|SSL_CERT_\w+|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|(?i:https?_proxy|no_proxy))$")


def _id(image) -> str:
    return image.name


def usage_lines(image, verb: str) -> list[list[str]]:
    """The header's `docker <verb>` lines (continuations joined), as shell words."""
    header = []
    for line in image.text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:].strip())
    lines, current = [], ""
    for line in header:
        current += line
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        words = shlex.split(current, comments=True)
        if words[:2] == ["docker", verb]:
            lines.append(words)
        current = ""
    return lines


def env_keys(args: str) -> list[str]:
    """The variable names of one ENV instruction (`K=V K2=V2` or the legacy `K V`)."""
    words = shlex.split(args)
    if words and "=" not in words[0]:
        return [words[0]]
    return [w.split("=", 1)[0] for w in words]


def shm_bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)([bkmg]?)", size.lower())
    assert m, f"--shm-size {size}: not a docker size"
    return int(m[1]) * {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m[2]]


@pytest.mark.parametrize("image", IMAGES, ids=_id)
def test_usage_lines_build_this_file_and_run_it_with_shared_memory(image):
    """The engine needs 160 MiB of /dev/shm for the demo model and stopped at start with the 64 MB
    default ("160 MiB required, 62 MiB free"): every run line sets --shm-size, 1 GiB or more. The
    first build and run lines are what smoke.sh runs, word for word (no quotes)."""
    builds, runs = usage_lines(image, "build"), usage_lines(image, "run")
    assert builds and runs, f"{image.dockerfile}: no docker build / docker run usage lines"
    build = builds[0]
    dockerfile = build[build.index("-f") + 1] if "-f" in build else "Dockerfile"
    assert dockerfile == image.dockerfile, f"the build line builds {dockerfile}"
    tag = build[build.index("-t") + 1]
    for run in runs:
        options = run[2:]
        sizes = [options[i + 1] for i, w in enumerate(options) if w == "--shm-size"]
        sizes += [w.split("=", 1)[1] for w in options if w.startswith("--shm-size=")]
        assert sizes and shm_bytes(sizes[-1]) >= 2**30 or "--ipc=host" in options, f"no --shm-size of 1g or more: {shlex.join(run)}"
        assert tag in run, f"the run line does not run the image the build line tags ({tag}): {shlex.join(run)}"
    raw = image.text.splitlines()
    firsts = [next(line for line in raw if re.match(rf"#\s+docker {verb} ", line)) for verb in ("build", "run")]
    assert not any(c in line for line in firsts for c in "'\"$`"), f"smoke.sh reads these lines as plain words: {firsts}"


@pytest.mark.parametrize("image", IMAGES, ids=_id)
def test_the_base_is_an_argument(image):
    """`ARG BASE_IMAGE=<default>` before the one FROM, which uses it: smoke.sh builds on a stand-in."""
    instructions = dockerfile_instructions(image.text)
    froms = [args for word, args in instructions if word == "FROM"]
    assert froms == ["${BASE_IMAGE}"], froms
    before = instructions[: [w for w, _ in instructions].index("FROM")]
    assert [(w, a.split("=", 1)[0]) for w, a in before] == [("ARG", "BASE_IMAGE")], before
    assert "=" in before[0][1] and before[0][1].split("=", 1)[1], "BASE_IMAGE needs a default (the real base)"


@pytest.mark.parametrize("image", IMAGES, ids=_id)
def test_build_time_settings_stay_out_of_the_image(image):
    """pip's and apt's build settings are ARGs (in the RUN steps' environment only); no step
    mounts anything or writes a pip configuration into the image; the pip configuration a build
    may be given (PIP_CONFIG_FILE) is an ARG without a default."""
    instructions = dockerfile_instructions(image.text)
    for word, args in instructions:
        if word == "ENV":
            leaked = [k for k in env_keys(args) if BUILD_TIME_ENV.match(k)]
            assert not leaked, f"ENV {leaked}: a build-time setting every container would carry; make it an ARG"
        if word in ("RUN", "COPY", "ADD"):
            assert "--mount" not in args, f"{word} --mount: smoke.sh mounts the build's pip configuration at /mnt instead"
            assert not re.search(r"pip3? config|pip\.conf|/etc/xdg/pip|PIP_\w+=", args), f"{word} writes a pip setting: {args}"
    args = {a.split("=", 1)[0]: a for w, a in instructions if w == "ARG"}
    assert args.get("PIP_CONFIG_FILE") == "PIP_CONFIG_FILE", "ARG PIP_CONFIG_FILE, no default"
    for name in ("DEBIAN_FRONTEND", "PIP_NO_CACHE_DIR"):
        assert name in args, f"ARG {name}"


@pytest.mark.parametrize("image", IMAGES, ids=_id)
def test_the_healthcheck_follows_the_port(image):
    """The HEALTHCHECK runs deploy/images/healthcheck.sh (copied in, curl installed), which reads the
    port from the server's arguments; no port is written in it."""
    instructions = dockerfile_instructions(image.text)
    (health,) = [args for word, args in instructions if word == "HEALTHCHECK"]
    assert "8000" not in health, f"HEALTHCHECK with a fixed port: {health}"
    cmd = health.split(" CMD ", 1)[1].strip()
    assert cmd.startswith("["), "exec form: no shell needed"
    copies = [args.split() for word, args in instructions if word == "COPY"]
    assert ["deploy/images/healthcheck.sh", "/usr/local/bin/decode-server-healthcheck"] in copies
    assert re.search(r'\["(/usr/local/bin/)?decode-server-healthcheck"\]', cmd), cmd
    installs = " ".join(args for word, args in instructions if word == "RUN" and "apt-get install" in args)
    assert re.search(r"\bcurl\b", installs), "the healthcheck runs curl"
    assert os.access(HEALTHCHECK_SCRIPT, os.X_OK), "healthcheck.sh must be executable: COPY keeps the build context's mode"


def test_dockerignore_lets_the_healthcheck_in():
    lines = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "!deploy/images" in lines or "!deploy/images/healthcheck.sh" in lines


# ---------------------------------------------------------------- the healthcheck script, run


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    _Health.status = 200


def run_healthcheck(tmp_path: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"".join(a.encode() + b"\0" for a in ("/usr/local/bin/python", "/usr/local/bin/decode-server", "serve", "--host", "0.0.0.0", *args)))
    env = {**os.environ, "DECODE_SERVER_HEALTHCHECK_CMDLINE": str(cmdline)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["sh", str(HEALTHCHECK_SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("form", ["--port N", "--port=N"])
def test_healthcheck_asks_the_port_in_the_servers_arguments(tmp_path, health_server, form):
    port = health_server.server_address[1]
    args = form.replace("N", str(port)).split()
    assert run_healthcheck(tmp_path, "Qwen/Qwen3-8B", *args).returncode == 0
    _Health.status = 503
    assert run_healthcheck(tmp_path, *args).returncode != 0, "a 503 is unhealthy"


def test_healthcheck_fails_where_nothing_listens(tmp_path, health_server):
    # The server listens on its own port; the arguments name another, where nothing answers.
    done = run_healthcheck(tmp_path, "--port", str(closed_port()))
    assert done.returncode != 0


def test_healthcheck_url_defaults_and_tls(tmp_path):
    """Which URL it asks, through a curl that prints its arguments: no --port → 8000 (the CLI's
    default), the last --port wins (argparse), --ssl-certfile → https."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text('#!/bin/sh\nfor a; do last=$a; done; echo "$last"\n')
    (bin_dir / "curl").chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"

    def url(*args: str) -> str:
        done = run_healthcheck(tmp_path, *args, path=path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert url() == "http://127.0.0.1:8000/health"
    assert url("--port", "9001", "--port=9002") == "http://127.0.0.1:9002/health"
    assert url("--port=9002", "--port", "9003") == "http://127.0.0.1:9003/health"
    assert url("--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--port", "8443") == "https://127.0.0.1:8443/health"


def test_smoke_script_parses():
    done = subprocess.run(["bash", "-n", str(SMOKE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.access(SMOKE, os.X_OK)
