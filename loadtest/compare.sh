#!/usr/bin/env bash
# loadtest/compare.sh — infergate next to nginx over one fixed-answer backend (issue 31).
#
#   loadtest/compare.sh [GATEWAY_BINARY]     # default $CMP_GATEWAY, else target/release/infergate
#
# One fake-triton (1 thread, pinned to the client's core) answers add_sub; in front of it,
# nginx (Debian's, loadtest/nginx/proxy.conf.template: keep-alive upstream, keepalive_requests
# raised, its default access log to a file) and the gateway under test three times: validation
# off (ig-off, "everything off"), validation on and nothing else (ig-val, the default
# configuration), and everything on (ig-on: lib.sh's everything_on_tables, an RS256 JWT with
# the verified-token cache, validation, a 90/10 route with a guard; the load calls route
# "bench" with the bearer). Beside them, the floor: `hyper-floor` (loadtest/src/bin), a bare
# reverse proxy of infergate's shape (shared-nothing tokio workers, hyper's server and pooled
# client) that does nothing else: what hyper and tokio cost, which infergate keeps, and so
# the least infergate could spend. Two workers each (nginx worker_processes, infergate
# server.workers), access logs on for all. Every request is the same KServe v2 infer: HTTP/1.1
# keep-alive POST /v2/models/<m>/infer, lib.sh's INFER_BODY (add_sub, JSON). The proxies take
# turns in rotated order (step k starts with the k-th), so drifting machine load hits each alike.
#
# Three families of measures:
#   1. Equal offered load: `h2load --h1 --rps` (open loop: CMP_OPEN_CLIENTS connections, each
#      at rate/clients; h2load never reconnects) at 5k, 10k and 20k req/s for CMP_OPEN_WINDOW
#      seconds; each proxy's CPU per request = utime+stime of all its processes (/proc/PID/stat,
#      nginx master and workers) over the run ÷ requests h2load saw succeed. This is the fair
#      CPU comparison: CPU per request falls as a proxy is driven harder (more work per wake-up).
#      Beside it, context switches per request (every thread's, /proc/PID/task/*/status): how
#      often the proxy sleeps and wakes for the same load, kernel work the counts below miss.
#      The 10k req/s step, which the CPU targets name, runs CMP_TARGET_ROUNDS times, each round
#      in another order; the targets take the median of each round's ratio to nginx (one
#      round's moved by 0.1–0.3 from run to run here).
#   2. Closed loop, `wrk` at c=16 and c=64: throughput, p50/p99 and added latency vs direct to
#      the backend. Each proxy runs again, started on one core (`taskset -c`, CMP_PROXY_CPU)
#      with its default worker count (CMP_PINNED_WORKERS=auto: nginx's `worker_processes auto`
#      and infergate's default `server.workers` both count the cores the process may use, so
#      one), wrk and the backend on the other core (CMP_CLIENT_CPU), so the tail is the
#      proxy's own. (Two workers on one core take turns in the scheduler's slices, and a
#      request on the waiting worker's connection waits out the other's slice: until
#      2026-12-07 the two-worker instances of family 1 were pinned here, and every proxy's p99
#      added at c=16 was 3-6 ms, nginx's 3.2 ms; started with one worker, nginx's was 0.33 ms.)
#      The c=16 step, which the wrk target names, runs CMP_WRK_ROUNDS times in rotated order,
#      judged by the median of each round's ratio to nginx: one 3 s window a stage put the
#      same binary at 0.67-1.13 x nginx on a busy machine (2026-12-07-a1812f8-pgo-*).
#   2b. Open loop, pinned alike: `infergate-load --rate` (latency from each request's intended
#      send time, so a stall is not hidden) at CMP_LATENCY_RATES, below every proxy's
#      saturation: p50/p99 and added latency vs direct at the same rate, the latency a proxy
#      adds when it is not the bottleneck.
#   3. Counts that do not follow the machine's noise, on a fixed number of requests (h2load -n,
#      c=16): syscalls per request (`strace -c -f` attached to the running proxy: nginx's
#      workers, every gateway thread), and user-space instructions per request under callgrind
#      (a fresh instance of each proxy under valgrind, zeroed after a warm-up, dumped after the
#      counted requests; nginx as one process, master_process off, one worker; GLIBC_TUNABLES
#      as instructions.sh), with the same run's simulated L1 instruction and data cache misses
#      per request (lib.sh misses_of): at equal instructions, what the code and data a request
#      spreads over costs in time.
#
# Writes loadtest/results/<date>-<rev>-compare.md (rev: the binary's name infergate-<rev>, else
# this checkout's HEAD) and its chart (<results>.svg: wrk throughput and p99 per concurrency;
# for a run recorded in loadtest/results/, also loadtest/results/compare-latest.svg), and prints
# the report. About 6 minutes with the defaults (7 with CMP_TARGET_ROUNDS=5); every benchmark
# command is bounded by `timeout`.
# Installs nginx, wrk, h2load (nghttp2-client), strace and valgrind when missing (root only).
# Stays on loopback; stops only what it started.
#
# Knobs (environment):
#   CMP_GATEWAY=target/release/infergate   the gateway (or the first argument)
#   CMP_BIN=target/release                 fake-triton (cargo build --release -p infergate-load)
#   CMP_RATES="5000 10000 20000"  CMP_OPEN_CLIENTS=40  CMP_OPEN_WINDOW=3     family 1 (seconds)
#   CMP_TARGET_ROUNDS=3   family 1's 10k req/s step, in this many rounds (the targets' median)
#   CMP_CONCURRENCY="16 64"  CMP_WRK_WINDOW=3  CMP_WARMUP=1                  family 2 (seconds)
#   CMP_WRK_ROUNDS=3      family 2's c=16 step, in this many rounds (the wrk target's median)
#   CMP_LATENCY_RATES="2000 5000"  CMP_LATENCY_WINDOW=5                      family 2b (one window)
#   CMP_STRACE_REQUESTS=10000  CMP_CG_REQUESTS=2000  CMP_CG_WARMUP=500  CMP_COUNT_CLIENTS=16
#   CMP_STAGES="nginx floor ig-off ig-val ig-on"  the proxies (nginx, and any of the floor and
#                                          the three gateways; with CMP_GATEWAY_B, also ig-off-b,
#                                          ig-val-b and ig-on-b: the same stages of that binary)
#   CMP_GATEWAY_B=path                     a second gateway, for an A/B in one run: its stages
#                                          take turns with the others, so a change's CPU at equal
#                                          load is judged against nginx and the build before it
#   CMP_PROXY_CPU=1  CMP_CLIENT_CPU=0      cores of family 2 (the backend always on the client's)
#   CMP_WORKERS=2                          nginx worker_processes and infergate server.workers
#   CMP_PINNED_WORKERS=auto                the same, for families 2 and 2b (on one core)
#   CMP_BASE_PORT=29900  CMP_REV=<rev>  CMP_OUT=path.md
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GATEWAY="${1:-${CMP_GATEWAY:-$ROOT/target/release/infergate}}"
[[ -x "$GATEWAY" ]] || { echo "compare.sh: not an executable: $GATEWAY" >&2; exit 2; }
GATEWAY="$(realpath "$GATEWAY")"
GATEWAY_B="${CMP_GATEWAY_B:+$(realpath "$CMP_GATEWAY_B")}"
BIN="$(realpath "${CMP_BIN:-$ROOT/target/release}")"
read -r -a RATES <<<"${CMP_RATES:-5000 10000 20000}"
OPEN_CLIENTS="${CMP_OPEN_CLIENTS:-40}"
OPEN_WINDOW="${CMP_OPEN_WINDOW:-3}"
read -r -a LEVELS <<<"${CMP_CONCURRENCY:-16 64}"
WRK_WINDOW="${CMP_WRK_WINDOW:-3}"
WARMUP="${CMP_WARMUP:-1}"
read -r -a LAT_RATES <<<"${CMP_LATENCY_RATES:-2000 5000}"
LAT_WINDOW="${CMP_LATENCY_WINDOW:-5}"
STRACE_N="${CMP_STRACE_REQUESTS:-10000}"
CG_N="${CMP_CG_REQUESTS:-2000}"
CG_WARM="${CMP_CG_WARMUP:-500}"
COUNT_CLIENTS="${CMP_COUNT_CLIENTS:-16}"
read -r -a PROXIES <<<"${CMP_STAGES:-nginx floor ig-off ig-val ig-on}"
TARGET_RATE=10000 # the rate issue 31's CPU targets name
TARGET_ROUNDS="${CMP_TARGET_ROUNDS:-3}"
WRK_ROUNDS="${CMP_WRK_ROUNDS:-3}"
PROXY_CPU="${CMP_PROXY_CPU:-1}"
CLIENT_CPU="${CMP_CLIENT_CPU:-0}"
BASE="${CMP_BASE_PORT:-29900}"
REV="${CMP_REV:-$(basename "$GATEWAY" | sed -n 's/^infergate-\([0-9a-f]\{7,40\}\)$/\1/p')}"
[[ -n "$REV" ]] || REV="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${CMP_OUT:-loadtest/results/$DATE-$REV-compare.md}"
PINNED_WORKERS="${CMP_PINNED_WORKERS:-auto}"
WORKERS="${CMP_WORKERS:-2}" ACCESS_LOG=on BUILD=0 STARTED=$SECONDS
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh

[[ " ${PROXIES[*]} " == *" nginx "* ]] || die "CMP_STAGES must include nginx: every ratio is against it"
require curl jq openssl awk taskset python3
ensure_nginx
ensure_debian wrk:wrk h2load:nghttp2-client strace:strace
ensure_valgrind
for b in fake-triton hyper-floor; do
    [[ -x "$BIN/$b" ]] || die "no $BIN/$b: cargo build --release -p infergate-load (or set CMP_BIN)"
done
describe_machine src

# ---------------------------------------------------------------- the stages
declare -A PORT=([direct]="$BASE" [nginx]=$((BASE + 10)) [ig-off]=$((BASE + 20)) [ig-val]=$((BASE + 30)) [ig-on]=$((BASE + 40))
    [floor]=$((BASE + 50)) [ig-off-b]=$((BASE + 60)) [ig-val-b]=$((BASE + 70)) [ig-on-b]=$((BASE + 80)))
declare -A LABEL=([direct]="direct" [nginx]="nginx" [floor]="floor (bare hyper proxy)" [ig-off]="infergate, validation off"
    [ig-val]="infergate, validation on" [ig-on]="infergate, everything on")
for s in ig-off ig-val ig-on; do LABEL[$s-b]="${LABEL[$s]} (B: $(basename "${GATEWAY_B:-none}"))"; done
# A B stage is its A stage on the second binary.
stage_of() { echo "${1%-b}"; }
for s in "${PROXIES[@]}"; do
    [[ -n "${PORT[$s]:-}" ]] || die "unknown stage: $s"
    [[ "$s" != *-b || -n "$GATEWAY_B" ]] || die "stage $s needs CMP_GATEWAY_B"
done
ports=("$BASE")
for s in "${PROXIES[@]}"; do ports+=("${PORT[$s]}" $((PORT[$s] + 1)) $((PORT[$s] + 2))); done
check_ports "${ports[@]}"

