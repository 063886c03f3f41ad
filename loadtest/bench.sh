#!/usr/bin/env bash
# loadtest/bench.sh — what infergate costs, next to what users would run instead.
#
# One run, one machine, in turns, the same backend and the same load for each stage:
#   1. direct      straight to the backend
#   2. nginx       nginx (Debian package) proxy_pass with a keep-alive upstream
#   3. ig-off      infergate, validation and auth off
#   4. ig-on       infergate "with everything on" (see stage4_config: what it includes is
#                  decided by what this build accepts, and reported)
# Pass 1 uses fake-triton (add_sub) so the proxies are what is measured: throughput at
# concurrency 1, 16, 64, p50/p99 and *added* latency vs direct, CPU per request and peak RSS
# of each proxy. Pass 2 uses a real Triton (scripts/triton.sh, python add_sub) at
# concurrency 1 and 16: the end-to-end figures (issue 2's gateway-vs-direct added latency).
# Stages are interleaved per concurrency level (direct, nginx, ig-off, ig-on at c=1, then at
# c=16, ...) so a change in machine load hits every stage alike.
#
# Writes loadtest/results/<date>-<short sha>.md and prints it. Needs root only to
# `apt-get install nginx` when it is missing. Stays on loopback; stops only what it started.
#
# Knobs (environment):
#   BENCH_BASE_PORT=29000    ports used: base..base+33 (pass 1), base+100..base+133 (pass 2)
#   BENCH_WARMUP=1s BENCH_WINDOW=3s BENCH_WINDOWS=3   per step (infergate-load flags)
#   BENCH_CONCURRENCY="1 16 64"  BENCH_REAL_CONCURRENCY="1 16"
#   BENCH_PROXY_WORKERS=1    nginx worker_processes and infergate's server.workers;
#                            "auto" = one per core for both
#   BENCH_LOAD_THREADS=1 BENCH_BACKEND_THREADS=1   load generator / fake-triton threads
#   BENCH_ACCESS_LOG=on      on: both proxies write a line per request to a file; off: neither
#   BENCH_REAL=1             0 skips the real-Triton pass
#   BENCH_BUILD=1            0 skips `cargo build --release`
#   BENCH_BIN=target/release the binaries (infergate, infergate-load, fake-triton), for a
#                            build made elsewhere (with BENCH_BUILD=0)
#   BENCH_OUT=path.md        results file (default loadtest/results/<date>-<sha>.md)
#   BENCH_PROFILE="16"       concurrency levels at which stage 4 of pass 1 is profiled, after it
#                            is measured (an extra, unmeasured step): `perf record` (linux-perf)
#                            and an inferno flamegraph (`cargo install inferno`) next to the
#                            results, the top frames in the report. Empty (default): none.
#
# Next to the results file: a chart (<results>.svg; for a run recorded in loadtest/results/, also
# loadtest/results/latest.svg, the one docs/performance.md shows) of throughput and p99 against concurrency for every stage (loadtest/chart.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${BENCH_BASE_PORT:-29000}"
WARMUP="${BENCH_WARMUP:-1s}"
WINDOW="${BENCH_WINDOW:-3s}"
WINDOWS="${BENCH_WINDOWS:-3}"
read -r -a LEVELS <<<"${BENCH_CONCURRENCY:-1 16 64}"
read -r -a REAL_LEVELS <<<"${BENCH_REAL_CONCURRENCY:-1 16}"
WORKERS="${BENCH_PROXY_WORKERS:-1}"
LOAD_THREADS="${BENCH_LOAD_THREADS:-1}"
BACKEND_THREADS="${BENCH_BACKEND_THREADS:-1}"
ACCESS_LOG="${BENCH_ACCESS_LOG:-on}"
REAL="${BENCH_REAL:-1}"
read -r -a PROFILE_LEVELS <<<"${BENCH_PROFILE:-}"
BUILD="${BENCH_BUILD:-1}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${BENCH_OUT:-loadtest/results/$DATE-$SHA.md}"
BIN="$(realpath -m "${BENCH_BIN:-$ROOT/target/release}")"
STARTED=$SECONDS

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
on_exit() { if ((TRITON_STARTED)); then scripts/triton.sh stop 1 $((BASE + 100)) >/dev/null 2>&1 || true; fi; }
TRITON_STARTED=0

