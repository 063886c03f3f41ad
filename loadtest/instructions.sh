#!/usr/bin/env bash
# loadtest/instructions.sh — two infergate builds compared by instructions per request.
#
#   loadtest/instructions.sh BEFORE_BINARY AFTER_BINARY
#
# A deterministic A/B figure for hot-path changes worth 1–3%, which ab.sh's wall-clock CPU
# figures (5–10% apart from run to run on a shared 2-core machine without perf counters)
# cannot confirm: the user-space instructions (callgrind's Ir) the gateway executes per
# inference request, with a profile of where they go. Each binary runs in turn, alone, under
# `valgrind --tool=callgrind`, in front of one native backend shared by all, validation off
# and everything on (as ab.sh: lib.sh's everything_on_tables, an RS256 JWT as bearer, route
# "bench"), default server.workers, RUST_LOG=info (access log on). The backend and the
# load's protocol follow IC_PROTOCOL: `http`, KServe v2 REST (JSON tensors) in front
# of fake-triton (1 thread); `grpc`, ModelInfer (raw tensor contents) on the gateway's
# listen.grpc, forwarded to a real Triton's gRPC port (lib.sh's start_tritons: CPU, python
# add_sub from tests/models, the venv of scripts/setup.sh; fake-triton has no gRPC). Triton
# is slower than fake-triton, but it runs natively, outside the count. For each:
# wait until it serves, a warm-up load, read its infergate_requests_total (a metrics
# listener), `callgrind_control --zero`, the measured load, read the counter again,
# `callgrind_control --dump`: Ir per request = the dump's Ir / the requests it served in
# between. Then `callgrind_annotate` gives the top functions by self and inclusive Ir. The
# same run counts valgrind's simulated L1 instruction and data cache misses (`--cache-sim`,
# lib.sh misses_of): a change that moves no instructions may still spread a request over
# fewer cache lines, and those misses are most of what its time holds beyond its Ir.
#
# What the count holds besides requests, measured per run and reported: the one /metrics
# scrape inside the window (a separate zero / scrape / dump: 0.03% of the count) and the
# gateway's idle work (health checks, timers: zero, IC_IDLE seconds without load, dump)
# scaled to the window (0.07%). Kernel work is not counted: a syscall costs only its
# user-space wrapper here.
#
# memcpy/memset: glibc copies blocks above 2 KiB with `rep movsb` (ERMS), which valgrind
# counts as one instruction per byte; the gateway moves its request futures (~12 KiB) a few
# times per request, so with glibc's defaults memcpy is 42% of the Ir and a figure that
# follows bytes moved, not work done (148k Ir/request with validation off instead of 96k).
# GLIBC_TUNABLES (IC_TUNABLES) raises the rep thresholds so glibc takes its vector loops,
# whose instruction count follows a CPU's work; set IC_TUNABLES= for glibc's defaults.
#
# Determinism, on this 2-vCPU VM under other builds' load, the same binary as BEFORE and
# AFTER, c=16, 20 s windows (~15 000–28 000 requests each, 3 rounds): Ir/request of the six
# runs per stage within 0.25% (validation off, 95 505–95 741) and 0.34% (everything on,
# 136 045–136 503); medians after ÷ before 0.9998 and 1.0005. Throughput under valgrind
# moved by a factor of 1.6 between those runs: the count does not follow it. At c=1 and
# c=64 (8 s windows, one pair each) Ir/request is the same as at c=16 within 1% (batching
# of ready sockets hardly changes the user-space work), but the pairs were 1.1% and 0.7%
# apart, where c=16 pairs with 5 s windows were 0.1–0.2% apart (why, not found);
# c=16 with 20 s windows is the stable setting. One round per side tells 1% apart; for less,
# IC_ROUNDS=3 (medians, and the spread). Over gRPC (IC_PROTOCOL=grpc, c=16, 20 s windows,
# ~7 000–9 000 requests each, 3 rounds) the runs per side and stage were within 0.08–0.22%.
# A run of the default knobs takes about 3 minutes (each of the four runs ~41 s: valgrind
# start-up, warm-up, window, scrape and idle dumps).
#
# Knobs (environment):
#   IC_PROTOCOL=http                                http or grpc (above)
#   IC_CONCURRENCY=16  IC_ROUNDS=1                  load concurrency; runs of each stage × side
#                                                   (figures: median, with the spread)
#   IC_WARMUP=5s  IC_DURATION=20s                   warm-up and measured load per run
#   IC_IDLE=5                                       seconds of the idle measurement
#   IC_TOP=15  IC_INCL_MAX=90                       rows of each profile table; inclusive
#                                                   frames at or above this share left out
#   IC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1073741824:glibc.cpu.x86_rep_stosb_threshold=...
#                                                   GLIBC_TUNABLES of the gateway (below)
#   IC_BEFORE_WORKERS / IC_AFTER_WORKERS            server.workers of each side (default: unset)
#   IC_LABELS="before after"                        how the report names the two sides
#   IC_BIN=target/release                           infergate-load and fake-triton
#   IC_BASE_PORT=29800  IC_OUT=path.md (default: stdout only)
#                                                   ports: base (backend; Triton's grpc and
#                                                   metrics base+1, base+2), base+10..12
#                                                   (gateway http, metrics, grpc)
#   IC_KEEP=dir                                     keep the callgrind dumps and logs there
#   IC_LOG=info                                     the gateways' RUST_LOG (warn: no access log)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
(($# == 2)) || { echo "usage: $0 BEFORE_BINARY AFTER_BINARY" >&2; exit 2; }
declare -A GATEWAY_BIN=([before]="$(realpath "$1")" [after]="$(realpath "$2")")
CONCURRENCY="${IC_CONCURRENCY:-16}"
ROUNDS="${IC_ROUNDS:-1}"
WARMUP="${IC_WARMUP:-5s}"
DURATION="${IC_DURATION:-20s}"
IDLE="${IC_IDLE:-5}"
TOP="${IC_TOP:-15}"
INCL_MAX="${IC_INCL_MAX:-90}"
BASE="${IC_BASE_PORT:-29800}"
read -r -a LABELS <<<"${IC_LABELS:-before after}"
PROTOCOL="${IC_PROTOCOL:-http}"
BIN="$(realpath "${IC_BIN:-$ROOT/target/release}")"
BUILD=0 WORKERS=auto ACCESS_LOG=on STARTED=$SECONDS
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
TUNABLES="${IC_TUNABLES-$CALLGRIND_TUNABLES}"
on_exit() { stop_tritons; }

require curl jq openssl awk
ensure_valgrind
for b in "${GATEWAY_BIN[@]}"; do [[ -x "$b" ]] || die "not an executable: $b"; done
[[ -x "$BIN/infergate-load" && ($PROTOCOL == grpc || -x "$BIN/fake-triton") ]] || die "build the load tool first: cargo build --release -p infergate-load (or set IC_BIN)"
LOAD_ARGS=(-i INPUT0:FP32:4 -i INPUT1:FP32:4 --check --windows 1 --json -q)
case "$PROTOCOL" in
    http) check_ports "$BASE" $((BASE + 10)) $((BASE + 11)) ;;
    grpc)
        require_triton
        check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) $((BASE + 11)) $((BASE + 12))
        LOAD_ARGS+=(--protocol grpc) ;;
    *) die "IC_PROTOCOL is http or grpc, not $PROTOCOL" ;;