# lib.sh's stage rules, asked of a B stage's A stage.
all_on() { everything_on "$(stage_of "$1")"; }
model() { model_of "$(stage_of "$1")"; }
bearer_of() { if all_on "$1"; then echo "$TOKEN"; fi; }
url_of() { echo "http://127.0.0.1:$2/v2/models/$(model "$1")/infer"; } # stage port
# h2load's and wrk's request headers for a stage.
h2_headers() { H2H=(-H 'content-type: application/json'); all_on "$1" && H2H+=(-H "authorization: Bearer $TOKEN"); return 0; }
wrk_script() { # stage -> $TMP/STAGE.lua: the POST, its body and headers
    {
        printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        printf 'wrk.body = [[%s]]\n' "$INFER_BODY"
        all_on "$1" && printf 'wrk.headers["Authorization"] = "Bearer %s"\n' "$TOKEN"
        true
    } >"$TMP/$1.lua"
}
# rotated K ITEMS... — the items starting at the (K mod n)-th: step K's order.
rotated() { local k="$1"; shift; local n=$# i; for ((i = 0; i < n; i++)); do local j=$(((k + i) % n + 1)); echo "${!j}"; done; }

everything_on_key
printf '%s' "$INFER_BODY" >"$TMP/body.json"

# start_proxy STAGE PORT [NGINX_GLOBALS] — nginx or a gateway on PORT over the backend
# (PROXY_WRAP and WORKERS apply); waits until one inference goes through; sets STARTED_PIDS
# (nginx: master and workers).
start_proxy() {
    local s="$1" port="$2" name="$1-$2"
    if [[ "$s" == nginx ]]; then
        start_nginx "$name" "$port" "$BASE" proxy.conf.template "${3:-}"
    elif [[ "$s" == floor ]]; then
        local workers=(--workers "$WORKERS")
        [[ "$WORKERS" == auto ]] && workers=() # its default: the cores it may use
        "${PROXY_WRAP[@]}" "$BIN/hyper-floor" --listen "127.0.0.1:$port" --backend "127.0.0.1:$BASE" \
            "${workers[@]}" >"$TMP/$name.log" 2>&1 &
        PIDS+=("$!")
        PID[$name]=$!
    else
        fake_gateway_config "$port" "$(stage_on "$(stage_of "$s")")" "" "$BASE" >"$TMP/$name.toml"
        start_infergate "$name" "$TMP/$name.toml" "$([[ "$s" == *-b ]] && echo "$GATEWAY_B" || echo "$GATEWAY")"
    fi
    wait_http "http://127.0.0.1:$port/v2/health/ready" 120 ||
        die "$name did not start: $(tail -5 "$TMP/$name.log" "$TMP/nginx-$name/error.log" 2>/dev/null)"
    wait_infer "http://127.0.0.1:$port" "$(model "$s")" 120 "$(bearer_of "$s")" ||
        die "$name never answered an inference: $(tail -5 "$TMP/$name.log" 2>/dev/null)"
    local pids="${PID[$name]}" deadline=$((SECONDS + 30)) workers="$WORKERS"
    [[ "$workers" == auto ]] && workers="$("${PROXY_WRAP[@]}" nproc)" # the cores it may use
    if [[ "$s" == nginx && "${3:-}" != *"master_process off"* ]]; then # until every worker is up
        until (($(pgrep -c -P "${PID[$name]}" || true) >= workers)); do
            ((SECONDS < deadline)) || die "nginx $name: fewer than $workers workers"
            sleep 0.2
        done
        pids+=" $(children "${PID[$name]}")"
    fi
    STARTED_PIDS="$pids"
}

# h2 OUT STAGE PORT SECONDS ARGS... — one bounded h2load run at STAGE on PORT; OUT gets its
# output; sets H2_OK (requests that succeeded), H2_RPS, H2_MEAN_US (mean time per request).
h2() {
    local out="$1" s="$2" port="$3" bound="$4"; shift 4
    h2_headers "$s"
    timeout "$bound" h2load --h1 -t 1 "${H2H[@]}" -d "$TMP/body.json" "$@" "$(url_of "$s" "$port")" >"$out" 2>&1 ||
        { tail -5 "$out" >&2; die "h2load failed or timed out at $s ($*)"; }
    H2_OK="$(h2load_ok "$out")"
    H2_RPS="$(awk '/^finished in/ { print $4 }' "$out")"
    H2_MEAN_US="$(awk '/^time for request:/ { v = $6; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
        printf "%.0f", v * (u == "s" ? 1e6 : u == "ms" ? 1e3 : 1) }' "$out")"
    [[ -n "$H2_OK" ]] || die "no request count in h2load's output ($out)"
}
field() { cut -d' ' -f"$2" <<<"$1"; }
# switches PIDS... — context switches (voluntary and not) of every thread of the processes so
# far: each is a sleep and a wake, kernel work a user-space count does not show.
switches() { local p; for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null; done | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }'; }
per_req() { awk -v t="$1" -v n="$2" 'BEGIN { if (n > 0) printf "%.2f", t / n; else print "-" }'; }

# ---------------------------------------------------------------- backend and proxies
say "fake-triton on core $CLIENT_CPU, then ${PROXIES[*]} (temp dir $TMP)"
taskset -c "$CLIENT_CPU" "$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads 1 >"$TMP/fake.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"
declare -A PROXY_PIDS # stage -> its process ids, of the instance families 1 and 3a measure
for s in "${PROXIES[@]}"; do
    start_proxy "$s" "${PORT[$s]}"
    PROXY_PIDS[$s]="$STARTED_PIDS"
    wrk_script "$s"
done
wrk_script direct

# ---------------------------------------------------------------- 1. equal offered load
declare -A OPEN   # stage-rate -> "achieved_rps ok mean_us cpu_us_per_req load"
declare -A ROUNDS # stage -> CPU µs/req of each round at TARGET_RATE, in order
# open_step STAGE RATE — one open-loop step: sets OPEN[STAGE-RATE]
open_step() {
    local s="$1" rate="$2" before after kernel switched
    # shellcheck disable=SC2086
    before="$(ticks ${PROXY_PIDS[$s]}) $(sys_ticks ${PROXY_PIDS[$s]}) $(switches ${PROXY_PIDS[$s]})"
    h2 "$TMP/open-$s-$rate.txt" "$s" "${PORT[$s]}" $((OPEN_WINDOW + 20)) \
        -c "$OPEN_CLIENTS" --rps $(((rate + OPEN_CLIENTS - 1) / OPEN_CLIENTS)) -D "$OPEN_WINDOW"
    # shellcheck disable=SC2086
    after="$(ticks ${PROXY_PIDS[$s]}) $(sys_ticks ${PROXY_PIDS[$s]}) $(switches ${PROXY_PIDS[$s]})"
    kernel="$(per_req_us $(($(field "$after" 2) - $(field "$before" 2))) "$H2_OK")"
    switched="$(per_req $(($(field "$after" 3) - $(field "$before" 3))) "$H2_OK")"
    OPEN[$s-$rate]="$H2_RPS $H2_OK $H2_MEAN_US $(per_req_us $(($(field "$after" 1) - $(field "$before" 1))) "$H2_OK") $(cut -d' ' -f1 /proc/loadavg) $kernel $switched"
    say "open loop $rate req/s, $s: ${OPEN[$s-$rate]} (achieved, ok, mean µs, CPU µs/req, load, kernel µs/req, context switches/req)"
    [[ "$rate" == "$TARGET_RATE" ]] && ROUNDS[$s]+="$(cut -d' ' -f4 <<<"${OPEN[$s-$rate]}") "
    return 0
}
step=0
for rate in "${RATES[@]}"; do
    for s in $(rotated $step "${PROXIES[@]}"); do open_step "$s" "$rate"; done
    step=$((step + 1))