require curl jq openssl python3
((${#PROFILE_LEVELS[@]})) && require perf inferno-collapse-perf inferno-flamegraph
ensure_nginx
PORTS=("$BASE" $((BASE + 10)) $((BASE + 20)) $((BASE + 22)) $((BASE + 23)) $((BASE + 30)) $((BASE + 32)) $((BASE + 33)))
if ((REAL)); then
    PORTS+=($((BASE + 100)) $((BASE + 101)) $((BASE + 102)) $((BASE + 110)) $((BASE + 120)) $((BASE + 122)) $((BASE + 123)) $((BASE + 130)) $((BASE + 132)) $((BASE + 133)))
fi
check_ports "${PORTS[@]}"
build_release infergate infergate-load fake-triton

LOAD_ARGS=(-i INPUT0:FP32:4 -i INPUT1:FP32:4 --check --threads "$LOAD_THREADS"
    --warmup "$WARMUP" --duration "$WINDOW" --windows "$WINDOWS" --json -q)
# Extra arguments for stage 4, for the blocks it keeps: the bearer token, the route name.
STAGE4_LOAD_ARGS=()

# Stage 4's JWT: an RS256 key and a token minted with openssl, and an admin API key for the
# admin calls this script makes (placement checks).
everything_on_key
ADMIN_KEY="$(openssl rand -hex 16)"
ADMIN_HASH="$(printf '%s' "$ADMIN_KEY" | sha256sum | cut -d' ' -f1)"

describe_machine src Cargo.toml Cargo.lock

INFER_BODY='{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[4,3,2,1]}]}'
check_infer() { # base url
    local code
    code="$(curl -s -o "$TMP/infer.out" -w '%{http_code}' -H 'content-type: application/json' -H "authorization: Bearer $TOKEN" \
        -d "$INFER_BODY" "$1/v2/models/add_sub/infer")"
    [[ "$code" == 200 ]] || { cat "$TMP/infer.out" >&2; die "infer through $1 answered $code"; }
}

# ---------------------------------------------------------------- infergate configs
# Optional features are blocks between "#>> name: what it does" and "#<<". A block is kept
# only when `infergate check` accepts it (its keys exist in this build); the results say
# which were kept and which were not available.
drop_blocks() { # names-to-drop... < config > config
    awk -v drop=" $* " '
        /^#>> / { name = $2; sub(":", "", name); inblock = 1; skip = index(drop, " " name " ") > 0; next }
        /^#<</  { inblock = 0; skip = 0; next }
        !skip   { print }'
}
block_names() { grep -o '^#>> [a-z0-9_-]*' | cut -c5-; }
block_title() { grep "^#>> $1:" | cut -d: -f2- | sed 's/^ *//'; }

KEPT_FEATURES=()   # set by render_config: "name (title)"
MISSING_FEATURES=()
render_config() { # template-file out-file
    local all names name others
    all="$(cat "$1")"
    read -r -a names <<<"$(block_names <<<"$all" | tr '\n' ' ')"
    KEPT_FEATURES=() MISSING_FEATURES=()
    local keep=()
    for name in "${names[@]}"; do
        others=()
        for o in "${names[@]}"; do [[ "$o" == "$name" ]] || others+=("$o"); done
        drop_blocks "${others[@]}" <<<"$all" >"$2"
        if "$BIN/infergate" check --config "$2" >"$TMP/check.out" 2>&1; then
            keep+=("$name")
            KEPT_FEATURES+=("$name ($(block_title "$name" <<<"$all"))")
        else
            MISSING_FEATURES+=("$name ($(grep -m1 . "$TMP/check.out" | sed "s#$2: ##"))")
        fi
    done
    local drop=()
    for name in "${names[@]}"; do [[ " ${keep[*]} " == *" $name "* ]] || drop+=("$name"); done
    drop_blocks "${drop[@]}" <<<"$all" >"$2"
    "$BIN/infergate" check --config "$2" >"$TMP/check.out" 2>&1 ||
        { cat "$TMP/check.out" >&2; die "rendered config $2 is invalid"; }
}

# Stage 3: infergate with validation and auth off.
stage3_config() { # http_port backend_port
    cat <<EOF
$(listen_table "$1" http metrics admin)

[[backends]]
name = "backend"
http = "http://127.0.0.1:$2"
capacity = "16GiB"

#>> validation-off: request validation explicitly disabled
[validation]
enabled = false
#<<
EOF
}

# Stage 4: infergate with everything on (`everything_on_tables` in lib.sh, shared with ab.sh,
# grows with the gateway); the arguments its blocks need from the load (the JWT, the route
# name) are set in run_pass.
# The canary route splits between two targets that are both add_sub (latest, and version 1)
# so the fake backend answers both and the load is the same as the other stages'.
stage4_config() { # http_port backend_port
    cat <<EOF
$(listen_table "$1" http metrics admin)

[[backends]]
name = "backend"
http = "http://127.0.0.1:$2"
capacity = "16GiB"

EOF
    everything_on_tables
}

# ---------------------------------------------------------------- measuring
# measure PASS STAGE URL C PROXY_PIDS... — one step; stage 4 gets its own load arguments.
measure() {
    local pass="$1" stage="$2" url="$3" c="$4"; shift 4
    STEP_ARGS=()
    [[ "$stage" == ig-on ]] && STEP_ARGS=("${STAGE4_LOAD_ARGS[@]}")
    load_step "$TMP/$pass-$stage-c$c.json" "$pass $stage c=$c" "$url" "$c" "$BACKEND_PID" "$@"
}

# profile PASS URL C PID — one more stage-4 step, not measured, with `perf record` on the
# gateway: its flamegraph goes next to the results file, its top frames into the report.
PROFILED=()
profile() {
    local out="$TMP/$1-profile-c$3" svg="${OUT%.md}-flame-c$3.svg" perf_pid
    say "$1 ig-on c=$3: profiling (perf record, call graphs from DWARF)"
    perf record -F 499 --call-graph dwarf,32768 -p "$4" -o "$out.data" >"$out.perf.log" 2>&1 &
    perf_pid=$!
    sleep 0.5
    "$BIN/infergate-load" --url "$2" "${LOAD_ARGS[@]}" "${STAGE4_LOAD_ARGS[@]}" -c "$3" >"$out.json" 2>"$out.err" ||
        { cat "$out.err" >&2; die "infergate-load failed while profiling"; }
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    perf script -i "$out.data" 2>/dev/null | inferno-collapse-perf >"$out.folded"
    cp "$out.folded" "${svg%.svg}.folded" # for inferno-diff-folded against another run (not committed)
    inferno-flamegraph --title "infergate, everything on, c=$3 ($SHA)" <"$out.folded" >"$svg"
    python3 loadtest/profile_top.py "$out.folded" 15 >"$TMP/profile-c$3.md"
    PROFILED+=("$3")
}

STAGES=(direct nginx ig-off ig-on)
declare -A HWM # pass-stage -> peak RSS in KiB (nginx: master + workers)

# run_pass PASS BACKEND_PORT LEVELS... — starts the three proxies in front of the backend on
# BACKEND_PORT, measures every stage at every level, records peak RSS, stops the proxies.
run_pass() {
    local pass="$1" bport="$2" off; shift 2
    off=$((bport + 10))
    start_nginx "$pass-nginx" "$off" "$bport" proxy.conf.template
    stage3_config $((off + 10)) "$bport" >"$TMP/$pass-stage3.tpl"
    render_config "$TMP/$pass-stage3.tpl" "$TMP/$pass-ig-off.toml"
    STAGE3_FEATURES=("${KEPT_FEATURES[@]}")
    stage4_config $((off + 20)) "$bport" >"$TMP/$pass-stage4.tpl"
    render_config "$TMP/$pass-stage4.tpl" "$TMP/$pass-ig-on.toml"
    STAGE4_FEATURES=("${KEPT_FEATURES[@]}")
    STAGE4_MISSING=("${MISSING_FEATURES[@]}")
    STAGE4_LOAD_ARGS=()
    [[ " ${STAGE4_FEATURES[*]} " == *" jwt-auth ("* ]] && STAGE4_LOAD_ARGS+=(--bearer "$TOKEN")
    [[ " ${STAGE4_FEATURES[*]} " == *" canary-route ("* ]] && STAGE4_LOAD_ARGS+=(--route bench)
    start_infergate "$pass-ig-off" "$TMP/$pass-ig-off.toml"
    start_infergate "$pass-ig-on" "$TMP/$pass-ig-on.toml"
    declare -A url=([direct]="http://127.0.0.1:$bport" [nginx]="http://127.0.0.1:$off"
        [ig-off]="http://127.0.0.1:$((off + 10))" [ig-on]="http://127.0.0.1:$((off + 20))")
    wait_http "${url[nginx]}/v2/health/ready" || die "nginx did not start: $(cat "$TMP/nginx-$pass-nginx/error.log")"
    wait_http "${url[ig-off]}/v2/health/ready" || die "infergate did not start: $(tail "$TMP/$pass-ig-off.log")"
    wait_http "${url[ig-on]}/v2/health/ready" || die "infergate did not start: $(tail "$TMP/$pass-ig-on.log")"
    load_through "$pass-ig-off" "${url[ig-off]}" add_sub
    wait_http "${url[direct]}/v2/models/add_sub/ready" 60 || die "add_sub never became ready on the backend"
    wait_placement "$pass-ig-off" $((off + 13)) add_sub
    wait_placement "$pass-ig-on" $((off + 23)) add_sub
    local stage c
    for stage in "${STAGES[@]}"; do check_infer "${url[$stage]}"; done
    PLACEMENT[$pass]="$(curl -s -H "x-api-key: $ADMIN_KEY" "127.0.0.1:$((off + 23))/admin/placement" |
        jq -c '[.backends[] | {name, models: [.models[] | {name, state, size_source}]}]')"
    local -A pids=([direct]="" [nginx]="${PID[$pass-nginx]} $(children "${PID[$pass-nginx]}")"
        [ig-off]="${PID[$pass-ig-off]}" [ig-on]="${PID[$pass-ig-on]}")
    for c in "$@"; do
        for stage in "${STAGES[@]}"; do
            # shellcheck disable=SC2086
            measure "$pass" "$stage" "${url[$stage]}" "$c" ${pids[$stage]}
        done
    done
    if [[ "$pass" == fake ]]; then
        for c in "${PROFILE_LEVELS[@]}"; do profile "$pass" "${url[ig-on]}" "$c" "${PID[$pass-ig-on]}"; done
    fi
    for stage in nginx ig-off ig-on; do
        # shellcheck disable=SC2086
        HWM[$pass-$stage]="$(hwm_kib ${pids[$stage]})"
    done
    # shellcheck disable=SC2086
    stop_pids ${pids[nginx]%% *} "${PID[$pass-ig-off]}" "${PID[$pass-ig-on]}"
}
declare -A PLACEMENT

# ---------------------------------------------------------------- pass 1: fake-triton
say "pass 1: fake-triton backend (temp dir $TMP)"
"$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads "$BACKEND_THREADS" >"$TMP/fake.log" 2>&1 &
PIDS+=("$!")
BACKEND_PID=$!
wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"
run_pass fake "$BASE" "${LEVELS[@]}"
HWM[fake-direct]="$(hwm_kib "$BACKEND_PID")"
stop_pids "$BACKEND_PID"

# ---------------------------------------------------------------- pass 2: real Triton
if ((REAL)); then
    say "pass 2: real Triton (scripts/triton.sh start 1 $((BASE + 100)), started empty)"
    TRITON_STARTED=1
    # Started empty: the validation-off gateway loads add_sub on its first request
    # (run_pass's load_through), and the direct baseline then uses that copy.
    scripts/triton.sh start 1 $((BASE + 100)) >"$TMP/triton-start.log" 2>&1 ||
        { cat "$TMP/triton-start.log" >&2; die "Triton did not start"; }
    BACKEND_PID="$(cat "target/triton-logs/triton-$((BASE + 100)).pid")"
    wait_http "http://127.0.0.1:$((BASE + 100))/v2/health/ready" 60 || die "Triton never became ready"
    TRITON_VERSION="$(curl -s "127.0.0.1:$((BASE + 100))/v2" | jq -r .version)"
    run_pass real $((BASE + 100)) "${REAL_LEVELS[@]}"
    scripts/triton.sh stop 1 $((BASE + 100)) >/dev/null 2>&1 || true
    TRITON_STARTED=0
fi
LOAD_AFTER="$(loadavg)"
ELAPSED=$((SECONDS - STARTED))

# ---------------------------------------------------------------- report
f() { jq -r ".steps[0]$2" "$TMP/$1.json"; } # f pass-stage-cC field
cpu_of() { cut -d' ' -f"$2" "$TMP/$1.json.cpu"; }
label() {
    case "$1" in
        direct) echo "direct" ;;
        nginx) echo "nginx" ;;
        ig-off) echo "infergate, validation off" ;;
        ig-on) echo "infergate, everything on" ;;
    esac
}

