#!/usr/bin/env bash
# Builds the images with podman on this machine and checks them (`./dev image-check`):
#   deploy/images/smoke.sh [cpu|gpu|all] [--keep]            (default: all)
# cpu: Dockerfile.cpu's usage lines run as written, `docker` read as podman and the host side of -p
#      a free loopback port: build; run; /health; one generate request per output mode (tokens, text,
#      derender, the README's examples); the image's HEALTHCHECK; SIGTERM, then exit 0 after the drain.
# gpu: Dockerfile's build line on Debian bookworm WITHOUT CUDA (no registry serves nvidia/cuda here),
#      then its imports: it shows the image installs and imports, not that it runs on a GPU.
# Both: no build-time setting in the image's environment and nothing left where the build mounted.
#
# Needs root (debootstrap, rootful podman) and the network (apt's Debian mirror, PyPI). podman, runc,
# debootstrap and curl are installed with apt where missing. podman reads a containers.conf of this
# script's own (CONTAINERS_CONF), never the host's: runc (crun refuses hybrid cgroups), cgroupfs, and
# default ulimits no higher than this shell's hard limits (a VM may refuse raising them).
# The bases are made here, as no registry serves them: Debian bookworm by debootstrap from the mirror
# apt's sources name, and on it a python:3.11-slim stand-in (python-standin.Containerfile). They stay
# between runs (~0.5 GB); the images built are removed at the end unless --keep.
#
# Environment: DEBIAN_MIRROR (else the one apt's sources name for bookworm); DECODE_SERVER_WHEELS (a
# folder holding torch==2.13.0+cpu, needed when PyTorch's index is unreachable; else pip's find-links);
# SMOKE_WORK (state, default /var/tmp/decode-server-images); SMOKE_GPU_MIN_FREE_GB (default 30);
# SMOKE_HEALTH_TIMEOUT_S (default 600).
set -Eeuo pipefail
# A command that fails outside fail()'s checks still says what failed.
trap 'echo "[smoke] FAILED at line $LINENO: $BASH_COMMAND (exit $?)" >&2' ERR
cd "$(dirname "$0")/../.."

WORK=${SMOKE_WORK:-/var/tmp/decode-server-images}
DEBIAN_IMAGE=localhost/decode-server-smoke/debian:bookworm
PYTHON_IMAGE=localhost/decode-server-smoke/python:3.11-standin
GPU_MIN_FREE_GB=${SMOKE_GPU_MIN_FREE_GB:-30}
HEALTH_TIMEOUT_S=${SMOKE_HEALTH_TIMEOUT_S:-600}
CONTAINER=decode-server-smoke-$$
# Image builds are heavy and the machine may be shared: below normal CPU and I/O priority.
NICE=(nice -n 10 ionice -c 2 -n 7)

log() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[smoke] FAILED: %s\n' "$*" >&2; exit 1; }
SUMMARY=()
note() { SUMMARY+=("$*"); log "$*"; }
elapsed() { echo $(($(date +%s) - $1)); }

what=all keep=0
for arg in "$@"; do
    case "$arg" in
        cpu|gpu|all) what=$arg ;;
        --keep) keep=1 ;;
        *) sed -n '2,4p' "$0" >&2; exit 2 ;;
    esac
done

# ---------------------------------------------------------------- podman on this machine

# podman schedules a container's HEALTHCHECK with a systemd timer, and says so on every run, stop and
# rm where no systemd runs (containers here); the check itself runs by hand (healthcheck_check).
podman_() {
    local err rc=0
    err=$(mktemp)
    "${NICE[@]}" podman "$@" 2>"$err" || rc=$?
    grep -v 'unable to get systemd connection' "$err" >&2 || true
    rm -f "$err"
    return $rc
}

ensure_tools() {
    [[ $(id -u) == 0 ]] || fail "needs root: debootstrap and rootful podman (run it as root)"
    local missing=() tool
    for tool in podman runc debootstrap curl; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) && return
    command -v apt-get >/dev/null || fail "${missing[*]} missing and no apt-get to install them"
    log "installing ${missing[*]} with apt"
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}")
    "${apt[@]}" >/dev/null || { apt-get update -q >/dev/null && "${apt[@]}" >/dev/null; } ||
        fail "apt-get could not install ${missing[*]}"
}