done
# The targets' rate again, each round in another order: one round's ratio moves by 0.1–0.3
# on a shared machine, the median of several less.
if [[ " ${RATES[*]} " == *" $TARGET_RATE "* ]]; then
    for ((round = 2; round <= TARGET_ROUNDS; round++)); do
        for s in $(rotated $((step + round)) "${PROXIES[@]}"); do
            first="${OPEN[$s-$TARGET_RATE]}" # family 1's table shows the first round
            open_step "$s" "$TARGET_RATE"
            OPEN[$s-$TARGET_RATE]="$first"
        done
    done
fi

# ---------------------------------------------------------------- 2. closed loop, pinned
# Each proxy once more, started on the proxy's core with PINNED_WORKERS, on its port + 2;
# the instances of family 1 stay idle. direct is the backend itself.
declare -A PINNED_PIDS # stage -> the pinned instance's process ids
for s in "${PROXIES[@]}"; do
    PROXY_WRAP=(taskset -c "$PROXY_CPU")
    WORKERS="$PINNED_WORKERS" start_proxy "$s" $((PORT[$s] + 2))
    PROXY_WRAP=()
    PINNED_PIDS[$s]="$STARTED_PIDS"
done
say "pinned to core $PROXY_CPU with workers=$PINNED_WORKERS: ${PROXIES[*]}"
pinned_port() { if [[ "$1" == direct ]]; then echo "$BASE"; else echo $((PORT[$1] + 2)); fi; }
# wrk_run OUT STAGE C SECONDS — bounded wrk, one thread, on the client's core.
wrk_run() {
    timeout $(($4 + 20)) taskset -c "$CLIENT_CPU" wrk -t 1 -c "$3" -d "${4}s" --latency -s "$TMP/$2.lua" \
        "$(url_of "$2" "$(pinned_port "$2")")" >"$1" 2>&1 || { tail -5 "$1" >&2; die "wrk failed or timed out at $2 c=$3"; }
}
wrk_us() { # file percentile -> µs
    awk -v p="$2%" '$1 == p { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
        printf "%.0f", v * (u == "s" ? 1e6 : u == "ms" ? 1e3 : 1); exit }' "$1"
}
wrk_rps() { awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$1"; } # file -> req/s
# wrk_errors FILE — answers other than 2xx and socket errors: a fast failure is no throughput
wrk_errors() { awk '/Non-2xx/ { e += $NF } /Socket errors/ { for (i = 4; i <= NF; i += 2) e += $i } END { print e + 0 }' "$1"; }
declare -A CLOSED # stage-c -> "rps p50 p99 cpu_us_per_req errors load"
declare -A WRK_OF     # stage -> req/s at c=16 of each round, in order
declare -A WRK_ERRORS # stage -> errors at c=16 over the rounds
step=0
for c in "${LEVELS[@]}"; do
    for s in $(rotated $step direct "${PROXIES[@]}"); do
        wrk_run "$TMP/warm.txt" "$s" "$c" "$WARMUP"
        # shellcheck disable=SC2086
        before="$(ticks ${PINNED_PIDS[$s]:-}) $(sys_ticks ${PINNED_PIDS[$s]:-})"
        wrk_run "$TMP/wrk-$s-$c.txt" "$s" "$c" "$WRK_WINDOW"
        # shellcheck disable=SC2086
        after="$(ticks ${PINNED_PIDS[$s]:-}) $(sys_ticks ${PINNED_PIDS[$s]:-})"
        out="$TMP/wrk-$s-$c.txt"
        n="$(awk '/requests in/ { print $1; exit }' "$out")"
        errors="$(wrk_errors "$out")"
        cpu="- -"
        [[ "$s" == direct ]] || cpu="$(per_req_us $(($(field "$after" 1) - $(field "$before" 1))) "$n") $(per_req_us $(($(field "$after" 2) - $(field "$before" 2))) "$n")"
        CLOSED[$s-$c]="$(wrk_rps "$out") $(wrk_us "$out" 50) $(wrk_us "$out" 99) ${cpu% *} $errors $(cut -d' ' -f1 /proc/loadavg) ${cpu#* }"
        say "wrk c=$c, $s: ${CLOSED[$s-$c]} (req/s, p50 µs, p99 µs, CPU µs/req, errors, load, kernel µs/req)"
        if ((c == 16)); then
            WRK_OF[$s]+="$(wrk_rps "$out") "
            WRK_ERRORS[$s]=$errors
        fi
    done
    step=$((step + 1))
done
# The c=16 step, which the wrk target names, again in rounds 2..WRK_ROUNDS, each in another
# order: one 3 s window a stage swings with the machine's other load, a median of rounds less.
if [[ " ${LEVELS[*]} " == *" 16 "* ]]; then
    for ((round = 2; round <= WRK_ROUNDS; round++)); do
        for s in $(rotated $((step + round)) "${PROXIES[@]}"); do
            wrk_run "$TMP/warm.txt" "$s" 16 "$WARMUP"
            out="$TMP/wrk-$s-16-$round.txt"
            wrk_run "$out" "$s" 16 "$WRK_WINDOW"
            WRK_OF[$s]+="$(wrk_rps "$out") "
            WRK_ERRORS[$s]=$((WRK_ERRORS[$s] + $(wrk_errors "$out")))
        done
        say "wrk c=16, round $round: $(for s in "${PROXIES[@]}"; do printf '%s %s; ' "$s" "$(xargs -n1 <<<"${WRK_OF[$s]}" | tail -1)"; done)"
    done
fi

# ---------------------------------------------------------------- 2b. open loop, pinned
# The same pinned instances, but requests sent at a fixed rate (infergate-load --rate, latency
# counted from each request's intended send time), below every proxy's saturation: the
# latency a proxy adds when it is not the bottleneck.
declare -A LATENCY # stage-rate -> "rps p50 p99 send_lag_p99 errors load"
latency_run() { # OUT STAGE RATE
    local args=(--url "http://127.0.0.1:$(pinned_port "$2")" -m "$(model "$2")" --request-file "$TMP/body.json"
        --check --threads 1 --json -q --rate "$3" --warmup "${WARMUP}s" -d "${LAT_WINDOW}s" --windows 1)
    all_on "$2" && args+=(--bearer "$TOKEN")
    timeout $((WARMUP + LAT_WINDOW + 30)) taskset -c "$CLIENT_CPU" "$BIN/infergate-load" "${args[@]}" >"$1" 2>"$1.err" ||
        { tail -5 "$1.err" >&2; die "infergate-load --rate $3 failed or timed out at $2"; }
}
step=0
for rate in "${LAT_RATES[@]}"; do
    for s in $(rotated $step direct "${PROXIES[@]}"); do
        latency_run "$TMP/lat-$s-$rate.json" "$s" "$rate"
        LATENCY[$s-$rate]="$(jq -r '.steps[0] | "\(.throughput_rps | floor) \(.latency_us.p50) \(.latency_us.p99) \(.send_lag_us.p99 // 0) \(.errors)"' \
            "$TMP/lat-$s-$rate.json") $(cut -d' ' -f1 /proc/loadavg)"
        say "open loop, pinned, $rate req/s, $s: ${LATENCY[$s-$rate]} (req/s, p50 µs, p99 µs, send lag p99 µs, errors, load)"
    done
    step=$((step + 1))
done
# shellcheck disable=SC2086
for s in "${PROXIES[@]}"; do stop_pids ${PINNED_PIDS[$s]%% *}; done

# ---------------------------------------------------------------- 3a. syscalls per request
# every thread of PIDS traced (TracerPid set), or give up after 10 s
traced() {
    local p t deadline=$((SECONDS + 10))
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            until [[ "$(awk '/^TracerPid:/ { print $2 }' "$t/status" 2>/dev/null)" != 0 ]]; do
                ((SECONDS < deadline)) || return 1
                sleep 0.1
            done
        done
    done
}
declare -A SYSCALLS # stage -> calls per request; SYS_TOP[stage] -> its five most frequent
declare -A SYS_TOP
step=0
for s in $(rotated 1 "${PROXIES[@]}"); do
    traced_pids="${PROXY_PIDS[$s]}"
    [[ "$s" == nginx ]] && traced_pids="$(children "${PROXY_PIDS[$s]%% *}")" # the master idles
    args=()
    for p in $traced_pids; do args+=(-p "$p"); done
    timeout 300 strace -c -f -o "$TMP/strace-$s.txt" "${args[@]}" 2>"$TMP/strace-$s.err" &
    strace_pid=$!
    # shellcheck disable=SC2086
    traced $traced_pids || die "strace did not attach to $s: $(tail -3 "$TMP/strace-$s.err")"
    h2 "$TMP/strace-h2-$s.txt" "$s" "${PORT[$s]}" 120 -c "$COUNT_CLIENTS" -n "$STRACE_N"
    kill -INT "$strace_pid"
    wait "$strace_pid" || true
    calls="$(awk '$NF == "total" { print $4 }' "$TMP/strace-$s.txt")"
    [[ -n "$calls" ]] || die "no strace summary for $s: $(tail -3 "$TMP/strace-$s.err")"
    SYSCALLS[$s]="$(calc %.2f "$calls / $H2_OK")"
    SYS_TOP[$s]="$(awk -v n="$H2_OK" '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { printf "%s %.2f\n", $NF, $4 / n }' "$TMP/strace-$s.txt" |
        sort -k2 -g -r | head -5 | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }')"
    say "strace, $s: $calls syscalls over $H2_OK requests: ${SYSCALLS[$s]} per request (${SYS_TOP[$s]})"