main_table() { # pass levels...
    local pass="$1" c s k d thr p50 p99 dp50 dp99; shift
    echo "| stage | c | infer/s | p50 µs | p99 µs | added p50 µs | added p99 µs | proxy CPU µs/req | backend CPU µs/req | errors | window spread | load avg |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for c in "$@"; do
        d="$pass-direct-c$c"
        for s in "${STAGES[@]}"; do
            k="$pass-$s-c$c"
            thr="$(f "$k" .throughput_rps)"; p50="$(f "$k" .latency_us.p50)"; p99="$(f "$k" .latency_us.p99)"
            if [[ "$s" == direct ]]; then dp50="—"; dp99="—"; else
                dp50=$((p50 - $(f "$d" .latency_us.p50))); dp99=$((p99 - $(f "$d" .latency_us.p99)))
            fi
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | ±%s%% | %s |\n' "$(label "$s")" "$c" \
                "$(calc %.0f "$thr")" "$p50" "$p99" "$dp50" "$dp99" "$(cpu_of "$k" 1)" "$(cpu_of "$k" 2)" \
                "$(f "$k" .errors)" "$(calc %.1f "$(f "$k" .window_spread_pct)")" "$(cat "$TMP/$k.json.load")"
        done
    done
}

ratio_table() { # pass levels...
    local pass="$1" c s k n d; shift
    echo "| stage | c | throughput × nginx | throughput × direct | added p50 × nginx | added p99 × nginx | proxy CPU/req × nginx |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for s in ig-off ig-on; do
        for c in "$@"; do
            k="$pass-$s-c$c"; n="$pass-nginx-c$c"; d="$pass-direct-c$c"
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$(label "$s")" "$c" \
                "$(ratio "$(f "$k" .throughput_rps)" "$(f "$n" .throughput_rps)")" \
                "$(ratio "$(f "$k" .throughput_rps)" "$(f "$d" .throughput_rps)")" \
                "$(ratio $(($(f "$k" .latency_us.p50) - $(f "$d" .latency_us.p50))) $(($(f "$n" .latency_us.p50) - $(f "$d" .latency_us.p50))))" \
                "$(ratio $(($(f "$k" .latency_us.p99) - $(f "$d" .latency_us.p99))) $(($(f "$n" .latency_us.p99) - $(f "$d" .latency_us.p99))))" \
                "$(ratio "$(cpu_of "$k" 1)" "$(cpu_of "$n" 1)")"
        done
    done
}

