#!/usr/bin/env bash
# loadtest/validation.sh — what request validation costs, by body size (issue 4, "Speed").
#
# One run, one machine, one backend serving a model whose signature takes any length
# (INPUT0 FP32 [-1]): fake-triton --dynamic-model, which reads each body and answers a fixed
# response, so validation is measured against a backend that costs nearly nothing; or with
# VBENCH_BACKEND=triton, real Triton with loadtest/models/dynamic (python, parses the body
# too), the end-to-end figure a user sees. Two infergate processes in front of it that
# differ only in `[validation] enabled`. infergate-load sends `--body-size` bodies of 1 KiB,
# 1 MiB and 16 MiB, JSON and binary, at a fixed concurrency per size. For each size and
# encoding the two gateways take turns (on, off, then off, on, ...), so a change in machine
# load hits both alike, and the figure reported is the ratio of their throughputs.
#
# Reported per case: throughput on/off and its ratio (per round and overall), the gateway's
# CPU per request (from /proc/PID/stat), and its peak RSS during the run (VmHWM, reset
# through /proc/PID/clear_refs before each run). The memory target is the validating
# gateway's peak RSS under 16 MiB binary bodies at concurrency 16 against the bytes in
# flight (16 × the body size).
#
# Writes loadtest/results/<date>-<short sha>-validation.md and prints it. Installs nothing
# (needs curl and jq, like bench.sh). Stays on loopback; stops only what it started.
#
# Knobs (environment):
#   VBENCH_BACKEND=fake      fake | triton (then about 1 MiB bodies at most are sensible:
#                            VBENCH_SIZES="1KiB 1MiB" VBENCH_CONCURRENCY="4 4")
#   VBENCH_BASE_PORT=29600   ports used: base..base+2 (backend), base+10..13 (on), base+20..23 (off)
#   VBENCH_WARMUP=1s VBENCH_WINDOW=2s VBENCH_WINDOWS=2   per measurement (infergate-load flags)
#   VBENCH_ROUNDS=2          turns per case; each round measures on and off once
#   VBENCH_SIZES="1KiB 1MiB 16MiB"   body sizes (infergate-load --body-size)
#   VBENCH_CONCURRENCY="4 4 16"      concurrency for each size, in the same order
#   VBENCH_ENCODINGS="json binary"   a gateway's RSS stays up after large JSON bodies (the
#                            allocator keeps the pages), so the memory figure for binary bodies
#                            is its own only with VBENCH_ENCODINGS=binary
#   VBENCH_PROXY_WORKERS=1   infergate's server.workers; "auto"
#                            = one per core
#   VBENCH_LOAD_THREADS=1 VBENCH_BACKEND_THREADS=1   load generator / fake-triton threads
#   VBENCH_BUILD=1           0 skips `cargo build --release`
#   VBENCH_OUT=path.md       results file (default loadtest/results/<date>-<sha>-validation.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${VBENCH_BASE_PORT:-29600}"
WARMUP="${VBENCH_WARMUP:-1s}"
WINDOW="${VBENCH_WINDOW:-2s}"
WINDOWS="${VBENCH_WINDOWS:-2}"
ROUNDS="${VBENCH_ROUNDS:-2}"
read -r -a SIZES <<<"${VBENCH_SIZES:-1KiB 1MiB 16MiB}"
read -r -a CONC <<<"${VBENCH_CONCURRENCY:-4 4 16}"
WORKERS="${VBENCH_PROXY_WORKERS:-1}"
LOAD_THREADS="${VBENCH_LOAD_THREADS:-1}"
BACKEND_THREADS="${VBENCH_BACKEND_THREADS:-1}"
BUILD="${VBENCH_BUILD:-1}"
BACKEND="${VBENCH_BACKEND:-fake}"
SUFFIX=""
[[ "$BACKEND" == triton ]] && SUFFIX=-triton
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${VBENCH_OUT:-loadtest/results/$DATE-$SHA-validation$SUFFIX.md}"
BIN="$ROOT/target/release"
MODEL=dynamic
read -r -a ENCODINGS <<<"${VBENCH_ENCODINGS:-json binary}"
STARTED=$SECONDS

ACCESS_LOG=off # the gateways log at warn level: no per-request line
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
TRITON_STARTED=0
on_exit() { if ((TRITON_STARTED)); then scripts/triton.sh stop 1 "$BASE" >/dev/null 2>&1 || true; fi; }