done

# ---------------------------------------------------------------- 3b. instructions per request
# Each proxy once more, alone under callgrind, on its port + 1; the proxies above stay idle.
# nginx runs as one process (master_process off and one worker: the worker's loop in the
# process valgrind started), because callgrind_control cannot reach a forked child (vgdb
# makes no FIFOs for it); the gateway keeps its workers.
declare -A IR MISSES # stage -> Ir per request; "L1i L1d" simulated misses per request
for s in $(rotated 2 "${PROXIES[@]}"); do
    port=$((PORT[$s] + 1))
    PROXY_WRAP=(env GLIBC_TUNABLES="$CALLGRIND_TUNABLES" valgrind --tool=callgrind --vgdb-prefix="$VG"
        --callgrind-out-file="$TMP/cg-%p.cg" --dump-instr=no --collect-jumps=no --dump-line=no "${CACHE_SIM[@]}")
    t0=$SECONDS
    if [[ "$s" == nginx ]]; then
        # one worker too: with `reuseport` each worker has its own listening socket, and the
        # second one would never be accepted from
        WORKERS=1 start_proxy "$s" "$port" "master_process off;"
    else
        start_proxy "$s" "$port"
    fi
    PROXY_WRAP=()
    counted="$STARTED_PIDS"
    h2 "$TMP/cg-warm-$s.txt" "$s" "$port" 300 -c "$COUNT_CLIENTS" -n "$CG_WARM"
    for p in $counted; do cg --zero "$p" || die "callgrind_control --zero $p ($s) failed: $(tail -3 "$TMP/cgctl.log")"; done
    h2 "$TMP/cg-h2-$s.txt" "$s" "$port" 600 -c "$COUNT_CLIENTS" -n "$CG_N"
    sleep 0.5 # h2load's connections closed before the count is read
    total=0 i1=0 d1=0
    for p in $counted; do
        dump cg_file "cg-$p" "$p"
        total=$((total + $(ir_of "$cg_file")))
        read -r a b < <(misses_of "$cg_file")
        i1=$((i1 + a)) d1=$((d1 + b))
    done
    IR[$s]="$(calc %.0f "$total / $H2_OK")"
    MISSES[$s]="$(calc %.0f "$i1 / $H2_OK") $(calc %.0f "$d1 / $H2_OK")"
    say "callgrind, $s: $total Ir over $H2_OK requests: ${IR[$s]} per request, L1 misses (i d) ${MISSES[$s]} ($((SECONDS - t0)) s)"
    # shellcheck disable=SC2086
    stop_pids ${counted%% *}