write_containers_conf() {
    mkdir -p "$WORK"
    local nofile nproc
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    [[ $nofile == unlimited ]] && nofile=1048576
    # 32768 processes are plenty for one server; a higher nproc was refused on the VM this was
    # written on even below its hard limit.
    [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
    cat >"$WORK/containers.conf" <<EOF
# Written by deploy/images/smoke.sh for its own podman calls (CONTAINERS_CONF); the host's is untouched.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    export CONTAINERS_CONF=$WORK/containers.conf
    podman info >/dev/null 2>"$WORK/podman-info.err" || fail "podman does not work: $(tail -3 "$WORK/podman-info.err")"
}

# ---------------------------------------------------------------- the bases

# The Debian mirror apt's own sources name for bookworm (one-line .list and deb822 .sources files).
apt_mirror() {
    python3 - /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources <<'PY'
import re, sys
from pathlib import Path

def entries(path):
    text = path.read_text()
    if path.suffix == ".sources":
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"]) != ["no"]:
                yield from ((uri, fields.get("suites", [])) for uri in fields.get("uris", []))
    else:
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                yield words[1], [words[2]]

for name in sys.argv[1:]:
    path = Path(name)
    if path.is_file():
        for uri, suites in entries(path):
            if "bookworm" in suites and uri.startswith(("http://", "https://")):
                print(uri)
                sys.exit(0)
sys.exit(1)
PY
}

make_debian_base() {
    podman image exists "$DEBIAN_IMAGE" && return
    local mirror=${DEBIAN_MIRROR:-}
    [[ -n $mirror ]] || mirror=$(apt_mirror) ||
        fail "apt's sources name no Debian mirror serving bookworm; set DEBIAN_MIRROR=<a Debian mirror URL>"
    log "making $DEBIAN_IMAGE: debootstrap --variant=minbase bookworm from $mirror"
    local rootfs started
    rootfs=$(mktemp -d "$WORK/rootfs.XXXXXX")
    started=$(date +%s)
    "${NICE[@]}" debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
        { rm -rf "$rootfs"; fail "debootstrap failed (last lines of $WORK/debootstrap.log): $(tail -5 "$WORK/debootstrap.log")"; }
    tar -C "$rootfs" -c . | podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >>"$WORK/debootstrap.log" 2>&1 ||
        { rm -rf "$rootfs"; fail "podman import of the debootstrapped tree failed: $(tail -5 "$WORK/debootstrap.log")"; }
    rm -rf "$rootfs"
    note "base $DEBIAN_IMAGE: debootstrap + import in $(elapsed "$started") s"
}

make_python_base() {
    podman image exists "$PYTHON_IMAGE" && return
    log "building $PYTHON_IMAGE (the python:3.11-slim stand-in)"
    local started
    started=$(date +%s)
    "${NICE[@]}" podman build --network host --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" \
        -f deploy/images/python-standin.Containerfile -t "$PYTHON_IMAGE" deploy/images >"$WORK/python-base.log" 2>&1 ||
        fail "building the python stand-in failed: $(tail -5 "$WORK/python-base.log")"
    note "base $PYTHON_IMAGE: built in $(elapsed "$started") s"
}

# ---------------------------------------------------------------- pip inside the builds

host_pip_config() {
    local py
    for py in .venv/bin/python python3; do
        "$py" -m pip config list 2>/dev/null && return
    done
    return 0
}

# A pip configuration the builds read through PIP_CONFIG_FILE, in a folder mounted at /mnt (a
# directory in every Debian/Ubuntu image, so the mount leaves no placeholder behind): this machine's
# CA bundle (pip's own may not hold the CA a proxy here signs with) and the local torch CPU wheel.
prepare_pip_mount() {
    local dir=$WORK/pip-build config cert="" links=() wheel="" d
    rm -rf "$dir" && mkdir -p "$dir/wheels"
    config=$(host_pip_config)
    cert=${PIP_CERT:-$(sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" <<<"$config" | head -1)}
    [[ -n ${DECODE_SERVER_WHEELS:-} ]] && links+=("$DECODE_SERVER_WHEELS")
    # shellcheck disable=SC2206  # find-links is a space-separated list
    links+=(${PIP_FIND_LINKS:-} $(sed -n "s/^[^=]*\.find-links='\(.*\)'$/\1/p" <<<"$config"))
    # PyTorch's CPU index is the only source of torch's "+cpu" build; a local wheel stands in for it.
    local torch torch_index=reachable
    torch=$(sed -n 's/^torch==\(.*+cpu\)$/\1/p' deploy/images/cpu/requirements.txt)
    curl -fsS -m 20 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null || torch_index=unreachable
    for d in ${links[@]+"${links[@]}"}; do
        wheel=$(compgen -G "$d/torch-${torch}-cp311-*.whl" | head -1) && break
    done
    if [[ -n $wheel ]]; then
        ln "$wheel" "$dir/wheels/" 2>/dev/null || cp "$wheel" "$dir/wheels/"
        log "torch==$torch for the CPU build: $wheel (PyTorch's index: $torch_index)"
    elif [[ $torch_index == unreachable ]]; then
        fail "torch==$torch: PyTorch's CPU index is unreachable and no local wheel was found" \
            "(looked in DECODE_SERVER_WHEELS and pip's find-links: ${links[*]:-none})"
    fi
    {
        echo "[global]"
        if [[ -n $cert && -f $cert ]]; then
            cp "$cert" "$dir/ca.crt"
            echo "cert = /mnt/ca.crt"
        fi
        echo "find-links = /mnt/wheels"
    } >"$dir/pip.conf"
    # The CPU image's requirements.txt names PyTorch's index, and pip asks it for every package,
    # retrying each failed connection 5 times with backoff: 20+ minutes where it is unreachable.
    cp "$dir/pip.conf" "$dir/pip-cpu.conf"
    [[ $torch_index == reachable ]] || echo "retries = 0" >>"$dir/pip-cpu.conf"
    PIP_MOUNT=(-v "$dir:/mnt:ro")
}

# ---------------------------------------------------------------- the usage lines

# The first `docker <verb>` usage line in a Dockerfile's header, as words (they hold no quotes).
usage_line() {
    local file=$1 verb=$2 line
    line=$(sed -n "s/^#   docker $verb \(.*\)$/\1/p" "$file" | head -1)
    [[ -n $line ]] || fail "$file has no '#   docker $verb' usage line"
    line=${line%%#*}
    line=${line%\\}
    echo "$line"
}

image_tag() {  # the -t value of a build line
    local -a words
    read -r -a words <<<"$1"
    local i
    for ((i = 0; i < ${#words[@]}; i++)); do
        [[ ${words[i]} == -t ]] && { echo "${words[i + 1]}"; return; }
    done
    fail "build line without -t: $1"
}

build_from_usage_line() {  # dockerfile base pip-config log -> sets BUILT_TAG; notes the time and size
    local dockerfile=$1 base=$2 pip_config=$3 logfile=$4 line started size
    line=$(usage_line "$dockerfile" build)
    BUILT_TAG=$(image_tag "$line")
    local -a words
    read -r -a words <<<"$line"
    log "podman build ${words[*]}   (base $base; log $logfile)"
    started=$(date +%s)
    # --format docker keeps the HEALTHCHECK; --network host: the build's own network namespace has
    # no route out on every host, and the build only fetches packages.
    "${NICE[@]}" podman build --format docker --network host --build-arg "BASE_IMAGE=$base" \
        "${PIP_MOUNT[@]}" --build-arg "PIP_CONFIG_FILE=/mnt/$pip_config" "${words[@]}" >"$logfile" 2>&1 ||
        fail "podman build of $dockerfile failed (last lines of $logfile):"$'\n'"$(tail -25 "$logfile")"
    BUILD_S=$(elapsed "$started")
    size=$(podman image inspect --format '{{.Size}}' "$BUILT_TAG")
    note "$dockerfile: built $BUILT_TAG in ${BUILD_S} s on $base; size $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }')"
}

# No build-time setting in the image's environment, nothing where the build mounted its pip
# configuration, and a HEALTHCHECK kept.
check_image_clean() {
    local tag=$1 env leftovers health
    env=$(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$tag")
    if grep -E '^(PIP_|DEBIAN_FRONTEND=|SSL_CERT|REQUESTS_CA_BUNDLE=)' <<<"$env"; then
        fail "$tag keeps build-time settings in its environment (above)"
    fi
    leftovers=$(podman_ run --rm --no-healthcheck --entrypoint sh "$tag" -c 'ls -A /mnt; ls /tmp/requirements /src 2>/dev/null; true')
    [[ -z $leftovers ]] || fail "$tag holds build leftovers in /mnt, /tmp/requirements or /src: $leftovers"
    health=$(podman image inspect --format '{{if .Config.Healthcheck}}{{.Config.Healthcheck.Test}}{{end}}' "$tag")
    [[ $health == *decode-server-healthcheck* ]] || fail "$tag has no HEALTHCHECK (got '$health'); built without --format docker?"
    note "$tag: environment clean of PIP_*/DEBIAN_FRONTEND, /mnt empty, HEALTHCHECK $health"
}

# ---------------------------------------------------------------- the CPU image, running

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

run_from_usage_line() {  # dockerfile tag -> starts $CONTAINER; sets URL
    local line host_port
    line=$(usage_line "$1" run)
    local -a words out=()
    read -r -a words <<<"$line"
    host_port=$(free_port)
    local i
    for ((i = 0; i < ${#words[@]}; i++)); do
        if [[ ${words[i]} == -p ]]; then
            # The usage line publishes the container port on the host's; here a free loopback port
            # stands in for the host side, as the machine is shared.
            out+=(-p "127.0.0.1:$host_port:${words[i + 1]##*:}")
            i=$((i + 1))
        else
            out+=("${words[i]}")
        fi
    done
    [[ " ${out[*]} " == *" $2 "* ]] || fail "the run line does not run the image its build line tags ($2): $line"
    log "podman run -d --name $CONTAINER ${out[*]}"
    podman_ run -d --name "$CONTAINER" "${out[@]}" >/dev/null
    URL=http://127.0.0.1:$host_port
}

wait_for_health() {
    local started=$1 state
    while :; do
        if curl -fsS -m 5 -o /dev/null "$URL/health" 2>/dev/null; then
            HEALTH_S=$(elapsed "$started")
            return
        fi
        state=$(podman inspect --format '{{.State.Status}}' "$CONTAINER")
        [[ $state == running ]] ||
            fail "the container stopped before /health answered ($state); its log ends:"$'\n'"$(podman logs "$CONTAINER" 2>&1 | tail -30)"
        (($(elapsed "$started") < HEALTH_TIMEOUT_S)) ||
            fail "/health did not answer within $HEALTH_TIMEOUT_S s; the log ends:"$'\n'"$(podman logs "$CONTAINER" 2>&1 | tail -30)"
        sleep 2
    done
}

# One batch request of the README's examples per output mode; the answer's shape is checked.
generate_checks() {
    local tools body mode answer status said
    tools='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
    for mode in tokens text derender; do
        case $mode in
            tokens) body='{"token_ids":[9707,1879],"sampling_params":{"max_tokens":8}}' ;;
            text) body='{"token_ids":[9707,1879],"output_mode":"text","sampling_params":{"max_tokens":16,"logprobs":2,"stop":["."]}}' ;;
            derender) body='{"token_ids":[151644,872,198,13048,151645,198,151644,77091,198],"output_mode":"derender","sampling_params":{"max_tokens":32,"skip_special_tokens":false},"parse_context":{"tools":'"$tools"',"tool_choice":"auto"}}' ;;
        esac
        answer=$(curl -sS -m 120 -w '\n%{http_code}' "$URL/inference/v1/generate" -H 'Content-Type: application/json' -d "$body") ||
            fail "$mode request: curl failed"
        status=${answer##*$'\n'}
        answer=${answer%$'\n'*}
        [[ $status == 200 ]] || fail "$mode request: HTTP $status: $answer"
        said=$(python3 - "$mode" "$answer" <<'PY'
import json, sys
mode, answer = sys.argv[1], json.loads(sys.argv[2])
choice = answer["choices"][0]
tokens = choice["token_ids"]
assert tokens and all(isinstance(t, int) for t in tokens), f"no token ids: {choice}"
said = f"{len(tokens)} tokens, finish_reason {choice['finish_reason']}"
if mode == "text":
    assert isinstance(choice["text"], str) and choice["logprobs"], f"no text or logprobs: {choice}"
    said += f", text {choice['text'][:40]!r}"
if mode == "derender":
    message = choice["message"]
    assert message["role"] == "assistant", f"not an assistant message: {choice}"
    said += f", message keys {sorted(k for k, v in message.items() if v is not None)}"
print(said)
PY
) || fail "$mode request: unexpected answer: $answer"$'\n'"$said"
        note "$mode: HTTP 200, $said"
    done
}

healthcheck_check() {
    local out
    out=$(podman healthcheck run "$CONTAINER" 2>&1) || fail "podman healthcheck run: ${out:-unhealthy}"
    note "HEALTHCHECK (podman healthcheck run): ${out:-healthy}"
}

stop_check() {
    local started code logs
    started=$(date +%s)
    # podman stop sends SIGTERM (the image sets no STOPSIGNAL) and SIGKILL after -t seconds; the
    # server's drain window is 30 s and nothing is in flight, so a kill means it did not drain.
    podman_ stop -t 60 "$CONTAINER" >/dev/null
    code=$(podman inspect --format '{{.State.ExitCode}}' "$CONTAINER")
    logs=$(podman logs "$CONTAINER" 2>&1)
    [[ $code == 0 ]] || fail "exit code $code after SIGTERM (0 is a completed drain); the log ends:"$'\n'"$(tail -20 <<<"$logs")"
    grep -q 'draining: new requests get 503' <<<"$logs" || fail "exit 0 but no drain line in the log"
    note "SIGTERM: drained and exited 0 in $(elapsed "$started") s"
}

cpu_check() {
    build_from_usage_line Dockerfile.cpu "$PYTHON_IMAGE" pip-cpu.conf "$WORK/cpu-build.log"
    local tag=$BUILT_TAG
    check_image_clean "$tag"
    local started
    started=$(date +%s)
    run_from_usage_line Dockerfile.cpu "$tag"
    wait_for_health "$started"
    note "/health answered $HEALTH_S s after podman run"
    generate_checks
    healthcheck_check
    stop_check
    podman_ rm "$CONTAINER" >/dev/null
    ((keep)) || podman rmi "$tag" >/dev/null
}

# ---------------------------------------------------------------- the GPU image, installed only

gpu_check() {
    local root free_gb
    root=$(podman info --format '{{.Store.GraphRoot}}')
    free_gb=$(df -P -BG "$root" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
    if ((free_gb < GPU_MIN_FREE_GB)); then
        note "GPU image SKIPPED: $free_gb GB free on $root, the build needs $GPU_MIN_FREE_GB GB (~11 GB image + the layers it commits)"
        GPU_SKIPPED=1
        return
    fi
    log "GPU image: built on $DEBIAN_IMAGE, NOT the CUDA base: it installs and imports here, it cannot run"
    build_from_usage_line Dockerfile "$DEBIAN_IMAGE" pip.conf "$WORK/gpu-build.log"
    local tag=$BUILT_TAG versions
    check_image_clean "$tag"
    versions=$(podman_ run -i --rm --no-healthcheck --entrypoint python "$tag" - 2>&1 <<'PY'
import importlib.metadata as m
import torch, vllm, decode_server, nixl
from decode_server.process import cli
assert vllm.__version__ == "0.33.0", vllm.__version__
assert (torch.version.cuda or "").startswith("13."), torch.version.cuda
print(f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), nixl-cu13 {m.version('nixl-cu13')}")
PY
) || fail "GPU image imports: $versions"
    note "GPU image (no CUDA base) imports: $(tail -1 <<<"$versions")"
    ((keep)) || podman rmi "$tag" >/dev/null
}

external_containers() { podman ps -a --external -q --no-trunc 2>/dev/null | sort; }

cleanup() {
    podman_ rm -f "$CONTAINER" >/dev/null 2>&1 || true
    # An interrupted build leaves its working containers (podman lists them as external); only
    # those that were not there before this run.
    local id
    for id in $(comm -13 <(printf '%s\n' "${EXTERNAL_BEFORE[@]}") <(external_containers)); do
        podman rm -f --storage "$id" >/dev/null 2>&1 || true
    done
    # Layers of failed or superseded builds.
    podman image prune -f >/dev/null 2>&1 || true
}

ensure_tools
write_containers_conf
mapfile -t EXTERNAL_BEFORE < <(external_containers)
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
make_debian_base
make_python_base
prepare_pip_mount
GPU_SKIPPED=0
started=$(date +%s)
[[ $what == gpu ]] || cpu_check
[[ $what == cpu ]] || gpu_check
echo
echo "image check ($what) passed in $(elapsed "$started") s (bases aside):"
printf '  %s\n' "${SUMMARY[@]}"
((GPU_SKIPPED)) && echo "  NOTE: the GPU image was NOT built (above)."
exit 0
