# loadtest/lib.sh — the plumbing every benchmark script here shares, so each script holds
# only what it measures and how it reports it: messages, a temp dir and the processes
# started in it (stopped on exit, however the script ends), prerequisites, the release
# build, the machine's description, waiting for servers, starting nginx and infergate, CPU
# and peak memory from /proc, and the arithmetic of the reports.
#
# Source it from the repository root after setting the knobs it reads:
#   BIN (release binaries), BUILD (1: build first), WORKERS (proxy workers, or "auto"),
#   ACCESS_LOG (on: infergate logs every request at info level), STARTED (=$SECONDS).
# A script with more to stop than its PIDS (a Triton) defines `on_exit`.
# shellcheck shell=bash

LIB_NAME="$(basename "$0")"
die() { echo "$LIB_NAME: $*" >&2; exit 1; }
say() { echo "$LIB_NAME: $*" >&2; }

# ---------------------------------------------------------------- processes we own
TMP="$(mktemp -d "/tmp/infergate-${LIB_NAME%.sh}.XXXXXX")"
PIDS=()         # plain children, killed by pid on exit
declare -A PID  # name -> pid of what we started
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if declare -F on_exit >/dev/null; then on_exit; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_pids() { local p; for p in "$@"; do kill "$p" 2>/dev/null || true; done; for p in "$@"; do wait "$p" 2>/dev/null || true; done; }

# ---------------------------------------------------------------- prerequisites
require() { local tool; for tool in "$@"; do command -v "$tool" >/dev/null || die "$tool is required (apt-get install -y $tool)"; done; }