esac
describe_machine src

everything_on_key

if [[ "$PROTOCOL" == grpc ]]; then
    start_tritons "$ROOT/tests/models" "$BASE"
    BACKEND="Triton $TRITON_VERSION (CPU, python add_sub from tests/models, explicit model control, native)"
else
    "$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads 1 >"$TMP/fake.log" 2>&1 &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"
    BACKEND="fake-triton (1 thread, native)"
fi

# served METRICS_PORT — inference requests the gateway has answered: infergate_requests_total
# summed over its series (protocol, model, version, backend, route, status).
served() {
    curl -sf "http://127.0.0.1:$1/metrics" >"$TMP/metrics.txt" || die "no /metrics on :$1"
    awk '/^infergate_requests_total[{ ]/ { n += $NF } END { printf "%d\n", n }' "$TMP/metrics.txt"
}
# top FILE inclusive(yes/no) TOTAL — callgrind_annotate's functions as "Ir<TAB>share %<TAB>
# function" (share of the dump's total Ir): the top IC_TOP, inclusive ones below IC_INCL_MAX %
# (the runtime's and the connection task's frames, on every stack, say nothing). A call
# that began before the zero (the worker loop, a connection's task) is dumped as `calls=0`,
# which callgrind_annotate then books as the caller's self cost (so Runtime::block_on would
# hold 99.99% "self"); it is read as one call instead.
top() {
    sed 's/^calls=0 /calls=1 /' "$1" >"$1.fixed"
    callgrind_annotate --threshold=100 --inclusive="$2" --auto=no "$1.fixed" 2>/dev/null |
        awk -v total="$3" -v n="$TOP" -v max="$([[ $2 == yes ]] && echo "$INCL_MAX" || echo 101)" '
            /file:function/ { on = 1; next }
            on && rows < n && /^ *[0-9,]+ / {
                ir = $1; gsub(",", "", ir)
                if (100 * ir / total >= max) next
                line = $0; sub(/^ *[0-9,]+ +(\([^)]*\) +)?/, "", line)
                obj = ""
                if (match(line, / \[[^]]*\]$/)) { obj = substr(line, RSTART + 2, RLENGTH - 3); line = substr(line, 1, RSTART - 1) }
                i = index(line, ":"); fn = (i ? substr(line, i + 1) : line)
                sub(/::h[0-9a-f]{16}$/, "", fn)
                if (fn ~ /^0x/) { k = split(obj, p, "/"); fn = fn " (" p[k] ")" }
                printf "%d\t%.2f\t%s\n", ir, 100 * ir / total, fn
                rows++
            }'
    rm -f "$1.fixed"
}