[[ "$BACKEND" == fake || "$BACKEND" == triton ]] || die "VBENCH_BACKEND is fake or triton"
((${#SIZES[@]} == ${#CONC[@]})) || die "VBENCH_SIZES and VBENCH_CONCURRENCY need one entry each per size"

require curl jq
check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) $((BASE + 12)) $((BASE + 13)) $((BASE + 20)) $((BASE + 22)) $((BASE + 23))
build_release infergate infergate-load fake-triton
describe_machine src Cargo.toml Cargo.lock

# ---------------------------------------------------------------- start
gateway_config() { # http_port enabled
    cat <<EOF
$(listen_table "$1" http metrics admin)

# A health check waits behind the benchmark's requests on a loaded machine: past the 1 s
# default the backend is taken out and requests fail fast with 503, which would count as
# lost throughput for whichever gateway it hit.
[upstream]
health_timeout = "5s"

[[backends]]
name = "backend"
http = "http://127.0.0.1:$BASE"
capacity = "16GiB"

[validation]
enabled = $2
EOF
}

declare -A URL ADMIN
start_gateway() { # name http_port enabled
    gateway_config "$2" "$3" >"$TMP/$1.toml"
    start_infergate "$1" "$TMP/$1.toml"
    URL[$1]="http://127.0.0.1:$2"
    ADMIN[$1]=$(($2 + 3))
}

if [[ "$BACKEND" == fake ]]; then
    say "starting fake-triton --dynamic-model $MODEL and two gateways (temp dir $TMP)"
    "$BIN/fake-triton" --listen "127.0.0.1:$BASE" --dynamic-model "$MODEL" --threads "$BACKEND_THREADS" >"$TMP/fake.log" 2>&1 &
    PIDS+=("$!")
    BACKEND_PID=$!
    wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start: $(cat "$TMP/fake.log")"
    BACKEND_LABEL="\`fake-triton --dynamic-model $MODEL\` ($BACKEND_THREADS thread(s)): INPUT0 FP32 [-1] → OUTPUT0 FP32 [-1], \`max_batch_size\` 0; it reads every body to the end and answers a fixed small response"
else
    say "starting Triton with loadtest/models/$MODEL and two gateways (temp dir $TMP)"
    TRITON_STARTED=1
    # Started empty: the first gateway loads the model on its first request (load_through).
    TRITON_MODEL_REPOSITORY="$ROOT/loadtest/models" scripts/triton.sh start 1 "$BASE" >"$TMP/triton-start.log" 2>&1 ||
        { cat "$TMP/triton-start.log" >&2; die "Triton did not start"; }
    BACKEND_PID="$(cat "target/triton-logs/triton-$BASE.pid")"
    wait_http "http://127.0.0.1:$BASE/v2/health/ready" 60 || die "Triton never became ready"
    BACKEND_LABEL="Triton $(curl -s "127.0.0.1:$BASE/v2" | jq -r .version) (CPU), python model \`loadtest/models/$MODEL\`: INPUT0 FP32 [-1] → OUTPUT0 FP32 [1] (the sum); Triton parses every body itself. Backend CPU counts tritonserver only, not its python stub"
fi
start_gateway on $((BASE + 10)) true
start_gateway off $((BASE + 20)) false
GATEWAYS=(on off)

for g in "${GATEWAYS[@]}"; do
    wait_http "${URL[$g]}/v2/health/ready" || die "infergate ($g) did not start: $(tail "$TMP/$g.log")"
done
load_through on "${URL[on]}" "$MODEL"
wait_http "http://127.0.0.1:$BASE/v2/models/$MODEL/ready" 60 || die "$MODEL never became ready on the backend"
for g in "${GATEWAYS[@]}"; do wait_placement "$g" "${ADMIN[$g]}" "$MODEL"; done

# Validation must really run on one gateway and not on the other, or the ratio means nothing
# (a signature that cannot be fetched makes the gateway forward unvalidated): a request of the
# wrong datatype is refused by "on" itself and forwarded by "off", as each one's
# infergate_validation_rejections_total tells (the fake answers it 200, Triton 400).
BAD='{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[2],"data":[1,2]}]}'
GOOD='{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,2]}]}'
post() { curl -s -o "$TMP/post.out" -w '%{http_code}' -H 'content-type: application/json' -d "$2" "$1/v2/models/$MODEL/infer"; }
[[ "$(post "${URL[on]}" "$GOOD")" == 200 ]] || die "a valid request through 'on' failed: $(cat "$TMP/post.out")"
[[ "$(post "${URL[on]}" "$BAD")" == 400 ]] || die "'on' did not refuse a wrong datatype: $(cat "$TMP/post.out")"
REFUSAL="$(jq -r .error "$TMP/post.out")"
post "${URL[off]}" "$BAD" >/dev/null
rejections() { curl -s "127.0.0.1:$((ADMIN[$1] - 1))/metrics" | awk '/^infergate_validation_rejections_total/ { n += $NF } END { print n + 0 }'; }
[[ "$(rejections on)" == 1 ]] || die "'on' did not count its refusal in infergate_validation_rejections_total"
[[ "$(rejections off)" == 0 ]] || die "'off' refused a request itself: validation is not off"

# ---------------------------------------------------------------- measuring
rss_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
# Writing 5 to clear_refs resets VmHWM to the current RSS (Linux 4.0+), so each run's peak
# is its own. Without it the peak is since start, and the report says so.
HWM_RESET=1
reset_hwm() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || HWM_RESET=0; }

LOAD_ARGS=(-m "$MODEL" --threads "$LOAD_THREADS" --warmup "$WARMUP" --duration "$WINDOW" --windows "$WINDOWS" --json -q)
IDLE_RSS_ON="$(rss_kib "${PID[on]}" VmRSS)"
IDLE_RSS_OFF="$(rss_kib "${PID[off]}" VmRSS)"

# measure CASE GATEWAY ROUND SIZE ENCODING C — one infergate-load run; JSON plus
# "cpu_us_per_req gateway_hwm_kib backend_cpu_us_per_req load1" in $out.extra.
measure() {
    local case="$1" g="$2" round="$3" size="$4" enc="$5" c="$6"
    local out="$TMP/$case-$g-r$round.json" extra=() pid="${PID[$2]}" load1 t0 t1 b0 b1
    [[ "$enc" == binary ]] && extra=(--binary)
    load1="$(cut -d' ' -f1 /proc/loadavg)"
    reset_hwm "$pid"
    t0="$(ticks "$pid")"; b0="$(ticks "$BACKEND_PID")"
    "$BIN/infergate-load" --url "${URL[$g]}" "${LOAD_ARGS[@]}" --body-size "$size" "${extra[@]}" -c "$c" >"$out" 2>"$out.err" ||
        { cat "$out.err" >&2; die "infergate-load failed for $case $g"; }
    t1="$(ticks "$pid")"; b1="$(ticks "$BACKEND_PID")"
    # Requests served during the whole invocation (warm-up included, as the CPU ticks are),
    # estimated from the measured rate.
    local n
    n="$(jq '.steps[0].throughput_rps * (.config.warmup_s + .steps[0].measured_s)' "$out")"
    awk -v p=$((t1 - t0)) -v b=$((b1 - b0)) -v hz="$HZ" -v n="$n" -v hwm="$(rss_kib "$pid" VmHWM)" -v l="$load1" \
        'BEGIN { printf "%.1f %s %.1f %s\n", p / hz / n * 1e6, hwm, b / hz / n * 1e6, l }' >"$out.extra"
    say "$case $g round $round: $(jq -r '.steps[0] | "\(.throughput_rps | floor) infer/s, p50 \(.latency_us.p50) us, errors \(.errors)"' "$out"), $(cut -d' ' -f1 "$out.extra") us CPU/req, peak RSS $(($(cut -d' ' -f2 "$out.extra") / 1024)) MiB"
}

# A run with errors measured something else (a failed request is fast and not counted):
# it is repeated once, and the report lists it.
REPEATED=()
measure_clean() {
    measure "$@"
    local out="$TMP/$1-$2-r$3.json"
    if [[ "$(jq '.steps[0].errors' "$out")" != 0 ]]; then
        local kinds
        kinds="$(jq -c '.steps[0].errors_by_kind' "$out")"
        say "  errors $kinds: repeating the run"
        REPEATED+=("$1 $2 round $3: $kinds")
        measure "$@"
    fi
}

CASES=()
declare -A CASE_SIZE CASE_ENC CASE_C
for i in "${!SIZES[@]}"; do
    for enc in "${ENCODINGS[@]}"; do
        k="${SIZES[$i]}-$enc"
        CASES+=("$k")
        CASE_SIZE[$k]="${SIZES[$i]}" CASE_ENC[$k]="$enc" CASE_C[$k]="${CONC[$i]}"
    done
done

say "measuring ${#CASES[@]} cases × $ROUNDS rounds × on/off (warm-up $WARMUP, $WINDOWS × $WINDOW)"
for k in "${CASES[@]}"; do
    for ((r = 1; r <= ROUNDS; r++)); do
        # Odd rounds on first, even rounds off first: on, off, off, on, ...
        order=(on off)
        ((r % 2)) || order=(off on)
        for g in "${order[@]}"; do
            measure_clean "$k" "$g" "$r" "${CASE_SIZE[$k]}" "${CASE_ENC[$k]}" "${CASE_C[$k]}"
        done
    done
done
LOAD_AFTER="$(loadavg)"
ELAPSED=$((SECONDS - STARTED))

# ---------------------------------------------------------------- report
f() { jq -r ".steps[0]$2" "$TMP/$1.json"; }               # f case-g-rR field
x() { cut -d' ' -f"$2" "$TMP/$1.json.extra"; }           # x case-g-rR column
sum_over_rounds() { # case g fn field -> mean over rounds
    local k="$1" g="$2" how="$3" what="$4" r vals=()
    for ((r = 1; r <= ROUNDS; r++)); do vals+=("$("$how" "$k-$g-r$r" "$what")"); done
    printf '%s\n' "${vals[@]}" | awk '{ s += $1; n++ } END { printf "%.4f", s / n }'
}
max_over_rounds() { # case g column -> max over rounds
    local k="$1" g="$2" r m=0 v
    for ((r = 1; r <= ROUNDS; r++)); do v="$(x "$k-$g-r$r" "$3")"; ((v > m)) && m=$v; done
    echo "$m"
}
mib() { calc %.1f "$1 / 1024"; }

declare -A RATIO
results_table() {
    echo "| body | encoding | c | body bytes | on infer/s | off infer/s | on MB/s | **ratio on/off** | per round | gateway CPU µs/req on / off | peak RSS MiB on / off | errors on / off | load avg |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"
    local k on off bytes rounds r loads err_on err_off
    for k in "${CASES[@]}"; do
        on="$(sum_over_rounds "$k" on f .throughput_rps)"
        off="$(sum_over_rounds "$k" off f .throughput_rps)"
        RATIO[$k]="$(ratio "$on" "$off")"
        bytes="$(jq .config.body_bytes "$TMP/$k-on-r1.json")"
        rounds="" loads="" err_on=0 err_off=0
        for ((r = 1; r <= ROUNDS; r++)); do
            rounds+="${rounds:+, }$(ratio "$(f "$k-on-r$r" .throughput_rps)" "$(f "$k-off-r$r" .throughput_rps)")"
            loads+="${loads:+, }$(x "$k-on-r$r" 4)"
            err_on=$((err_on + $(f "$k-on-r$r" .errors))); err_off=$((err_off + $(f "$k-off-r$r" .errors)))
        done
        printf '| %s | %s | %s | %s | %s | %s | %s | **%s** | %s | %s / %s | %s / %s | %s / %s | %s |\n' \
            "${CASE_SIZE[$k]}" "${CASE_ENC[$k]}" "${CASE_C[$k]}" "$bytes" "$(calc %.0f "$on")" "$(calc %.0f "$off")" \
            "$(calc %.0f "$on * $bytes / 1e6")" "${RATIO[$k]}" "$rounds" \
            "$(calc %.0f "$(sum_over_rounds "$k" on x 1)")" "$(calc %.0f "$(sum_over_rounds "$k" off x 1)")" \
            "$(mib "$(max_over_rounds "$k" on 2)")" "$(mib "$(max_over_rounds "$k" off 2)")" "$err_on" "$err_off" "$loads"
    done
}

WORKERS_LABEL="$WORKERS"
[[ "$WORKERS" == auto ]] && WORKERS_LABEL="one per core ($NPROC)"
LAST=$((${#SIZES[@]} - 1))
MEM_CASE="${SIZES[$LAST]}-binary"

report() {
    echo "# infergate validation benchmark: $DATE, commit $SHA"
    echo
    echo "Produced by \`loadtest/validation.sh\` in ${ELAPSED} s (${BUILD_S} s of it building)."
    echo
    echo "## Machine and setup"
    echo
    echo "- Machine: $NPROC × $CPU_MODEL, $MEM memory, $KERNEL."
    echo "- Load average (1, 5, 15 min): $LOAD_BEFORE before, $LOAD_AFTER after (the machine is shared with other work; the 1-minute figure at each \"on\" run is in the table). Throughput is compared only within this run, on and off taking turns."
    echo "- infergate: commit $SHA$( ((DIRTY)) && echo " plus $DIRTY uncommitted changed paths under src/, Cargo.toml, Cargo.lock"), release profile, $WORKERS_LABEL worker(s) (\`server.workers\`), \`RUST_LOG=warn\`; two processes differing only in \`[validation] enabled\` (true: \"on\", false: \"off\")."
    echo "- Backend: $BACKEND_LABEL."
    echo "- Check before measuring: a request with the wrong datatype is refused by \"on\" (\`$REFUSAL\`) and forwarded by \"off\", so \"on\" really validates."
    echo "- Load: \`infergate-load --body-size SIZE [--binary]\` (one FP32 input \`[N]\`, the body just under SIZE; random values, so a JSON number takes ~11 bytes), closed loop, $LOAD_THREADS load-generator thread(s), warm-up $WARMUP then $WINDOWS × $WINDOW windows per run, $ROUNDS round(s) per case in the order on, off, off, on, ... Throughput is the mean over rounds; CPU per request comes from /proc/PID/stat (user + system, warm-up included, requests estimated from the measured rate)."
    echo "- Gateways use \`upstream.health_timeout = \"5s\"\` (default 1 s): on a loaded machine a health check waits behind the benchmark's requests, and a backend taken out answers 503s that would pass for lost throughput. Runs with errors were repeated once: $(join_list "${REPEATED[@]}")."
    echo "- Peak RSS: VmHWM of the gateway $( ((HWM_RESET)) && echo "reset (\`/proc/PID/clear_refs\`) before each run, so it is that run's peak (max over rounds)" || echo "since start (clear_refs was refused)"). At rest after start: on $(mib "$IDLE_RSS_ON") MiB, off $(mib "$IDLE_RSS_OFF") MiB."
    echo
    echo "## Throughput, validation on vs off"
    echo
    results_table
    echo
    echo "## Memory under ${SIZES[$LAST]} binary bodies at c=${CONC[$LAST]}"
    echo
    local bytes inflight hwm
    bytes="$(jq .config.body_bytes "$TMP/$MEM_CASE-on-r1.json")"
    inflight=$((bytes * CONC[LAST]))
    hwm="$(max_over_rounds "$MEM_CASE" on 2)"
    MEM_RATIO="$(ratio $((hwm * 1024)) "$inflight")"
    echo "| gateway | peak RSS | bytes in flight (${CONC[$LAST]} × $bytes) | peak ÷ in flight | (peak − at rest) ÷ in flight |"
    echo "|---|---:|---:|---:|---:|"
    echo "| on | $(mib "$hwm") MiB | $(calc %.1f "$inflight / 1048576") MiB | **$MEM_RATIO** | $(ratio $(((hwm - IDLE_RSS_ON) * 1024)) "$inflight") |"
    local hwm_off
    hwm_off="$(max_over_rounds "$MEM_CASE" off 2)"
    echo "| off (streams, for scale) | $(mib "$hwm_off") MiB | $(calc %.1f "$inflight / 1048576") MiB | $(ratio $((hwm_off * 1024)) "$inflight") | $(ratio $(((hwm_off - IDLE_RSS_OFF) * 1024)) "$inflight") |"
    echo
    echo "## Issue 4 targets"
    echo
    local k worst=99 worst_case=""
    for k in "${CASES[@]}"; do
        if awk -v a="${RATIO[$k]}" -v b="$worst" 'BEGIN { exit !(a < b) }'; then worst="${RATIO[$k]}" worst_case="$k"; fi
    done
    echo "- Throughput with validation ≥ 0.9 × without, every size and encoding: lowest ratio $worst ($worst_case) — $(met "$worst" 0.9 ">=")."
    echo "- Peak memory of the validating gateway under ${SIZES[$LAST]} binary bodies at c=${CONC[$LAST]} < 4 × bytes in flight: $MEM_RATIO × — $(met "$MEM_RATIO" 4 "<")."
}

mkdir -p "$(dirname "$OUT")"
report >"$OUT"
cat "$OUT"
say "wrote $OUT"