done
LOAD_AFTER="$(loadavg)"
ELAPSED=$((SECONDS - STARTED))

# ---------------------------------------------------------------- report
# added STAGE V D K — field K of a stage's figures V minus direct's D ("—" for direct itself)
added() { if [[ "$1" == direct ]]; then echo —; else echo $(($(field "$2" "$4") - $(field "$3" "$4"))); fi; }
# latency_rows FIGURES STEP... — families 2 and 2b: a row per step and stage of FIGURES
# ("rate p50 p99 a b c [k]"): the rate (and × nginx's, for CLOSED), p50, p99, both added to
# direct's, then a, (for CLOSED, k: the kernel's part of a, the CPU), b and c.
latency_rows() {
    local name="$1" step s v d; shift
    local -n figures="$name"
    for step in "$@"; do
        d="${figures[direct-$step]}"
        for s in direct "${PROXIES[@]}"; do
            v="${figures[$s-$step]}"
            printf '| %s | %s | %s |' "$step" "${LABEL[$s]}" "$(field "$v" 1)"
            if [[ "$name" == CLOSED ]]; then
                printf ' %s |' "$([[ $s == direct ]] && echo — || ratio "$(field "$v" 1)" "$(field "${figures[nginx-$step]}" 1)")"
            fi
            printf ' %s | %s | %s | %s | %s |' "$(field "$v" 2)" "$(field "$v" 3)" \
                "$(added "$s" "$v" "$d" 2)" "$(added "$s" "$v" "$d" 3)" "$(field "$v" 4)"
            [[ "$name" == CLOSED ]] && printf ' %s |' "$(field "$v" 7)"
            printf ' %s | %s |\n' "$(field "$v" 5)" "$(field "$v" 6)"
        done
    done
}
igs=()
for s in "${PROXIES[@]}"; do [[ "$s" == nginx || "$s" == floor ]] || igs+=("$s"); done
has() { [[ " ${PROXIES[*]} " == *" $1 "* ]]; }
# round_ratios STAGE — the stage's CPU per request ÷ nginx's in each round at TARGET_RATE
round_ratios() {
    local -a mine theirs
    read -r -a mine <<<"${ROUNDS[$1]}"
    read -r -a theirs <<<"${ROUNDS[nginx]}"
    local i
    for i in "${!mine[@]}"; do ratio "${mine[$i]}" "${theirs[$i]}"; echo; done
}
# target_ratio STAGE — the median of round_ratios: the figure the CPU targets are judged by
target_ratio() { round_ratios "$1" | median | xargs printf '%.2f'; }
# wrk_ratio STAGE — the median over the c=16 rounds of the stage's req/s ÷ nginx's in the
# same round: the figure the wrk target is judged by
wrk_ratio() {
    local -a mine theirs
    read -r -a mine <<<"${WRK_OF[$1]}"
    read -r -a theirs <<<"${WRK_OF[nginx]}"
    local i
    for i in "${!mine[@]}"; do ratio "${mine[$i]}" "${theirs[$i]}"; echo; done | median | xargs printf '%.2f'
}