# measure NAME SIDE ON PORT — one run: the gateway under callgrind, alone (http on PORT,
# metrics PORT+1, with IC_PROTOCOL=grpc grpc on PORT+2, where the load goes); writes
# $TMP/NAME.{ir,req,scrape,idle,self,incl,load.json}.
measure() {
    local name="$1" side="$2" on="$3" port="$4" workers_var="IC_${2^^}_WORKERS"
    local url="http://127.0.0.1:$port" route=add_sub step=() pid t0=$SECONDS grpc=()
    [[ "$PROTOCOL" == grpc ]] && grpc=($((port + 2)))
    local load_url="http://127.0.0.1:${grpc[0]:-$port}"
    ((on)) && { route=bench; step=(--bearer "$TOKEN" --route bench); }
    fake_gateway_config "$port" "$on" "${!workers_var:-}" "$BASE" $((port + 1)) "${grpc[@]}" >"$TMP/$name.toml"
    "${GATEWAY_BIN[$side]}" check --config "$TMP/$name.toml" >"$TMP/$name.check" 2>&1 ||
        { cat "$TMP/$name.check" >&2; die "infergate check refused the $name config"; }
    RUST_LOG="${IC_LOG:-info}" GLIBC_TUNABLES="$TUNABLES" valgrind --tool=callgrind --vgdb-prefix="$VG" --callgrind-out-file="$TMP/$name.cg" \
        --dump-instr=no --collect-jumps=no --dump-line=no "${CACHE_SIM[@]}" \
        "${GATEWAY_BIN[$side]}" --config "$TMP/$name.toml" >"$TMP/$name.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_http "$url/v2/health/ready" 180 || die "$name did not start: $(tail -5 "$TMP/$name.log")"
    wait_infer "$url" "$route" 120 "${step[1]:-}" || die "$name never answered an inference: $(tail -5 "$TMP/$name.log")"
    "$BIN/infergate-load" --url "$load_url" "${LOAD_ARGS[@]}" "${step[@]}" -c "$CONCURRENCY" --warmup 0s \
        --duration "$WARMUP" >"$TMP/$name.warm.json" 2>"$TMP/$name.warm.err" ||
        { cat "$TMP/$name.warm.err" >&2; die "warm-up load failed for $name"; }
    local before after f scrape_f idle_f
    before="$(served $((port + 1)))" || exit 1
    cg --zero "$pid" || die "callgrind_control --zero failed: $(tail -3 "$TMP/cgctl.log")"
    "$BIN/infergate-load" --url "$load_url" "${LOAD_ARGS[@]}" "${step[@]}" -c "$CONCURRENCY" --warmup 0s \
        --duration "$DURATION" >"$TMP/$name.load.json" 2>"$TMP/$name.load.err" ||
        { cat "$TMP/$name.load.err" >&2; die "measured load failed for $name"; }
    sleep 1 # the load tool's connections closed and dropped before the count is read
    after="$(served $((port + 1)))" || exit 1
    dump f "$name" "$pid"
    echo $((after - before)) >"$TMP/$name.req"
    ir_of "$f" >"$TMP/$name.ir"
    misses_of "$f" >"$TMP/$name.misses"
    # what the window holds besides requests: one scrape, and the idle work per second
    cg --zero "$pid"
    served $((port + 1)) >/dev/null
    dump scrape_f "$name" "$pid"
    ir_of "$scrape_f" >"$TMP/$name.scrape"
    cg --zero "$pid"
    sleep "$IDLE"
    dump idle_f "$name" "$pid"
    awk -v ir="$(ir_of "$idle_f")" -v s="$IDLE" 'BEGIN { printf "%.0f\n", ir / s }' >"$TMP/$name.idle"
    top "$f" no "$(cat "$TMP/$name.ir")" >"$TMP/$name.self"
    top "$f" yes "$(cat "$TMP/$name.ir")" >"$TMP/$name.incl"
    stop_pids "$pid"
    [[ -n "${IC_KEEP:-}" ]] && { mkdir -p "$IC_KEEP"; cp "$f" "$IC_KEEP/$name.callgrind"; cp "$TMP/$name.log" "$IC_KEEP/$name.log"; }
    say "$name: $(cat "$TMP/$name.req") requests, $(jq -r '.steps[0] | "\(.throughput_rps | floor) infer/s, load tool ok \(.ok) errors \(.errors)"' "$TMP/$name.load.json"), $(calc '%.0f' "$(cat "$TMP/$name.ir") / $(cat "$TMP/$name.req")") Ir/request ($((SECONDS - t0)) s)"
}

