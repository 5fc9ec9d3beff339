# decode-server on NVIDIA GPUs: vLLM 0.33.0 (CUDA 13 wheels) + NIXL (CUDA 13 build) for disaggregated KV transfer.
#   docker build -t decode-server:0.1.0 .
#   docker run --gpus all --shm-size 8g -p 8000:8000 decode-server:0.1.0                     # the demo model
#   docker run --gpus all --shm-size 8g -p 8000:8000 decode-server:0.1.0 Qwen/Qwen3-8B \
#       --reasoning-parser qwen3 --tool-call-parser hermes --enable-auto-tool-choice
# --shm-size: the engine and the server exchange outputs over /dev/shm (NCCL too, with several GPUs),
# and the 64 MB docker and podman give by default stops the engine at start; 8g is what
# deploy/base gives each pod.
# podman/buildah: build with `--format docker`, or the HEALTHCHECK is dropped (OCI images have none).
# deploy/images/smoke.sh builds this on a Debian base without CUDA, as a check that it installs and
# imports (`./dev image-check gpu`); it cannot run it.
#
# BASE_IMAGE: the devel image carries nvcc and headers for the kernels FlashInfer/Triton compile at
# run time. CUDA 13 needs an NVIDIA driver >= 580 on the host. Any Debian/Ubuntu base works for the
# install (python3 comes from apt).
ARG BASE_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${BASE_IMAGE}

# Build-time only: ARGs are in the RUN steps' environment, not in the image's.
# PIP_CONFIG_FILE: a pip configuration for this build (an index mirror, a CA bundle, a wheel folder);
# smoke.sh mounts one at /mnt, a directory every Debian/Ubuntu image has, so no mount point is left behind.
ARG DEBIAN_FRONTEND=noninteractive
ARG PIP_NO_CACHE_DIR=1
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_CONFIG_FILE
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# python3-dev + gcc: Triton builds its launcher against Python.h. curl: HEALTHCHECK.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

# vLLM first (the heavy, rarely changing layer), pinned in deploy/images/gpu/ (tests/deploy/test_images_resolve.py
# resolves those files): vllm, exactly one NIXL CUDA build (cu13, as vLLM's torch), then NIXL's meta
# package without its dependencies (it would add the CUDA 12 build too).
COPY deploy/images/gpu/ /tmp/requirements/
RUN pip install -r /tmp/requirements/requirements.txt \
 && pip install --no-deps -r /tmp/requirements/no-deps.txt \
 && rm -rf /tmp/requirements

COPY pyproject.toml README.md /src/
COPY decode_server /src/decode_server
COPY protocol /src/protocol
# The `tracing` extra: OpenTelemetry for --otlp-traces-endpoint (deploy/components/otel-tracing).
RUN pip install "/src[tracing]" \
 && rm -rf /src \
 && python -c "import transformers, vllm, decode_server, opentelemetry.exporter.otlp.proto.grpc.trace_exporter"

# Non-root. $HOME holds every cache (Hugging Face, vLLM/torch/Triton compile caches, the demo model).
RUN useradd --no-log-init --create-home --uid 10001 --user-group app \
 && mkdir -p /home/app/.cache/decode-server \
 && chown -R app:app /home/app
ENV HOME=/home/app \
    DECODE_SERVER_CACHE=/home/app/.cache/decode-server
USER 10001:10001
WORKDIR /home/app

COPY deploy/images/healthcheck.sh /usr/local/bin/decode-server-healthcheck
EXPOSE 8000
# Engine start (weights download, load, warm-up) can take minutes: /health answers once it is up.
# GET /health on the port the server was started with (`--port N` among the arguments, else 8000).
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["decode-server-healthcheck"]
# With no MODEL argument the server builds and serves its demo model (random weights).
# --host 0.0.0.0 so the port is reachable from outside the container (the CLI default is loopback).
# Exec form, no shell: the server is PID 1 and gets SIGTERM itself (docker stop, Kubernetes), which
# starts its drain.
ENTRYPOINT ["decode-server", "serve", "--host", "0.0.0.0"]
