#!/bin/sh
# The images' HEALTHCHECK: GET /health on the port the server listens on. `docker run IMAGE --port N`
# appends to the ENTRYPOINT, so the port is in PID 1's arguments (the last --port wins, as in argparse);
# without one it is the CLI default, 8000. With --ssl-certfile the server speaks TLS, and a liveness
# check has no CA to verify its certificate against (-k).
# DECODE_SERVER_HEALTHCHECK_CMDLINE: another NUL-separated argument list (tests/deploy/test_images.py).
cmdline=${DECODE_SERVER_HEALTHCHECK_CMDLINE:-/proc/1/cmdline}
args=$(tr '\0' '\n' <"$cmdline") || exit 1
port=$(printf '%s\n' "$args" | awk '
    take { port = $0; take = 0; next }
    $0 == "--port" { take = 1; next }
    /^--port=/ { port = substr($0, 8) }
    END { print port }')
scheme=http
case "$args" in *--ssl-certfile*) scheme=https ;; esac
exec curl -fsS -k -o /dev/null --max-time 4 "$scheme://127.0.0.1:${port:-8000}/health"