STAGES=(off on)
SIDES=(before after)
port=$((BASE + 10))
for round in $(seq 1 "$ROUNDS"); do
    for on in 0 1; do
        # alternate which side goes first, round by round
        order=("${SIDES[@]}")
        ((round % 2 == 0)) && order=(after before)
        for side in "${order[@]}"; do
            measure "$side-${STAGES[$on]}-r$round" "$side" "$on" "$port"
        done
    done
done

per_req() { awk -v ir="$(cat "$TMP/$1.ir")" -v n="$(cat "$TMP/$1.req")" 'BEGIN { if (n > 0) printf "%.0f", ir / n; else print "-" }'; }
# over the rounds of side-stage: median of FIELD (per_req, req, scrape share, idle share)
rounds_of() { # side-stage what
    local r
    for r in $(seq 1 "$ROUNDS"); do
        local n="$1-r$r"
        case "$2" in
            per_req) per_req "$n"; echo ;;
            i1 | d1) awk -v n="$(cat "$TMP/$n.req")" -v k="$([[ $2 == i1 ]] && echo 1 || echo 2)" \
                '{ if (n > 0) printf "%.0f\n", $k / n; else print "-" }' "$TMP/$n.misses" ;;
            req) cat "$TMP/$n.req" ;;
            rps) jq -r '.steps[0].throughput_rps | floor' "$TMP/$n.load.json" ;;
            errors) jq -r '.steps[0].errors' "$TMP/$n.load.json" ;;
            scrape) calc '%.3f\n' "100 * $(cat "$TMP/$n.scrape") / $(cat "$TMP/$n.ir")" ;;
            idle) calc '%.2f\n' "100 * $(cat "$TMP/$n.idle") * $(jq '.steps[0].measured_s + 1' "$TMP/$n.load.json") / $(cat "$TMP/$n.ir")" ;;
        esac
    done
}
spread() { # side-stage — (max - min) / median of Ir/request over the rounds, %
    rounds_of "$1" per_req | sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); printf "%.2f", 100 * (v[NR] - v[1]) / m }'
}
label() { # side stage
    local l="${LABELS[0]}" w="${IC_BEFORE_WORKERS:-}"
    [[ "$1" == after ]] && { l="${LABELS[1]}"; w="${IC_AFTER_WORKERS:-}"; }
    echo "$l, $([[ "$2" == on ]] && echo "everything on" || echo "validation off")${w:+, $w worker(s)}"
}
frames() { # file requests
    echo "| Ir | Ir/request | share | function |"
    echo "|---:|---:|---:|---|"
    awk -F'\t' -v n="$2" '{ f = $3; gsub(/\|/, "\\|", f); printf "| %d | %.0f | %.2f%% | `%s` |\n", $1, $1 / n, $2, f }' "$1"
}

