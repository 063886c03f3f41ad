#!/usr/bin/env bash
# loadtest/profile.sh — where each proxy's CPU time goes at an equal offered load: a sampled
# profile (`perf record`, the cpu-clock software event, user and kernel, self time by symbol)
# of nginx and of infergate over one fixed-answer backend, driven by the same open-loop
# h2load rate. compare.sh's instruction counts (callgrind) weigh every instruction alike; a
# time profile also shows what waits on memory and shared cache lines (atomics, locks, a
# buffer two cores write), where the gateway's user time per request (about 3x nginx's at
# 10k req/s) outgrows its instruction count (about 2x). Needs root or
# kernel.perf_event_paranoid <= 1 for the kernel's share.
#
#   loadtest/profile.sh [GATEWAY_BINARY]    # default $PROF_GATEWAY, else target/release/infergate
#
# Knobs (environment):
#   PROF_BIN=target/release   fake-triton (cargo build --release -p infergate-load)
#   PROF_STAGES="nginx ig-val"  proxies: nginx, ig-off, ig-val, ig-on (compare.sh's meanings)
#   PROF_RATE=10000  PROF_CLIENTS=40  PROF_SECONDS=8  PROF_FREQ=1999  PROF_TOP=30
#   PROF_WORKERS=2   PROF_BASE_PORT=31900   PROF_REV=<rev>   PROF_OUT=path.md
#   PROF_CALLERS="sym1 sym2"  also record call chains (DWARF unwinding, which costs the proxy
#                             much more CPU) and report who calls each of these symbols
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GATEWAY="$(realpath "${1:-${PROF_GATEWAY:-$ROOT/target/release/infergate}}")"
BIN="$(realpath "${PROF_BIN:-$ROOT/target/release}")"
read -r -a STAGES <<<"${PROF_STAGES:-nginx ig-val}"
RATE="${PROF_RATE:-10000}"
CLIENTS="${PROF_CLIENTS:-40}"
WINDOW="${PROF_SECONDS:-8}"
FREQ="${PROF_FREQ:-1999}"
TOP="${PROF_TOP:-30}"
read -r -a CALLERS <<<"${PROF_CALLERS:-}"
BASE="${PROF_BASE_PORT:-31900}"
REV="${PROF_REV:-$(git rev-parse --short HEAD)}"
OUT="${PROF_OUT:-loadtest/results/$(date +%F)-$REV-profile.md}"
WORKERS="${PROF_WORKERS:-2}" ACCESS_LOG=on BUILD=0 STARTED=$SECONDS
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh

[[ -x "$GATEWAY" ]] || die "not an executable: $GATEWAY"
[[ -x "$BIN/fake-triton" ]] || die "no $BIN/fake-triton: cargo build --release -p infergate-load"
require curl openssl awk
ensure_nginx
ensure_debian h2load:nghttp2-client perf:linux-perf

everything_on_key
printf '%s' "$INFER_BODY" >"$TMP/body.json"

taskset -c 0 "$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads 1 >"$TMP/fake.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"

