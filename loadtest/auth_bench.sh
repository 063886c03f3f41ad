#!/usr/bin/env bash
# loadtest/auth_bench.sh — what JWT authentication costs, in one run on one machine.
#
# Five infergate processes over one fake-triton (add_sub), validation off in all of them so
# the auth stage is the only difference, measured in turns at each concurrency level:
#   off            auth.mode = "none"
#   rs256          JWT RS256, verified-token cache on (the default: a reused token is a lookup)
#   rs256-nocache  JWT RS256, token_cache_capacity = 0 (every request verifies the signature)
#   hs256          JWT HS256, cache on
#   hs256-nocache  JWT HS256, cache off
# The token is minted here with the openssl command. Writes
# loadtest/results/<date>-<sha>-auth.md and prints it. Stays on loopback; stops what it started.
#
# Knobs: AUTH_BENCH_BASE_PORT=29400 BENCH_WARMUP=1s BENCH_WINDOW=3s BENCH_WINDOWS=3
#        BENCH_CONCURRENCY="1 16 64" BENCH_PROXY_WORKERS=1 BENCH_BUILD=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${AUTH_BENCH_BASE_PORT:-29400}"
WARMUP="${BENCH_WARMUP:-1s}"
WINDOW="${BENCH_WINDOW:-3s}"
WINDOWS="${BENCH_WINDOWS:-3}"
read -r -a LEVELS <<<"${BENCH_CONCURRENCY:-1 16 64}"
WORKERS="${BENCH_PROXY_WORKERS:-1}"
BUILD="${BENCH_BUILD:-1}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${BENCH_OUT:-loadtest/results/$DATE-$SHA-auth.md}"
BIN="$ROOT/target/release"
STAGES=(off rs256 rs256-nocache hs256 hs256-nocache)

STARTED=$SECONDS
ACCESS_LOG=off # the gateways log at warn level: no per-request line
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh

require curl jq openssl
check_ports "$BASE" $(for i in 1 2 3 4 5; do echo $((BASE + 10 * i)) $((BASE + 10 * i + 3)); done)
build_release infergate infergate-load fake-triton

# ---------------------------------------------------------------- keys and tokens
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TMP/rsa.pem" 2>/dev/null
openssl pkey -in "$TMP/rsa.pem" -pubout -out "$TMP/rsa.pub.pem"
SECRET="$(openssl rand -hex 32)"
export AUTH_BENCH_SECRET="$SECRET" # the HS256 key's secret_env, read by every gateway
ADMIN_KEY="$(openssl rand -hex 16)"
ADMIN_HASH="$(printf '%s' "$ADMIN_KEY" | sha256sum | cut -d' ' -f1)"
declare -A TOKEN=([off]="" [rs256]="$(mint_jwt RS256 rsa "$TMP/rsa.pem")" [hs256]="$(mint_jwt HS256 hmac "$SECRET")")
TOKEN[rs256-nocache]="${TOKEN[rs256]}"
TOKEN[hs256-nocache]="${TOKEN[hs256]}"

config() { # stage http_port
    local cache=10000
    [[ "$1" == *-nocache ]] && cache=0
    cat <<EOF
$(listen_table "$2" http admin)

[[backends]]
name = "backend"
http = "http://127.0.0.1:$BASE"
capacity = "16GiB"

[validation]
enabled = false
EOF
    [[ "$1" == off ]] && return
    cat <<EOF

[auth]
mode = "required"
issuers = ["bench"]
audiences = ["infergate"]
token_cache_capacity = $cache

[[auth.jwt_keys]]
id = "rsa"
algorithms = ["RS256"]
pem_file = "$TMP/rsa.pub.pem"

[[auth.jwt_keys]]
id = "hmac"
algorithms = ["HS256"]
secret_env = "AUTH_BENCH_SECRET"

[[auth.api_keys]]
name = "bench-admin"
sha256 = "$ADMIN_HASH"
roles = ["admin"]
EOF
}

"$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads 1 >"$TMP/fake.log" 2>&1 &
PIDS+=("$!")
BACKEND_PID=$!
wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"

declare -A PORT PID
i=1
for stage in "${STAGES[@]}"; do
    PORT[$stage]=$((BASE + 10 * i))
    i=$((i + 1))
    config "$stage" "${PORT[$stage]}" >"$TMP/$stage.toml"
    start_infergate "$stage" "$TMP/$stage.toml"
done
for stage in "${STAGES[@]}"; do wait_placement "$stage" $((PORT[$stage] + 3)) add_sub; done

LOAD_ARGS=(-i INPUT0:FP32:4 -i INPUT1:FP32:4 --check --threads 1
    --warmup "$WARMUP" --duration "$WINDOW" --windows "$WINDOWS" --json -q)
for c in "${LEVELS[@]}"; do
    for stage in "${STAGES[@]}"; do
        STEP_ARGS=()
        [[ -n "${TOKEN[$stage]}" ]] && STEP_ARGS=(--bearer "${TOKEN[$stage]}")
        load_step "$TMP/$stage-c$c.json" "$stage c=$c" "http://127.0.0.1:${PORT[$stage]}" "$c" "$BACKEND_PID" "${PID[$stage]}"
    done
done

f() { jq -r ".steps[0]$2" "$TMP/$1.json"; }
{
    echo "# infergate JWT auth cost: $DATE, commit $SHA"
    echo
    echo "Produced by \`loadtest/auth_bench.sh\`. One fake-triton (add_sub), five infergate"
    echo "processes with validation off ($WORKERS worker(s) each, access log off), measured in"
    echo "turns at each concurrency level: warm-up $WARMUP, then $WINDOWS × $WINDOW windows."
    echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load before: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "The load generator sends one token for the whole run: with the cache on (the default),"
    echo "only its first request is verified; \`-nocache\` verifies the signature on every request."
    echo
    echo "Gateway CPU per request (from /proc, over the whole step) holds up better than"
    echo "throughput when something else shares the machine; load is the 1-minute average before"
    echo "each step."
    echo
    echo "| stage | c | infer/s | × off | gateway CPU µs/req | CPU × off | p50 µs | p99 µs | errors | load |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for c in "${LEVELS[@]}"; do
        off="$(f "off-c$c" .throughput_rps)"
        read -r off_cpu _ <"$TMP/off-c$c.json.cpu"
        for stage in "${STAGES[@]}"; do
            rps="$(f "$stage-c$c" .throughput_rps)"
            read -r cpu _ <"$TMP/$stage-c$c.json.cpu"
            printf '| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n' "$stage" "$c" "$rps" \
                "$(ratio "$rps" "$off")" "$cpu" "$(ratio "$cpu" "$off_cpu")" \
                "$(f "$stage-c$c" .latency_us.p50)" "$(f "$stage-c$c" .latency_us.p99)" \
                "$(f "$stage-c$c" .errors)" "$(cat "$TMP/$stage-c$c.json.load")"
        done
    done
} >"$OUT"
cat "$OUT"