# ensure_debian TOOL:PACKAGE... — each TOOL on PATH, or its Debian PACKAGE installed when
# missing (root only; one `apt-get update` when the first install fails). The benchmarks'
# only install step: nothing here touches the test suite's setup (scripts/setup.sh).
ensure_debian() {
    local pair tool pkg need=()
    for pair in "$@"; do
        tool="${pair%%:*}" pkg="${pair#*:}"
        command -v "$tool" >/dev/null || need+=("$pkg")
    done
    ((${#need[@]})) || return 0
    apt_install "${need[@]}"
}

# apt_install PACKAGE... — Debian packages installed (root only; one `apt-get update` when
# the first try fails): ensure_debian's install, and a library's, which has no tool to look for.
apt_install() {
    [[ $(id -u) == 0 ]] || die "missing $*; run as root or: sudo apt-get install -y $*"
    say "installing $* (Debian packages)"
    # Debian starts a packaged service (nginx) on install unless policy-rc.d forbids it; we
    # never use that service, only a foreground nginx on our own config.
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >"$TMP/apt.log" 2>&1 ||
        { apt-get update >>"$TMP/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >>"$TMP/apt.log" 2>&1; } ||
        { tail -20 "$TMP/apt.log" >&2; die "apt-get install $* failed"; }
}

# nginx from Debian's package, installed when missing (root only); sets NGINX.
ensure_nginx() {
    ensure_debian nginx:nginx
    NGINX="$(command -v nginx)"
}

# valgrind (callgrind, callgrind_control, callgrind_annotate) from Debian's package, installed
# when missing (root only), for instructions.sh and compare.sh.
ensure_valgrind() { ensure_debian valgrind:valgrind callgrind_control:valgrind; }

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
check_ports() { local p; for p in "$@"; do if port_busy "$p"; then die "port $p is in use (set the base port knob)"; fi; done; }

# cargo_release WHAT CARGO_ARGS... — `cargo build --release CARGO_ARGS` with the environment
# the caller set (a target directory, RUSTFLAGS), its log's tail shown when it fails.
cargo_release() {
    local what="$1"
    shift
    cargo build --release "$@" 2>"$TMP/build.log" ||
        { tail -30 "$TMP/build.log" >&2; die "the $what build failed"; }
}

# build_release BINARIES... — builds infergate and infergate-load (when BUILD=1), then
# checks the binaries are there; sets BUILD_S.
build_release() {
    if ((BUILD)); then
        say "building (cargo build --release -p infergate -p infergate-load)"
        cargo_release "infergate and infergate-load" -p infergate -p infergate-load
    fi
    BUILD_S=$((SECONDS - STARTED))
    local b
    for b in "$@"; do [[ -x "$BIN/$b" ]] || die "missing $BIN/$b"; done
}

# ---------------------------------------------------------------- real Tritons
# require_triton — the real-Triton scripts' first check: curl, jq, and the tritonserver that
# scripts/setup.sh installs (its paths from scripts/env.sh).
require_triton() {
    require curl jq
    # shellcheck disable=SC1091
    source scripts/env.sh >/dev/null 2>&1 || true
    [[ -x "${TRITONSERVER:-}" ]] || die "no tritonserver in .venv: run scripts/setup.sh once"
}

# start_tritons REPOSITORY PORT... — one tritonserver per PORT (http; grpc PORT+1, metrics
# PORT+2) over REPOSITORY: CPU, explicit model control, Triton's default flags, nothing
# loaded, each in its own process group. Waits until each is ready; sets TRITON_VERSION.
# Needs TRITONSERVER and TRITON_BACKENDS (scripts/env.sh). A script that starts them calls
# stop_tritons from its on_exit.
TRITON_PIDS=()
start_tritons() {
    local repository="$1" port
    shift
    for port in "$@"; do
        setsid "$TRITONSERVER" --model-repository="$repository" --backend-directory="$TRITON_BACKENDS" \
            --model-control-mode=explicit \
            --http-address=127.0.0.1 --http-port="$port" \
            --grpc-address=127.0.0.1 --grpc-port=$((port + 1)) \
            --metrics-address=127.0.0.1 --metrics-port=$((port + 2)) --allow-metrics=true \
            --exit-timeout-secs=5 </dev/null >"$TMP/triton-$port.log" 2>&1 &
        TRITON_PIDS+=("$!")
    done
    for port in "$@"; do
        wait_http "http://127.0.0.1:$port/v2/health/ready" 60 ||
            { tail -20 "$TMP/triton-$port.log" >&2; die "Triton on :$port never became ready"; }
    done
    TRITON_VERSION="$(curl -s "127.0.0.1:$1/v2" | jq -r .version)"
}
stop_tritons() {
    local pid i
    for pid in "${TRITON_PIDS[@]}"; do
        # TERM to the group lets Triton unload its models and end their stubs; KILL after 10 s.
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${TRITON_PIDS[@]}"; do
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    TRITON_PIDS=()
}

# ---------------------------------------------------------------- machine
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# describe_machine PATHS... — sets LOAD_BEFORE, CPU_MODEL, MEM, KERNEL, NPROC, and DIRTY
# (uncommitted changed files under PATHS: what the measured build has beyond its commit).
describe_machine() {
    LOAD_BEFORE="$(loadavg)"
    CPU_MODEL="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    MEM="$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    KERNEL="$(uname -sr)"
    NPROC="$(nproc)"
    DIRTY="$(git status --porcelain -- "$@" | wc -l)"
}

# ---------------------------------------------------------------- servers
wait_http() { # url [seconds] [header] — until it answers 200
    local url="$1" deadline=$((SECONDS + ${2:-20})) header=()
    [[ -n "${3:-}" ]] && header=(-H "$3")
    until [[ "$(curl -s -o /dev/null -w '%{http_code}' "${header[@]}" "$url" 2>/dev/null)" == 200 ]]; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# The add_sub request every script's checks send (INPUT0, INPUT1: FP32 [4], JSON).
INFER_BODY='{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,2,3,4]}]}'
# wait_infer URL MODEL SECONDS [BEARER] — until one inference answers 200 (placement has
# adopted add_sub from the backend's index).
wait_infer() {
    local deadline=$((SECONDS + $3)) auth=()
    [[ -n "${4:-}" ]] && auth=(-H "authorization: Bearer $4")
    until [[ "$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" -H 'content-type: application/json' \
        -d "$INFER_BODY" "$1/v2/models/$2/infer" 2>/dev/null)" == 200 ]]; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

wait_port() { # port [seconds] — until something listens on it
    local deadline=$((SECONDS + ${2:-20}))
    until port_busy "$1"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# PROXY_WRAP: a command start_nginx and start_infergate run the proxy under (valgrind, env),
# empty by default; it is the proxy's pid that PID[name] then holds (valgrind execs in place).
PROXY_WRAP=()

# nginx: render a template from loadtest/nginx into its own prefix dir, check it, and run it
# in the foreground; GLOBALS, when given, are added with -g (compare.sh: 'master_process off;').
start_nginx() { # name listen_port upstream_port template [globals]
    local dir="$TMP/nginx-$1" log=off globals=()
    [[ -n "${5:-}" ]] && globals=(-g "$5")
    mkdir -p "$dir"
    [[ "$ACCESS_LOG" == on ]] && log="$dir/access.log"
    sed -e "s#@PREFIX@#$dir#g" -e "s#@WORKERS@#$WORKERS#" -e "s#@LISTEN@#127.0.0.1:$2#" \
        -e "s#@UPSTREAM@#127.0.0.1:$3#" -e "s#@ACCESS_LOG@#$log#" \
        "loadtest/nginx/$4" >"$dir/nginx.conf"
    "$NGINX" -t -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" "${globals[@]}" >"$dir/test.log" 2>&1 ||
        { cat "$dir/test.log" >&2; die "nginx rejected loadtest/nginx/$4"; }
    "${PROXY_WRAP[@]}" "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" "${globals[@]}" >"$dir/stdout.log" 2>&1 &
    PIDS+=("$!")
    PID[$1]=$!
}

# listen_table PORT [NAME...] — infergate's [listen] table on loopback, then a blank line:
# the listeners NAMEd, in that order (all four when none is), each at its fixed offset:
# http PORT, grpc PORT+1, metrics PORT+2, admin PORT+3. `$(listen_table ...)` drops the blank
# line (as command substitution does): a heredoc writes its own after it.
listen_table() {
    local port="$1" name offset
    shift
    (($#)) || set -- http grpc metrics admin
    printf '[listen]\n'
    for name in "$@"; do
        case "$name" in
            http) offset=0 ;; grpc) offset=1 ;; metrics) offset=2 ;; admin) offset=3 ;;
            *) die "listen_table: no listener $name" ;;
        esac
        printf '%s = "127.0.0.1:%s"\n' "$name" $((port + offset))
    done
    printf '\n'
}

# infergate's log goes to $TMP/NAME.log, like nginx's access log; at warn level (ACCESS_LOG
# not on) it has no per-request line. The config is checked first.
start_infergate() { # name config [binary, default $BIN/infergate]
    local level=info binary="${3:-$BIN/infergate}"
    [[ "$ACCESS_LOG" == on ]] || level=warn
    local config="$2"
    if [[ "$WORKERS" != auto ]]; then
        # `server.workers`, in the [server] table the config has or in one of its own.
        config="$TMP/$1.workers.toml"
        if grep -q '^\[server\]' "$2"; then
            sed "/^\[server\]/a workers = $WORKERS" "$2" >"$config"
        else
            { printf '[server]\nworkers = %s\n' "$WORKERS"; cat "$2"; } >"$config"
        fi
    fi
    "$binary" check --config "$config" >"$TMP/check.out" 2>&1 ||
        { cat "$TMP/check.out" >&2; die "infergate check refused the $1 config"; }
    RUST_LOG="$level" "${PROXY_WRAP[@]}" "$binary" --config "$config" >"$TMP/$1.log" 2>&1 &
    PIDS+=("$!")
    PID[$1]=$!
}

# load_through NAME URL MODEL — MODEL's first request, through the gateway NAME at URL, to a
# Triton started empty (default flags, nothing preloaded): the gateway places and loads the
# copy as in production, and answers the model's metadata, what most clients ask first. A
# benchmark's direct-to-Triton baseline then uses that copy, and its other gateways adopt it,
# as replicas do.
load_through() {
    curl -sf --max-time 180 "$2/v2/models/$3" >/dev/null ||
        { tail -20 "$TMP/$1.log" >&2; die "$1 did not load $3 on its first request"; }
}

# Placement adopts MODEL from the backend's repository index (it answers READY); the admin
# API must show it ready before anything is measured. ADMIN_KEY, when set, is sent.
wait_placement() { # name admin_port model
    local deadline=$((SECONDS + 20)) auth=()
    [[ -n "${ADMIN_KEY:-}" ]] && auth=(-H "x-api-key: $ADMIN_KEY")
    until curl -s "${auth[@]}" "127.0.0.1:$2/admin/placement" |
        jq -e --arg m "$3" '[.backends[].models[] | select(.name == $m and .state == "ready")] | length > 0' >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { tail -20 "$TMP/$1.log" >&2; die "$1: $3 never showed ready in /admin/placement"; }
        sleep 0.2
    done
}

# ---------------------------------------------------------------- credentials
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
# A JWT for the benchmark's tenant (iss "bench", aud "infergate", a day to live), signed
# with openssl: RS256 with a private key PEM file, or HS256 with a secret.
mint_jwt() { # alg kid key
    local header payload signature
    header="$(printf '{"alg":"%s","typ":"JWT","kid":"%s"}' "$1" "$2" | b64url)"
    payload="$(printf '{"iss":"bench","aud":"infergate","sub":"bench","tenant":"bench","exp":%d}' \
        $(($(date +%s) + 86400)) | b64url)"
    case "$1" in
        RS256) signature="$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign "$3" -binary | b64url)" ;;
        HS256) signature="$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -mac HMAC -macopt "key:$3" -binary | b64url)" ;;
        *) die "mint_jwt: no $1" ;;
    esac
    printf '%s.%s.%s' "$header" "$payload" "$signature"
}

# everything_on_key — the RS256 key pair everything_on_tables names ($TMP/jwt.pem, its public
# half $TMP/jwt.pub.pem) and TOKEN, a JWT signed with it for the load's bearer.
everything_on_key() {
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TMP/jwt.pem" 2>/dev/null
    openssl pkey -in "$TMP/jwt.pem" -pubout -out "$TMP/jwt.pub.pem"
    # shellcheck disable=SC2034 # read by the scripts that source this
    TOKEN="$(mint_jwt RS256 bench "$TMP/jwt.pem")"
}

# fake_gateway_config PORT ON WORKERS BACKEND_PORT [METRICS_PORT] [GRPC_PORT] — a gateway on
# PORT in front of one fake-triton: validation off (ON=0), everything on (ON=1), or
# validation on and nothing else (ON=2); server.workers when WORKERS is set; a metrics
# listener when asked. With GRPC_PORT, a gRPC listener there too, forwarding to the
# backend's gRPC port BACKEND_PORT+1: a real Triton's, as start_tritons places it
# (fake-triton has no gRPC). ab.sh's, instructions.sh's and compare.sh's gateways.
fake_gateway_config() {
    printf '[listen]\nhttp = "127.0.0.1:%s"\n' "$1"
    [[ -n "${5:-}" ]] && printf 'metrics = "127.0.0.1:%s"\n' "$5"
    [[ -n "${6:-}" ]] && printf 'grpc = "127.0.0.1:%s"\n' "$6"
    printf '\n'
    [[ -n "$3" ]] && printf '[server]\nworkers = %s\n\n' "$3"
    printf '[[backends]]\nname = "backend"\nhttp = "http://127.0.0.1:%s"\n' "$4"
    [[ -n "${6:-}" ]] && printf 'grpc = "http://127.0.0.1:%s"\n' $(($4 + 1))
    printf 'capacity = "16GiB"\n\n'
    if (($2 == 1)); then
        everything_on_tables
    elif (($2 == 2)); then
        printf '[validation]\nenabled = true\n'
    else
        printf '[validation]\nenabled = false\n'
    fi
}

# The gateway stages of compare.sh, profile.sh and moves.sh, in one place: ig-off (validation
# off), ig-val (validation on, the default config) and ig-on (everything on: the load calls
# route "bench" with the RS256 bearer).
# stage_on STAGE — its fake_gateway_config ON; everything_on STAGE — whether it is ig-on;
# model_of STAGE — the model its load calls.
declare -A STAGE_ON=([ig-off]=0 [ig-val]=2 [ig-on]=1)
stage_on() { [[ -n "${STAGE_ON[$1]:-}" ]] || die "not a gateway stage: $1"; echo "${STAGE_ON[$1]}"; }
everything_on() { [[ "$1" == ig-on ]]; }
model_of() { if everything_on "$1"; then echo bench; else echo add_sub; fi; }
# h2load_ok [FILE] — the requests h2load's report (FILE, or standard input) says succeeded.
h2load_ok() { awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^succeeded/) { print $i; exit } }' "$@"; }

# "Everything on" for infergate, the same in bench.sh's stage 4 and ab.sh: validation, an
# RS256 JWT on every request (key $TMP/jwt.pub.pem), and a 90/10 route "bench" with an
# error-rate guard; with ADMIN_HASH set, an admin API key too. Each feature is a block
# between "#>> name: what it does" and "#<<", which bench.sh keeps only when this build has it.
everything_on_tables() {
    cat <<EOF
#>> validation: every request checked against add_sub's signature before it is forwarded
[validation]
enabled = true
#<<

#>> jwt-auth: a JWT (RS256) on every request, verified-token cache on (the default), tenant admitted
[auth]
mode = "required"
issuers = ["bench"]
audiences = ["infergate"]

[[auth.jwt_keys]]
id = "bench"
algorithms = ["RS256"]
pem_file = "$TMP/jwt.pub.pem"

$(admin_key_table)
#<<

#>> canary-route: the load calls route "bench", split 90/10 between add_sub and add_sub version 1, with an error-rate guard
[[routes]]
model = "bench"
targets = [{ model = "add_sub", weight = 90 }, { model = "add_sub", version = "1", weight = 10 }]
guard = { max_error_rate = 0.5, window = "30s", min_requests = 100 }
#<<
EOF
}
admin_key_table() {
    [[ -n "${ADMIN_HASH:-}" ]] || return 0
    printf '[[auth.api_keys]]\nname = "bench-admin"\nsha256 = "%s"\nroles = ["admin"]\n' "$ADMIN_HASH"
}

# ---------------------------------------------------------------- /proc
HZ="$(getconf CLK_TCK)"
# CPU ticks (user + system) of processes, for CPU per request.
ticks() { local t=0 p f; for p in "$@"; do read -r -a f <"/proc/$p/stat" || continue; t=$((t + f[13] + f[14])); done; echo "$t"; }
# per_req_us TICKS REQUESTS — CPU µs a request ("-" when none was served).
per_req_us() { awk -v t="$1" -v hz="$HZ" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", t / hz / n * 1e6; else print "-" }'; }
# The system part of ticks (stime): the kernel's share of a proxy's CPU.
sys_ticks() { local t=0 p f; for p in "$@"; do read -r -a f <"/proc/$p/stat" || continue; t=$((t + f[14])); done; echo "$t"; }
# Peak RSS (VmHWM) in KiB, summed over processes.
hwm_kib() { local t=0 p v; for p in "$@"; do v="$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)"; t=$((t + ${v:-0})); done; echo "$t"; }
children() { pgrep -P "$1" | tr '\n' ' '; }

# load_step OUT LABEL URL C "BACKEND_PIDS" PROXY_PIDS... — one infergate-load step (LOAD_ARGS,
# then STEP_ARGS) into OUT (its JSON); OUT.cpu gets "proxy backend" CPU µs per request ("-"
# for no proxy), OUT.load the 1-minute load average before it.
STEP_ARGS=()
load_step() {
    local out="$1" label="$2" url="$3" c="$4" backend="$5"; shift 5
    local before_p before_b after_p after_b span ok
    cut -d' ' -f1 /proc/loadavg >"$out.load"
    # shellcheck disable=SC2086
    before_p="$(ticks "$@")"; before_b="$(ticks $backend)"
    "$BIN/infergate-load" --url "$url" "${LOAD_ARGS[@]}" "${STEP_ARGS[@]}" -c "$c" >"$out" 2>"$out.err" ||
        { cat "$out.err" >&2; die "infergate-load failed for $label"; }
    # shellcheck disable=SC2086
    after_p="$(ticks "$@")"; after_b="$(ticks $backend)"
    # Requests served during the whole invocation (warm-up included), estimated from the
    # measured rate: CPU ticks cover the warm-up too.
    span="$(jq '.config.warmup_s + .steps[0].measured_s' "$out")"
    ok="$(jq --argjson span "$span" '.steps[0].throughput_rps * $span' "$out")"
    awk -v p=$((after_p - before_p)) -v b=$((after_b - before_b)) -v hz="$HZ" -v n="$ok" -v np=$# \
        'BEGIN { if (n <= 0) { print "- -"; exit }
                 printf "%s %s\n", (np ? sprintf("%.1f", p / hz / n * 1e6) : "-"), sprintf("%.1f", b / hz / n * 1e6) }' >"$out.cpu"
    say "$label: $(jq -r '.steps[0] | "\(.throughput_rps | floor) infer/s, p50 \(.latency_us.p50) us, p99 \(.latency_us.p99) us, errors \(.errors)"' "$out")"
}

# ---------------------------------------------------------------- callgrind
# Counting a running process's user-space instructions (instructions.sh, compare.sh): start
# it under `valgrind --tool=callgrind --vgdb-prefix="$VG" --callgrind-out-file=F`, then
# `cg --zero PID`, the load, `dump OUT NAME PID` (F must be $TMP/NAME.cg), `ir_of` the dump.
VG="$TMP/vgdb" # vgdb's FIFOs, ours alone
# GLIBC_TUNABLES for a process under callgrind: glibc's `rep movsb`/`stosb` above 2 KiB count
# as one instruction per byte, so the count would follow bytes moved, not work done
# (instructions.sh's header has the figures); these thresholds keep glibc on its vector loops.
# shellcheck disable=SC2034 # read by the scripts that source this
CALLGRIND_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1073741824:glibc.cpu.x86_rep_stosb_threshold=1073741824
cg() { callgrind_control --vgdb-prefix="$VG" "$@" >>"$TMP/cgctl.log" 2>&1; }
# dump OUT NAME PID — a callgrind dump of everything since the last zero; OUT gets its path.
# With --callgrind-out-file=F, the Nth dump of a run is F.N (and F itself is written at exit).
declare -A DUMPS=()
dump() {
    local n=$((${DUMPS[$2]:-0} + 1)) deadline=$((SECONDS + 60))
    local part="$TMP/$2.cg.$n"
    cg --dump "$3" || die "callgrind_control --dump $3 failed: $(tail -3 "$TMP/cgctl.log")"
    until [[ -f "$part" ]] && grep -q '^totals:' "$part"; do
        ((SECONDS < deadline)) || die "no complete callgrind dump $part"
        sleep 0.2
    done
    DUMPS[$2]=$n
    printf -v "$1" '%s' "$part"
}
ir_of() { awk '/^totals:/ { print $2 }' "$1"; }
# misses_of FILE — the simulated cache misses of a dump made with --cache-sim=yes, as
# "L1i L1d" (L1d: read and write misses): valgrind's model of this CPU's first-level caches,
# a count as deterministic as Ir. A miss there is served by L2 at some 5-15 cycles, so
# two programs of equal Ir differ in time by what their data and code spread over.
misses_of() {
    awk '/^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
        /^totals:/ { printf "%d %d\n", $col["I1mr"], $col["D1mr"] + $col["D1mw"] }' "$1"
}
# CACHE_SIM — what callgrind is given to count those misses alongside Ir.
# shellcheck disable=SC2034 # read by the scripts that source this
CACHE_SIM=(--cache-sim=yes)

# ---------------------------------------------------------------- report arithmetic
calc() { awk "BEGIN { printf \"$1\", $2 }"; }
ratio() { # a b -> a/b with 2 decimals, n/a when b <= 0
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'
}
# Median of numbers on stdin, one a line ("-" when there are none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (!NR) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
met() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN { ok = (op == ">=" ? v >= t : v < t); print (ok ? "met" : "**not met**") }'; }
join_list() { local out="" x; for x in "$@"; do out+="${out:+; }$x"; done; echo "${out:-none}"; }