# profile STAGE PORT — starts the proxy, drives it at RATE for WINDOW seconds under perf, and
# appends its flat profile (self time by symbol, the top TOP) to $TMP/report.md.
profile() {
    local s="$1" port="$2" name="$1" pids auth=() bearer=
    if [[ "$s" == nginx ]]; then
        start_nginx "$name" "$port" "$BASE" proxy.conf.template
    else
        fake_gateway_config "$port" "$(stage_on "$s")" "" "$BASE" >"$TMP/$name.toml"
        start_infergate "$name" "$TMP/$name.toml" "$GATEWAY"
        everything_on "$s" && bearer="$TOKEN" auth=(-H "authorization: Bearer $TOKEN")
    fi
    local url="http://127.0.0.1:$port/v2/models/$(model_of "$s")/infer"
    wait_http "http://127.0.0.1:$port/v2/health/ready" 120 || die "$name did not start"
    wait_infer "http://127.0.0.1:$port" "$(model_of "$s")" 120 "$bearer" ||
        die "$name never answered an inference"
    sleep 1
    pids="${PID[$name]}"
    [[ "$s" == nginx ]] && pids="$(children "${PID[$name]}")"
    local before after
    # shellcheck disable=SC2086
    thread_switches $pids >"$TMP/$name.switches.before"
    before="$(ticks $pids)"
    local chains=()
    ((${#CALLERS[@]})) && chains=(--call-graph dwarf,8192)
    perf record "${chains[@]}" -F "$FREQ" -e cpu-clock -o "$TMP/$name.data" -p "$(tr ' ' ',' <<<"${pids% }")" -- sleep $((WINDOW + 1)) \
        >"$TMP/$name.perf.log" 2>&1 &
    local recorder=$!
    timeout $((WINDOW + 20)) h2load --h1 -t 1 -H 'content-type: application/json' "${auth[@]}" -d "$TMP/body.json" \
        -c "$CLIENTS" --rps $(((RATE + CLIENTS - 1) / CLIENTS)) -D "$WINDOW" "$url" >"$TMP/$name.h2" 2>&1 ||
        die "h2load failed at $name: $(tail -3 "$TMP/$name.h2")"
    after="$(ticks $pids)"
    # shellcheck disable=SC2086
    thread_switches $pids >"$TMP/$name.switches.after"
    wait "$recorder" || true
    local ok cpu
    ok="$(h2load_ok "$TMP/$name.h2")"
    cpu="$(per_req_us $((after - before)) "$ok")"
    {
        printf '\n## %s: %s requests at %s req/s, %s µs CPU a request\n\n' "$s" "$ok" "$RATE" "$cpu"
        printf 'Self time by symbol (%% of the samples of the proxy; `[k]` kernel, `[.]` user):\n\n```\n'
        flat "$name" sym "$TOP"
        printf '```\n\nBy shared object:\n\n```\n'
        flat "$name" dso 12
        printf '```\n\nBy thread (self time), and each thread'"'"'s context switches a request (voluntary + not):\n\n```\n'
        flat "$name" comm 12
        printf -- '--\n'
        join "$TMP/$name.switches.before" "$TMP/$name.switches.after" |
            awk -v n="$ok" '{ d = $3 - $2; if (d > 0) printf "%-24s %.3f\n", $1, d / n }' | sort -k2 -gr | head -12
        printf '```\n'
        local symbol
        for symbol in "${CALLERS[@]}"; do
            printf '\nWho calls `%s` (share of its samples):\n\n```\n' "$symbol"
            perf report -i "$TMP/$name.data" --no-children --symbols="$symbol" -G --stdio \
                -g caller,0.5,callee,function,percent >"$TMP/$name.callers.txt" 2>/dev/null || true
            awk '!/^#/ && NF { print; if (++k == 60) exit }' "$TMP/$name.callers.txt"
            printf '```\n'
        done
    } >>"$TMP/report.md"
    say "$s: $ok requests, $cpu µs CPU a request"
    stop_pids "${PID[$name]}"
}
# thread_switches PIDS... — "pid/tid:name switches" for every thread, sorted for join.
thread_switches() {
    local p t
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            awk -v id="${p}/${t##*/}:$(tr ' ' '_' <"$t/comm")" '/ctxt_switches/ { s += $2 } END { print id, s + 0 }' "$t/status"
        done
    done 2>/dev/null | sort
}
# flat NAME SORT N — the top N lines of NAME's profile, self time sorted by SORT (sym, dso).
flat() {
    perf report -i "$TMP/$1.data" --no-children --sort "$2" --stdio >"$TMP/$1.$2.txt" 2>/dev/null || true
    awk -v n="$3" '!/^#/ && NF { print; if (++k == n) exit }' "$TMP/$1.$2.txt"
}

port=$((BASE + 10))
for s in "${STAGES[@]}"; do
    profile "$s" "$port"
    port=$((port + 10))
done
{
    printf '# Where the CPU time goes at %s req/s — %s\n\n' "$RATE" "$REV"
    printf 'loadtest/profile.sh: `perf record -F %s -e cpu-clock` of each proxy (all its threads) while h2load drives it open loop at %s req/s over %s connections for %s s, over one fake-triton; %s workers each. %s.\n' \
        "$FREQ" "$RATE" "$CLIENTS" "$WINDOW" "$WORKERS" "$(nproc) cores, load $(loadavg)"
    cat "$TMP/report.md"
} >"$OUT"
say "wrote $OUT ($((SECONDS - STARTED)) s)"
