#!/usr/bin/env bash
# loadtest/queue_aware.sh — what a queue the gateway did not fill costs its clients, with
# queue readings off (`placement.queue_max_age = "0s"`: copies chosen by this gateway's own
# requests in flight) and on (the default 5s: Triton's nv_inference_pending_request_count
# counts too).
#
# Two real Tritons (CPU, default flags, empty) hold `slow_model` (one instance: requests run
# one at a time) twice, through `[[models]] min_copies = 2`. FLOOD_CLIENTS python threads call
# the first Triton directly with 200 ms requests, as another replica would, while
# QA_CLIENTS threads send 5 ms requests through infergate for QA_DURATION seconds. Per run:
# the gateway's requests, p50/p99, and the share it sent to the flooded Triton.
#
# Writes loadtest/results/<date>-<short sha>-queue-aware.md and prints it.
#
# Knobs: QA_BASE_PORT=29900  QA_DURATION=30  QA_CLIENTS=4  FLOOD_CLIENTS=4
#        QA_BUILD=1 (0 skips the release build)  QA_BIN=target/release  QA_OUT=path.md
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${QA_BASE_PORT:-29900}"
DURATION="${QA_DURATION:-30}"
CLIENTS="${QA_CLIENTS:-4}"
FLOOD="${FLOOD_CLIENTS:-4}"
BUILD="${QA_BUILD:-1}"
BIN="$ROOT/${QA_BIN:-target/release}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${QA_OUT:-loadtest/results/$DATE-$SHA-queue-aware.md}"
WORKERS=auto
ACCESS_LOG=off
STARTED=$SECONDS

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
on_exit() { stop_tritons; }

require_triton
check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) $((BASE + 11)) $((BASE + 12)) \
    $((BASE + 20)) $((BASE + 22)) $((BASE + 23))
build_release infergate
describe_machine src Cargo.toml Cargo.lock
start_tritons "$ROOT/tests/models" "$BASE" $((BASE + 10))

# One JSON line: {"requests", "errors", "p50_ms", "p99_ms"}.
cat >"$TMP/clients.py" <<'PY'
import json, sys, threading, time, urllib.request

url, clients, seconds, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"parameters": {"delay_ms": delay},
                   "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}).encode()
lock, took, errors = threading.Lock(), [], 0
deadline = time.monotonic() + seconds

def client():
    global errors
    while time.monotonic() < deadline:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
                ok = response.status == 200
        except Exception:
            ok = False
        with lock:
            if ok:
                took.append(time.monotonic() - started)
            else:
                errors += 1

threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
took.sort()
pick = lambda q: round(1000 * took[min(len(took) - 1, int(q * len(took)))], 1) if took else None
print(json.dumps({"requests": len(took) + errors, "errors": errors, "p50_ms": pick(0.5), "p99_ms": pick(0.99)}))
PY

IG=$((BASE + 20))
served_by() { # backend -> the gateway's slow_model requests answered by it
    curl -s "127.0.0.1:$((IG + 2))/metrics" |
        awk -v b="backend=\"$1\"" 'index($0, "infergate_requests_total{") == 1 && index($0, "model=\"slow_model\"") && index($0, b) { s += $NF } END { print s + 0 }'
}
ROWS=()
for age in 0s 5s; do
    cat >"$TMP/infergate.toml" <<EOF
$(listen_table "$IG" http metrics admin)
[upstream]
health_interval = "500ms"
[placement]
scale_up_rps = 0.0
scale_up_queue = 0.0
queue_max_age = "$age"
[[backends]]
name = "t0"
http = "http://127.0.0.1:$BASE"
metrics = "http://127.0.0.1:$((BASE + 2))/metrics"
[[backends]]
name = "t1"
http = "http://127.0.0.1:$((BASE + 10))"
metrics = "http://127.0.0.1:$((BASE + 12))/metrics"
[[models]]
name = "slow_model"
min_copies = 2
EOF
    start_infergate "qa-$age" "$TMP/infergate.toml"
    wait_http "http://127.0.0.1:$IG/v2/health/ready" 20 || die "infergate never became ready"
    until [[ "$(curl -s "127.0.0.1:$((IG + 3))/admin/placement" | jq '[.backends[].models[] | select(.name == "slow_model" and .state == "ready")] | length')" == 2 ]]; do sleep 0.2; done
    say "queue_max_age = $age: $FLOOD direct clients on t0, $CLIENTS through infergate, ${DURATION}s"
    python3 "$TMP/clients.py" "http://127.0.0.1:$BASE/v2/models/slow_model/infer" "$FLOOD" "$((DURATION + 2))" 200 >/dev/null &
    flood=$!
    sleep 1
    python3 "$TMP/clients.py" "http://127.0.0.1:$IG/v2/models/slow_model/infer" "$CLIENTS" "$DURATION" 5 >"$TMP/run-$age.json"
    wait "$flood" || true
    r="$TMP/run-$age.json"
    t0="$(served_by t0)"
    t1="$(served_by t1)"
    ROWS+=("| \`$age\` | $(jq .requests "$r") | $(jq .errors "$r") | $(jq -r '"\(.p50_ms) / \(.p99_ms)"' "$r") | $t0 of $((t0 + t1)) ($(calc '%.0f' "100 * $t0 / ($t0 + $t1 + 0.0001)")%) |")
    say "${ROWS[-1]}"
    stop_pids "${PID[qa-$age]}"
done

mkdir -p "$(dirname "$OUT")"
{
    echo "# Queue-aware copy choice ($DATE, $SHA)"
    echo
    echo "\`loadtest/queue_aware.sh\`: \`slow_model\` on two Tritons ($TRITON_VERSION, default flags); $FLOOD clients call the first directly with 200 ms requests while $CLIENTS clients send 5 ms requests through infergate for ${DURATION} s. The runs differ only in \`placement.queue_max_age\` (\`0s\`: readings off)."
    echo
    echo "| queue_max_age | requests | errors | p50 / p99 ms | sent to the flooded Triton |"
    echo "|---|--:|--:|--:|--:|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Machine: $CPU_MODEL, $NPROC cores, $MEM, $KERNEL; load average $(loadavg) after; binaries $BIN. $((SECONDS - STARTED)) s in all."
} >"$OUT"
cat "$OUT"
