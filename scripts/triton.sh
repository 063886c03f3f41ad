#!/usr/bin/env bash
# Start / stop local tritonserver instances (CPU, python backend) serving tests/models
# in explicit model-control mode, for the README quick-start and the benchmark.
#
#   scripts/triton.sh start N BASE_PORT [--load-model=NAME ...] [other tritonserver flags]
#   scripts/triton.sh stop [N BASE_PORT]     # without arguments: every instance started here
#   scripts/triton.sh status
#
# Instance i (0-based) listens on 127.0.0.1: http BASE_PORT+10*i, grpc +1, metrics +2.
# Logs and pid files: target/triton-logs/triton-<http port>.{log,pid}.
# Extra flags are passed to every instance, e.g. --load-model=add_sub --log-verbose=1.
# Runs scripts/setup.sh first (fast when already done).
# Environment: TRITON_MODEL_REPOSITORY (default tests/models), TRITON_START_TIMEOUT (s, 60).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGDIR="$ROOT/target/triton-logs"
REPO="${TRITON_MODEL_REPOSITORY:-$ROOT/tests/models}"
TIMEOUT="${TRITON_START_TIMEOUT:-60}"

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "triton.sh: $*" >&2; exit 1; }

# HTTP status line of GET http://127.0.0.1:$1$2 using bash's /dev/tcp (no curl needed).
http_status() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3
        IFS=" " read -r _ code _ <&3 && echo "$code"' _ "$1" "$2" 2>/dev/null || true
}

alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

stop_pidfile() {
    local f="$1" pid i
    pid="$(cat "$f" 2>/dev/null || true)"
    if alive "$pid"; then
        # tritonserver runs in its own process group (setsid); the python backend
        # stubs are in it too. TERM lets it unload models; KILL after 10 s.
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.1; done
        if alive "$pid"; then
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "stopped tritonserver pid $pid ($(basename "$f" .pid))"
    fi
    rm -f "$f"
}

cmd_start() {
    [[ $# -ge 2 && "$1" =~ ^[0-9]+$ && "$2" =~ ^[0-9]+$ ]] || usage
    local n="$1" base="$2"; shift 2
    "$ROOT/scripts/setup.sh"
    # shellcheck source=scripts/env.sh
    source "$ROOT/scripts/env.sh"
    mkdir -p "$LOGDIR"
    local i port pids=() ports=()
    for ((i = 0; i < n; i++)); do
        port=$((base + 10 * i))
        if alive "$(cat "$LOGDIR/triton-$port.pid" 2>/dev/null || true)"; then
            die "an instance on port $port is already running (scripts/triton.sh stop)"
        fi
        setsid "$TRITONSERVER" \
            --model-repository="$REPO" \
            --backend-directory="$TRITON_BACKENDS" \
            --model-control-mode=explicit \
            --http-address=127.0.0.1 --http-port="$port" \
            --grpc-address=127.0.0.1 --grpc-port=$((port + 1)) \
            --metrics-address=127.0.0.1 --metrics-port=$((port + 2)) \
            --allow-metrics=true \
            --exit-timeout-secs=5 \
            "$@" </dev/null >"$LOGDIR/triton-$port.log" 2>&1 &
        echo $! >"$LOGDIR/triton-$port.pid"
        pids+=("$!"); ports+=("$port")
    done
    local deadline=$((SECONDS + TIMEOUT)) k
    for k in "${!ports[@]}"; do
        port="${ports[$k]}"
        until [[ "$(http_status "$port" /v2/health/live)" == 200 ]]; do
            if ! alive "${pids[$k]}" || ((SECONDS > deadline)); then
                echo "triton.sh: instance on port $port did not come up; log tail:" >&2
                tail -n 20 "$LOGDIR/triton-$port.log" >&2
                for port in "${ports[@]}"; do stop_pidfile "$LOGDIR/triton-$port.pid" >/dev/null; done
                exit 1
            fi
            sleep 0.2
        done
        echo "tritonserver pid ${pids[$k]}: http 127.0.0.1:$port grpc :$((port + 1)) metrics :$((port + 2)) log ${LOGDIR#"$ROOT"/}/triton-$port.log"
    done
}

cmd_stop() {
    local f
    if [[ $# -ge 2 ]]; then
        for ((i = 0; i < $1; i++)); do stop_pidfile "$LOGDIR/triton-$(($2 + 10 * i)).pid"; done
    else
        for f in "$LOGDIR"/triton-*.pid; do [[ -e "$f" ]] && stop_pidfile "$f"; done
    fi
    return 0
}

cmd_status() {
    local f pid port
    for f in "$LOGDIR"/triton-*.pid; do
        [[ -e "$f" ]] || continue
        pid="$(cat "$f")"; port="$(basename "$f" .pid)"; port="${port#triton-}"
        if alive "$pid"; then
            echo "port $port pid $pid live=$(http_status "$port" /v2/health/live) ready=$(http_status "$port" /v2/health/ready)"
        else
            echo "port $port pid $pid not running (stale pid file)"
        fi
    done
}

case "${1:-}" in
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    status) shift; cmd_status ;;
    *) usage ;;
esac