report() {
    echo "# infergate ($REV) next to nginx: $DATE"
    echo
    echo "Produced by \`loadtest/compare.sh\` in ${ELAPSED} s. Gateway: \`$GATEWAY\`$([[ "$GATEWAY" == "$ROOT/target/release/infergate" ]] && ((DIRTY)) && echo " (built from $REV plus $DIRTY uncommitted paths under src/)")${GATEWAY_B:+; B: \`$(basename "$GATEWAY_B")\`}. nginx $("$NGINX" -v 2>&1 | cut -d/ -f2) (Debian), \`loadtest/nginx/proxy.conf.template\`."
    echo
    echo "- Machine: $NPROC × $CPU_MODEL, $MEM, $KERNEL; load average $LOAD_BEFORE before, $LOAD_AFTER after (a shared machine: CPU per request and the counts of family 3 hold up under other load, throughput and latency do not)."
    echo "- Backend: fake-triton, 1 thread, pinned to core $CLIENT_CPU. Proxies: $WORKERS workers each (nginx \`worker_processes\`, infergate \`server.workers\`) in families 1 and 3, and in families 2 and 2b a second instance of each started on core $PROXY_CPU alone with workers = $PINNED_WORKERS (auto: each proxy's default, one worker a core it may use), access logs on for both (nginx's default format to a file; infergate at info level to a file)."
    echo "- Request: HTTP/1.1 keep-alive POST \`/v2/models/add_sub/infer\` (everything on: route \`bench\`, \`Authorization: Bearer\` RS256 JWT), JSON body \`$INFER_BODY\`."
    echo "- Stages: $(for s in "${PROXIES[@]}"; do printf '%s (\x60%s\x60); ' "${LABEL[$s]}" "$s"; done | sed 's/; $//'). Everything on: validation, RS256 JWT (verified-token cache on), 90/10 route with an error-rate guard (lib.sh \`everything_on_tables\`). Order rotated step by step."
    echo
    echo "## 1. Equal offered load (open loop, h2load)"
    echo
    echo "\`h2load --h1 -t 1 -c $OPEN_CLIENTS --rps ⌈rate/$OPEN_CLIENTS⌉ -D $OPEN_WINDOW\` (not pinned). CPU: utime+stime of all the proxy's processes (/proc/PID/stat, ${HZ} Hz ticks) over the run ÷ requests that succeeded; of it kernel: stime alone (system calls, and the loopback TCP work the kernel does on the proxy's behalf). Context switches: voluntary and involuntary, of every thread (/proc/PID/task/*/status), per request: each a sleep and a wake-up. Mean: h2load's mean time per request (it reports no percentiles). \"Behind\": less than 95% of the offered rate achieved (h2load's connections carry one request at a time, so a slow proxy lowers the rate): that row's load was not equal."
    echo
    echo "| offered req/s | stage | achieved req/s | requests | mean µs | proxy CPU µs/req | of it kernel | context switches/req | CPU × nginx | load avg |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    local rate s v n c
    for rate in "${RATES[@]}"; do
        n="${OPEN[nginx-$rate]}"
        for s in "${PROXIES[@]}"; do
            v="${OPEN[$s-$rate]}"
            printf '| %s | %s | %.0f%s | %s | %s | %s | %s | %s | %s | %s |\n' "$rate" "${LABEL[$s]}" "$(field "$v" 1)" \
                "$(awk -v a="$(field "$v" 1)" -v r="$rate" 'BEGIN { if (a < 0.95 * r) printf " (behind)" }')" "$(field "$v" 2)" \
                "$(field "$v" 3)" "$(field "$v" 4)" "$(field "$v" 6)" "$(field "$v" 7)" \
                "$(ratio "$(field "$v" 4)" "$(field "$n" 4)")" "$(field "$v" 5)"
        done
    done
    if [[ -n "${ROUNDS[nginx]:-}" ]]; then
        echo
        echo "### $TARGET_RATE req/s in $TARGET_ROUNDS rounds"
        echo
        echo "The step above (round 1) again, each round in another order; CPU × nginx within each round, and the median the targets below are judged by."
        echo
        echo "| stage | CPU µs/req, each round | × nginx, each round | median × nginx |"
        echo "|---|---|---|---:|"
        for s in "${PROXIES[@]}"; do
            printf '| %s | %s | %s | %s |\n' "${LABEL[$s]}" "$(xargs <<<"${ROUNDS[$s]}" | sed 's/ /, /g')" \
                "$(round_ratios "$s" | xargs | sed 's/ /, /g')" "$(target_ratio "$s")"
        done
    fi
    echo
    echo "## 2. Closed loop (wrk), proxy started on core $PROXY_CPU (workers: $PINNED_WORKERS), wrk and backend on core $CLIENT_CPU"
    echo
    echo "\`wrk -t 1 -c C -d ${WRK_WINDOW}s --latency\` after ${WARMUP} s of warm-up. Added: the stage's percentile minus direct's at the same C."
    echo
    echo "| c | stage | req/s | × nginx | p50 µs | p99 µs | added p50 µs | added p99 µs | proxy CPU µs/req | of it kernel | errors | load avg |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    latency_rows CLOSED "${LEVELS[@]}"
    echo
    if [[ -n "${WRK_OF[nginx]:-}" ]]; then
        echo "### c=16 in $WRK_ROUNDS rounds"
        echo
        echo "The c=16 step again, each round in another order; req/s × nginx within each round, and the median the wrk target is judged by."
        echo
        echo "| stage | req/s, each round | median × nginx | errors, all rounds |"
        echo "|---|---|---:|---:|"
        for s in "${PROXIES[@]}"; do
            printf '| %s | %s | %s | %s |\n' "${LABEL[$s]}" "$(xargs <<<"${WRK_OF[$s]}" | sed 's/ /, /g')" "$(wrk_ratio "$s")" "${WRK_ERRORS[$s]}"
        done
        echo
    fi
    echo "## 2b. Open loop at a fixed rate, proxy started on core $PROXY_CPU (workers: $PINNED_WORKERS), client and backend on core $CLIENT_CPU"
    echo
    echo "\`infergate-load --rate R --threads 1\` (up to 128 connections, latency from each request's intended send time) after ${WARMUP} s of warm-up, ${LAT_WINDOW} s measured, below every proxy's saturation: what a proxy adds when it is not the bottleneck. Added: the stage's percentile minus direct's at the same rate. Send lag: how late the client itself sent (its p99); a large one means the client, not the proxy, fell behind."
    echo
    echo "| req/s | stage | achieved req/s | p50 µs | p99 µs | added p50 µs | added p99 µs | send lag p99 µs | errors | load avg |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    latency_rows LATENCY "${LAT_RATES[@]}"
    echo
    echo "## 3. Counts per request"
    echo
    echo "Syscalls: \`strace -c -f\` attached to the running proxy (nginx: its workers; infergate: every thread) over \`h2load -n $STRACE_N -c $COUNT_CLIENTS\` (its $COUNT_CLIENTS connects included), all calls counted. Instructions: user-space Ir under \`valgrind --tool=callgrind\` ($(valgrind --version)) of a fresh instance of the proxy (nginx: one process, \`master_process off\` and one worker, as callgrind_control cannot reach forked workers; infergate: $WORKERS workers), zeroed after $CG_WARM warm-up requests, dumped after \`h2load -n $CG_N -c $COUNT_CLIENTS\`; idle work inside the window included; GLIBC_TUNABLES=\`$CALLGRIND_TUNABLES\` (see instructions.sh). L1 misses: the same run's simulated first-level cache misses (\`--cache-sim=yes\`, valgrind's model of this CPU's L1i and L1d; L1d counts read and write misses), per request: code and data the request reaches beyond what stays in L1 from one request to the next, each served by L2 at some 5-15 cycles."
    echo
    echo "| stage | syscalls/req | − nginx | most frequent (per request) | Ir/req | × nginx | L1i misses/req | × nginx | L1d misses/req | × nginx |"
    echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
    for s in "${PROXIES[@]}"; do
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "${LABEL[$s]}" "${SYSCALLS[$s]}" \
            "$(calc %+.2f "${SYSCALLS[$s]} - ${SYSCALLS[nginx]}")" "${SYS_TOP[$s]}" \
            "$(printf "%'d" "${IR[$s]}")" "$(ratio "${IR[$s]}" "${IR[nginx]}")" \
            "$(field "${MISSES[$s]}" 1)" "$(ratio "$(field "${MISSES[$s]}" 1)" "$(field "${MISSES[nginx]}" 1)")" \
            "$(field "${MISSES[$s]}" 2)" "$(ratio "$(field "${MISSES[$s]}" 2)" "$(field "${MISSES[nginx]}" 2)")"
    done
    echo
    echo "## Issue 31 targets (infergate ÷ nginx, this run)"
    echo
    local r
    if [[ " ${RATES[*]} " == *" 10000 "* ]]; then
        if has ig-val; then
            r="$(target_ratio ig-val)"
            echo "- CPU per request at 10k req/s offered, validation on, ≤ 1.3 × nginx: $r (median of $TARGET_ROUNDS rounds) — $(met "$r" 1.3001 "<")."
        fi
        if has ig-on; then
            r="$(target_ratio ig-on)"
            echo "- CPU per request at 10k req/s offered, everything on, ≤ 1.6 × nginx: $r (median of $TARGET_ROUNDS rounds) — $(met "$r" 1.6001 "<")."
        fi
        for s in ig-off-b ig-val-b ig-on-b; do
            has "$s" || continue
            echo "- B: CPU per request at 10k req/s offered, ${LABEL[$s]#infergate, }: $(target_ratio "$s") × nginx, against A's $(target_ratio "$(stage_of "$s")") (medians of $TARGET_ROUNDS rounds)."
        done
    fi
    if [[ " ${LEVELS[*]} " == *" 16 "* ]]; then
        for s in "${igs[@]}"; do
            r="$(wrk_ratio "$s")" verdict="$(met "$r" 0.85 ">=")"
            ((WRK_ERRORS[$s] == 0)) || verdict="**not met**: ${WRK_ERRORS[$s]} errors"
            echo "- wrk c=16 throughput ≥ 0.85 × nginx, ${LABEL[$s]#infergate, }: $r (median of $WRK_ROUNDS rounds) — $verdict."
        done
        for s in "${igs[@]}"; do
            r=$(($(field "${CLOSED[$s-16]}" 3) - $(field "${CLOSED[direct-16]}" 3)))
            echo "- p99 added at c=16, proxy pinned, < 500 µs, ${LABEL[$s]#infergate, }: $r µs — $(met "$r" 500 "<") (nginx: $(($(field "${CLOSED[nginx-16]}" 3) - $(field "${CLOSED[direct-16]}" 3))) µs)."
        done
    fi
    for rate in "${LAT_RATES[@]}"; do
        for s in "${igs[@]}"; do
            r=$(($(field "${LATENCY[$s-$rate]}" 3) - $(field "${LATENCY[direct-$rate]}" 3)))
            echo "- Beside it, p99 added in an open loop at $rate req/s, proxy pinned, < 500 µs, ${LABEL[$s]#infergate, }: $r µs — $(met "$r" 500 "<") (nginx: $(($(field "${LATENCY[nginx-$rate]}" 3) - $(field "${LATENCY[direct-$rate]}" 3))) µs)."
        done
    done
    for s in "${igs[@]}"; do
        r="$(calc %+.2f "${SYSCALLS[$s]} - ${SYSCALLS[nginx]}")"
        echo "- Syscalls per request ≤ nginx's + 1, ${LABEL[$s]#infergate, }: ${SYSCALLS[$s]} vs ${SYSCALLS[nginx]} ($r) — $(met "$r" 1.0001 "<")."
    done
    if has ig-off; then
        r="$(ratio "${IR[ig-off]}" "${IR[nginx]}")"
        echo "- Instructions per request, validation off, ≤ 3 × nginx's: $r — $(met "$r" 3.0001 "<")."
    fi
    if has floor; then floor_line; fi
}