if ((${#STAGE4_FEATURES[@]})); then
    STAGE4_LABEL="$(join_list "${STAGE4_FEATURES[@]}")"
else
    STAGE4_LABEL="nothing beyond stage 3 in this build, so stage 4 repeats stage 3's configuration (the difference between the two rows is run-to-run noise)"
fi
WORKERS_LABEL="$WORKERS"
[[ "$WORKERS" == auto ]] && WORKERS_LABEL="one per core ($NPROC)"

report() {
    echo "# infergate benchmark: $DATE, commit $SHA"
    echo
    echo "Produced by \`loadtest/bench.sh\` in ${ELAPSED} s (${BUILD_S} s of it building)."
    echo
    echo "## Machine and setup"
    echo
    echo "- Machine: $NPROC × $CPU_MODEL, $MEM memory, $KERNEL."
    echo "- Load average (1, 5, 15 min): $LOAD_BEFORE before, $LOAD_AFTER after. The machine is shared: the per-step load average is in the tables, and CPU per request (from /proc/PID/stat, warm-up included, requests estimated from the measured rate) is less sensitive to other work than throughput."
    echo "- infergate: commit $SHA$( ((DIRTY)) && echo " plus $DIRTY uncommitted changed paths under src/, Cargo.toml, Cargo.lock at run time (others were editing)"), release profile. nginx: $("$NGINX" -v 2>&1 | cut -d/ -f2) (Debian package), config \`loadtest/nginx/proxy.conf.template\`.$( ((REAL)) && echo " Triton: $TRITON_VERSION (nvidia-pytriton wheel, CPU, python backend).")"
    echo "- Load: \`infergate-load\` closed loop, \`add_sub\` JSON bodies (INPUT0, INPUT1: FP32 [4]), \`--check\` on every response, warm-up $WARMUP then $WINDOWS × $WINDOW windows per step, $LOAD_THREADS load-generator thread(s); the stages take turns at each concurrency level."
    echo "- Proxies: $WORKERS_LABEL worker(s) each (nginx \`worker_processes\`, infergate \`server.workers\`). fake-triton: $BACKEND_THREADS thread(s). Access logs: $ACCESS_LOG for both (a line per request to a file)."
    echo "- Stage 3 (infergate, validation and auth off)$( ((${#STAGE3_FEATURES[@]})) && echo "; $(join_list "${STAGE3_FEATURES[@]}")")."
    echo "- Stage 4 (infergate, everything on) includes: $STAGE4_LABEL."
    ((${#STAGE4_MISSING[@]})) && echo "- Not available in this build (refused by \`infergate check\`, so left out of stage 4): $(join_list "${STAGE4_MISSING[@]}")."
    echo "- JWT auth alone, RS256 and HS256 with and without the token cache: \`loadtest/auth_bench.sh\`."
    echo "- Placement (stage 4, /admin/placement after warm-up): pass 1 \`${PLACEMENT[fake]}\`$( ((REAL)) && echo ", pass 2 \`${PLACEMENT[real]}\`")."
    echo
    echo "## Pass 1: proxy overhead (fake-triton backend)"
    echo
    echo "Added latency is the stage's percentile minus direct's at the same concurrency."
    echo
    main_table fake "${LEVELS[@]}"
    echo
    echo "### infergate as a ratio of nginx and of direct"
    echo
    ratio_table fake "${LEVELS[@]}"
    echo
    echo "### Peak RSS (VmHWM)"
    echo
    echo "| process | pass 1 (fake-triton) |$( ((REAL)) && echo " pass 2 (Triton) |") × nginx (pass 1) |"
    echo "|---|---:|$( ((REAL)) && echo "---:|")---:|"
    local s
    for s in nginx ig-off ig-on; do
        echo "| $(label "$s")$([[ $s == nginx ]] && echo " (master + workers)") | $(calc %.1f "${HWM[fake-$s]} / 1024") MiB |$( ((REAL)) && echo " $(calc %.1f "${HWM[real-$s]} / 1024") MiB |") $(ratio "${HWM[fake-$s]}" "${HWM[fake-nginx]}") |"
    done
    echo "| fake-triton (backend, for scale) | $(calc %.1f "${HWM[fake-direct]} / 1024") MiB |$( ((REAL)) && echo " |") |"
    if ((REAL)); then
        echo
        echo "## Pass 2: end to end (real Triton, python add_sub)"
        echo
        main_table real "${REAL_LEVELS[@]}"
        echo
        ratio_table real "${REAL_LEVELS[@]}"
        echo
        echo "### Gateway added latency vs direct to Triton (issue 2)"
        echo
        echo "| c | direct p50 / p99 µs | infergate, validation off: p50 / p99 µs | added p50 / p99 µs | infergate, everything on: added p50 / p99 µs |"
        echo "|---:|---:|---:|---:|---:|"
        local c d o n
        for c in "${REAL_LEVELS[@]}"; do
            d="real-direct-c$c"; o="real-ig-off-c$c"; n="real-ig-on-c$c"
            echo "| $c | $(f "$d" .latency_us.p50) / $(f "$d" .latency_us.p99) | $(f "$o" .latency_us.p50) / $(f "$o" .latency_us.p99) | $(($(f "$o" .latency_us.p50) - $(f "$d" .latency_us.p50))) / $(($(f "$o" .latency_us.p99) - $(f "$d" .latency_us.p99))) | $(($(f "$n" .latency_us.p50) - $(f "$d" .latency_us.p50))) / $(($(f "$n" .latency_us.p99) - $(f "$d" .latency_us.p99))) |"
        done
    fi
    echo
    echo "## Issue 8 targets (pass 1)"
    echo
    local c worst_on=99 worst_off=99 r
    for c in "${LEVELS[@]}"; do
        r="$(ratio "$(f "fake-ig-on-c$c" .throughput_rps)" "$(f "fake-nginx-c$c" .throughput_rps)")"
        worst_on="$(awk -v a="$worst_on" -v b="$r" 'BEGIN { print (b < a ? b : a) }')"
        r="$(ratio "$(f "fake-ig-off-c$c" .throughput_rps)" "$(f "fake-nginx-c$c" .throughput_rps)")"
        worst_off="$(awk -v a="$worst_off" -v b="$r" 'BEGIN { print (b < a ? b : a) }')"
    done
    met() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN { ok = (op == ">=" ? v >= t : v < t); print (ok ? "met" : "**not met**") }'; }
    echo "- Everything on, throughput ≥ 0.9 × nginx at every concurrency: lowest ratio $worst_on — $(met "$worst_on" 0.9 ">=")."
    if [[ " ${LEVELS[*]} " == *" 16 "* ]]; then
        local added=$(($(f fake-ig-on-c16 .latency_us.p99) - $(f fake-direct-c16 .latency_us.p99)))
        echo "- Everything on, p99 added latency < 1 ms at c=16: $added µs — $(met "$added" 1000 "<")."
    fi
    echo "- Validation and auth off, throughput ≥ nginx at every concurrency: lowest ratio $worst_off — $(met "$worst_off" 1.0 ">=")."
    echo
    echo "## Issue 17 targets (everything on)"
    echo
    for c in 16 64; do
        [[ " ${LEVELS[*]} " == *" $c "* ]] || continue
        r="$(ratio "$(f "fake-ig-on-c$c" .throughput_rps)" "$(f "fake-nginx-c$c" .throughput_rps)")"
        echo "- c=$c, throughput ≥ 1.0 × nginx: $r — $(met "$r" 1.0 ">=")."
        r="$(ratio "$(cpu_of "fake-ig-on-c$c" 1)" "$(cpu_of "fake-nginx-c$c" 1)")"
        echo "- c=$c, CPU per request ≤ 1.5 × nginx's: $r — $(met "$r" 1.5 "<") (stretch ≤ 1.0)."
    done
    if ((REAL)) && [[ " ${REAL_LEVELS[*]} " == *" 16 "* ]]; then
        r="$(ratio "$(f real-ig-on-c16 .throughput_rps)" "$(f real-direct-c16 .throughput_rps)")"
        echo "- Real Triton, c=16, throughput ≥ 0.95 × direct: $r — $(met "$r" 0.95 ">=")."
        r="$(ratio "$(f real-ig-on-c16 .latency_us.p99)" "$(f real-direct-c16 .latency_us.p99)")"
        echo "- Real Triton, c=16, p99 ≤ 1.2 × direct's: $r — $(awk -v v="$r" 'BEGIN { print (v <= 1.2 ? "met" : "**not met**") }')."
    fi
    if ((REAL)) && [[ " ${REAL_LEVELS[*]} " == *" 1 "* ]]; then
        local added1=$(($(f real-ig-on-c1 .latency_us.p50) - $(f real-direct-c1 .latency_us.p50)))
        echo "- Real Triton, c=1, added p50 < 100 µs: $added1 µs — $(met "$added1" 100 "<")."
    fi
    if ((${#PROFILED[@]})); then
        echo
        echo "## Profile: infergate, everything on (pass 1)"
        echo
        echo "\`perf record -F 499 --call-graph dwarf,32768\` on the gateway during one more, unmeasured step; shares of all its samples (every thread of the process), weighted by perf's sample periods."
        for c in "${PROFILED[@]}"; do
            echo
            echo "### c=$c (flamegraph: \`$(basename "${OUT%.md}")-flame-c$c.svg\`)"
            echo
            cat "$TMP/profile-c$c.md"
        done
    fi
}

# chart_rows PASS LEVELS... — "pass stage c infer/s p99" rows for loadtest/chart.py.
chart_rows() {
    local pass="$1" c s; shift
    for c in "$@"; do
        for s in "${STAGES[@]}"; do
            printf '%s\t%s\t%s\t%s\t%s\n' "$pass" "$s" "$c" "$(f "$pass-$s-c$c" .throughput_rps)" "$(f "$pass-$s-c$c" .latency_us.p99)"
        done
    done
}

mkdir -p "$(dirname "$OUT")"
{ chart_rows fake "${LEVELS[@]}"; if ((REAL)); then chart_rows real "${REAL_LEVELS[@]}"; fi; } >"$TMP/chart.tsv"
python3 loadtest/chart.py "$TMP/chart.tsv" "${OUT%.md}.svg" "infergate benchmark, $DATE, commit $SHA ($WORKERS_LABEL proxy workers)"
# Only a run recorded in loadtest/results/ becomes the chart docs/performance.md shows.
if [[ "$(realpath "$(dirname "$OUT")")" == "$ROOT/loadtest/results" ]]; then cp "${OUT%.md}.svg" loadtest/results/latest.svg; fi
report >"$OUT"
cat "$OUT"
say "wrote $OUT and its chart ${OUT%.md}.svg"