report() {
    echo "# infergate instructions per request, $PROTOCOL: ${LABELS[0]} / ${LABELS[1]}, $(date +%F)"
    echo
    echo "\`loadtest/instructions.sh\` in $((SECONDS - STARTED)) s: ${LABELS[0]} = \`${GATEWAY_BIN[before]}\`, ${LABELS[1]} = \`${GATEWAY_BIN[after]}\`; each alone under \`valgrind --tool=callgrind\` ($(valgrind --version)), protocol $PROTOCOL (IC_PROTOCOL), backend $BACKEND, infergate-load c=$CONCURRENCY, warm-up $WARMUP, then $DURATION counted (callgrind zeroed before, dumped after); access log on; GLIBC_TUNABLES=\`${TUNABLES:-(unset)}\`; $ROUNDS round(s)$( ((ROUNDS > 1)) && echo ", figures the median of the rounds, sides alternating which goes first"). Ir: user-space instructions of the whole gateway process (every thread), kernel work not counted. Machine: $NPROC × $CPU_MODEL, load average $LOAD_BEFORE before, $(loadavg) after."
    echo
    echo "| stage | requests counted | infer/s under valgrind | Ir per request | × ${LABELS[0]} |$( ((ROUNDS > 1)) && echo " spread over rounds |") L1i / L1d misses per request | scrape / idle share of the count |"
    echo "|---|---:|---:|---:|---:|$( ((ROUNDS > 1)) && echo "---:|")---:|---:|"
    local stage side base v
    for stage in off on; do
        base="$(rounds_of "before-$stage" per_req | median)"
        for side in before after; do
            v="$(rounds_of "$side-$stage" per_req | median)"
            printf '| %s | %s | %s | %s | %s |%s %s / %s | %s%% / %s%% |\n' "$(label "$side" "$stage")" \
                "$(rounds_of "$side-$stage" req | median)" "$(rounds_of "$side-$stage" rps | median)" \
                "$(printf "%'d" "$v")" "$(awk -v a="$v" -v b="$base" 'BEGIN { printf "%.4f", a / b }')" \
                "$( ((ROUNDS > 1)) && echo " $(spread "$side-$stage")% |")" \
                "$(rounds_of "$side-$stage" i1 | median)" "$(rounds_of "$side-$stage" d1 | median)" \
                "$(rounds_of "$side-$stage" scrape | median)" "$(rounds_of "$side-$stage" idle | median)"
        done
    done
    local errors
    errors="$(for side in before after; do for stage in off on; do rounds_of "$side-$stage" errors; done; done | awk '{ s += $1 } END { print s + 0 }')"
    echo
    echo "Requests counted: the gateway's \`infergate_requests_total\` (a \`[listen] metrics\` listener) read before and after the window. Load errors in all windows: $errors. The count holds one /metrics scrape (the reading after) and the gateway's idle work over the window (health checks, timers; measured separately for $IDLE s without load and scaled to the window): the last column, as shares of the window's Ir. L1i / L1d misses: the same run's simulated first-level cache misses (\`--cache-sim=yes\`, lib.sh misses_of; L1d counts reads and writes), per request."
    for stage in off on; do
        for side in before after; do
            echo
            echo "## $(label "$side" "$stage"): top functions by self Ir (round 1)"
            echo
            frames "$TMP/$side-$stage-r1.self" "$(cat "$TMP/$side-$stage-r1.req")"
            echo
            echo "## $(label "$side" "$stage"): top functions by inclusive Ir (round 1)"
            echo
            frames "$TMP/$side-$stage-r1.incl" "$(cat "$TMP/$side-$stage-r1.req")"
        done
    done
}
report >"$TMP/report.md"
[[ -n "${IC_OUT:-}" ]] && cp "$TMP/report.md" "$IC_OUT"
cat "$TMP/report.md"