# What the floor (hyper-floor) reaches on the same measures: the least a proxy on hyper and
# tokio spends, so how much of each target a gateway that keeps them can meet.
floor_line() {
    local parts=()
    [[ -n "${ROUNDS[floor]:-}" ]] &&
        parts+=("CPU per request at 10k req/s $(target_ratio floor) × nginx (median of $TARGET_ROUNDS rounds)")
    [[ -n "${CLOSED[floor-16]:-}" ]] &&
        parts+=("wrk c=16 throughput $(wrk_ratio floor) × nginx (median of $WRK_ROUNDS rounds)"
            "p99 added at c=16 $(($(field "${CLOSED[floor-16]}" 3) - $(field "${CLOSED[direct-16]}" 3))) µs")
    parts+=("syscalls ${SYSCALLS[floor]}/request" "instructions $(ratio "${IR[floor]}" "${IR[nginx]}") × nginx")
    echo "- The floor, a bare hyper proxy doing none of the gateway's work: $(join_list "${parts[@]}")."
}

mkdir -p "$(dirname "$OUT")"
for c in "${LEVELS[@]}"; do
    for s in direct "${PROXIES[@]}"; do
        printf 'wrk\t%s\t%s\t%s\t%s\n' "$s" "$c" "$(field "${CLOSED[$s-$c]}" 1)" "$(field "${CLOSED[$s-$c]}" 3)"
    done
done >"$TMP/chart.tsv"
python3 loadtest/chart.py "$TMP/chart.tsv" "${OUT%.md}.svg" "infergate $REV next to nginx, $DATE (proxy on one core, workers: $PINNED_WORKERS)"
if [[ "$(realpath "$(dirname "$OUT")")" == "$ROOT/loadtest/results" ]]; then cp "${OUT%.md}.svg" loadtest/results/compare-latest.svg; fi
report >"$OUT"
cat "$OUT"
say "wrote $OUT and its chart ${OUT%.md}.svg"
