#!/usr/bin/env bash
# loadtest/ab.sh — two infergate builds (or two worker counts) side by side, next to nginx.
#
#   loadtest/ab.sh BEFORE_BINARY AFTER_BINARY
#
# What a change to the hot path is worth, measured so that the shared machine's load hits both
# sides alike: one fake-triton backend, nginx (`proxy_pass`, keep-alive upstream) and four
# gateways in front of it — each binary with validation off and with everything on (validation,
# an RS256 JWT, a 90/10 route with a guard: bench.sh's stages 3 and 4) — all on the default
# config unless told otherwise. At each concurrency level the stages take turns, the whole
# sequence runs AB_ROUNDS times with the order rotated, and every figure is the median over
# the rounds. Reported per stage: infer/s, × nginx, p50 / p99, proxy CPU µs per request and
# × nginx's, and throughput per core the proxy used (infer/s per CPU-second).
#
# Knobs (environment):
#   AB_CONCURRENCY="16 64"  AB_ROUNDS=3
#   AB_WARMUP=1s AB_WINDOW=2s AB_WINDOWS=2          per step (infergate-load flags)
#   AB_BEFORE_WORKERS / AB_AFTER_WORKERS            server.workers of each side (default: unset,
#                                                   one per core); nginx: worker_processes auto
#   AB_LABELS="before after"                        how the report names the two sides
#   AB_BASE_PORT=29700  AB_OUT=path.md (default: stdout only)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
(($# == 2)) || { echo "usage: $0 BEFORE_BINARY AFTER_BINARY" >&2; exit 2; }
declare -A GATEWAY_BIN=([before]="$(realpath "$1")" [after]="$(realpath "$2")")
read -r -a LEVELS <<<"${AB_CONCURRENCY:-16 64}"
ROUNDS="${AB_ROUNDS:-3}"
BASE="${AB_BASE_PORT:-29700}"
read -r -a LABELS <<<"${AB_LABELS:-before after}"
BIN="$ROOT/target/release"
BUILD=0 WORKERS=auto ACCESS_LOG=on STARTED=$SECONDS
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh

require curl jq openssl
ensure_nginx
[[ -x "$BIN/infergate-load" && -x "$BIN/fake-triton" ]] || die "build the load tool first: cargo build --release -p infergate-load"
check_ports "$BASE" $((BASE + 10)) $((BASE + 20)) $((BASE + 30)) $((BASE + 40)) $((BASE + 50))
describe_machine src

everything_on_key

"$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads 1 >"$TMP/fake.log" 2>&1 &
PIDS+=("$!")
BACKEND_PID=$!
wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"
start_nginx nginx $((BASE + 10)) "$BASE" proxy.conf.template
declare -A URL=([nginx]="http://127.0.0.1:$((BASE + 10))") PROXY=()
STAGES=(nginx)
port=$((BASE + 20))
for side in before after; do
    workers_var="AB_${side^^}_WORKERS"
    for on in 0 1; do
        stage="$side-$([[ $on == 1 ]] && echo on || echo off)"
        fake_gateway_config "$port" "$on" "${!workers_var:-}" "$BASE" >"$TMP/$stage.toml"
        RUST_LOG=info "${GATEWAY_BIN[$side]}" --config "$TMP/$stage.toml" >"$TMP/$stage.log" 2>&1 &
        PIDS+=("$!")
        PROXY[$stage]=$!
        URL[$stage]="http://127.0.0.1:$port"
        STAGES+=("$stage")
        port=$((port + 10))
    done
done
PROXY[nginx]="${PID[nginx]} $(sleep 0.5; children "${PID[nginx]}")"
for stage in "${STAGES[@]}"; do
    wait_http "${URL[$stage]}/v2/health/ready" || die "$stage did not start: $(tail -5 "$TMP/$stage.log" 2>/dev/null)"
done
sleep 1 # placement adopts add_sub from the backend's index

LOAD_ARGS=(-i INPUT0:FP32:4 -i INPUT1:FP32:4 --check --warmup "${AB_WARMUP:-1s}"
    --duration "${AB_WINDOW:-2s}" --windows "${AB_WINDOWS:-2}" --json -q)
for round in $(seq 1 "$ROUNDS"); do
    for c in "${LEVELS[@]}"; do
        n=${#STAGES[@]}
        for i in $(seq 0 $((n - 1))); do
            stage="${STAGES[$(((i + round) % n))]}"
            STEP_ARGS=()
            [[ "$stage" == *-on ]] && STEP_ARGS=(--bearer "$TOKEN" --route bench)
            # shellcheck disable=SC2086
            load_step "$TMP/$stage-c$c-r$round.json" "round $round $stage c=$c" "${URL[$stage]}" "$c" "$BACKEND_PID" ${PROXY[$stage]}
        done
    done
done

med() { # stage c jq-field | cpu
    local r
    for r in $(seq 1 "$ROUNDS"); do
        if [[ "$3" == cpu ]]; then cut -d' ' -f1 "$TMP/$1-c$2-r$r.json.cpu"; else jq -r ".steps[0]$3" "$TMP/$1-c$2-r$r.json"; fi
    done | median
}
label() {
    case "$1" in
        nginx) echo "nginx" ;;
        before-off) echo "${LABELS[0]}, validation off${AB_BEFORE_WORKERS:+, $AB_BEFORE_WORKERS worker(s)}" ;;
        before-on) echo "${LABELS[0]}, everything on${AB_BEFORE_WORKERS:+, $AB_BEFORE_WORKERS worker(s)}" ;;
        after-off) echo "${LABELS[1]}, validation off${AB_AFTER_WORKERS:+, $AB_AFTER_WORKERS worker(s)}" ;;
        after-on) echo "${LABELS[1]}, everything on${AB_AFTER_WORKERS:+, $AB_AFTER_WORKERS worker(s)}" ;;
    esac
}
report() {
    echo "# infergate A/B: ${LABELS[0]} / ${LABELS[1]}, $(date +%F)"
    echo
    echo "\`loadtest/ab.sh\` in $((SECONDS - STARTED)) s: ${LABELS[0]} = \`${GATEWAY_BIN[before]}\`, ${LABELS[1]} = \`${GATEWAY_BIN[after]}\`; fake-triton (1 thread), nginx $("$NGINX" -v 2>&1 | cut -d/ -f2) \`worker_processes auto\`, access logs on for all; medians of $ROUNDS rounds, the stages taking turns (order rotated each round), warm-up ${AB_WARMUP:-1s} then ${AB_WINDOWS:-2} × ${AB_WINDOW:-2s} per step. Machine: $NPROC × $CPU_MODEL, load average $LOAD_BEFORE before, $(loadavg) after."
    echo
    echo "| stage | c | infer/s | × nginx | p50 µs | p99 µs | proxy CPU µs/req | CPU × nginx | infer/s per core used |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    local c s thr cpu nthr ncpu
    for c in "${LEVELS[@]}"; do
        nthr="$(med nginx "$c" .throughput_rps)"; ncpu="$(med nginx "$c" cpu)"
        for s in "${STAGES[@]}"; do
            thr="$(med "$s" "$c" .throughput_rps)"; cpu="$(med "$s" "$c" cpu)"
            printf '| %s | %s | %.0f | %s | %s | %s | %s | %s | %s |\n' "$(label "$s")" "$c" "$thr" "$(ratio "$thr" "$nthr")" \
                "$(med "$s" "$c" .latency_us.p50)" "$(med "$s" "$c" .latency_us.p99)" "$cpu" "$(ratio "$cpu" "$ncpu")" \
                "$(awk -v c="$cpu" 'BEGIN { if (c > 0) printf "%.0f", 1e6 / c; else print "-" }')"
        done
    done
}
report >"$TMP/report.md"
[[ -n "${AB_OUT:-}" ]] && cp "$TMP/report.md" "$AB_OUT"
cat "$TMP/report.md"
