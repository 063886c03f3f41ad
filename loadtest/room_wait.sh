#!/usr/bin/env bash
# loadtest/room_wait.sh — how many cold requests are refused for want of room, with
# `placement.room_wait = "0s"` (refuse at once, as before) and with the default wait, on the
# workload of issue 18: 8 clients over 8 models on 2 backends that hold 3 each.
#
# Two real Tritons (CPU, Triton's default flags, nothing loaded at start) over a repository
# of 8 identity models (copies of tests/models/sized_a, `room_0`..`room_7`), each sized
# 1 GiB by `[[models]] size`, on backends of 3.2 GiB: 6 of the 8 fit. `min_churn_age = "0s"`
# so that the churn guard does not decide instead (this measures room, not churn). 8 clients
# (python threads, stdlib HTTP) each send one request after another for ROOM_DURATION, in
# batches of ROOM_BATCH requests to one model drawn at random (seeded per client), as a client
# working through a batch does: a copy in a batch is in use nearly all the time, idle only
# between one answer and the next request. Then the same with the next room_wait. Per
# run: requests, answers by status, the share refused with "no backend has room", the share
# of other 503s, p50/p99 of the answered ones, loads, and the room waits
# (infergate_placement_room_waits_total) by result.
#
# Writes loadtest/results/<date>-<short sha>-room-wait.md and prints it. Stays on loopback,
# stops only what it started. About 2 × ROOM_DURATION plus the build.
#
# Knobs (environment):
#   ROOM_BASE_PORT=29800   ports used: base..base+2 and base+10..12 (the Tritons),
#                          base+20, +22, +23 (infergate)
#   ROOM_DURATION=120      seconds per run
#   ROOM_WAITS="0s 3s"     the room_wait values to run, in order
#   ROOM_CLIENTS=8 ROOM_MODELS=8 ROOM_BATCH=20
#   ROOM_BUILD=1           0 skips `cargo build --release`
#   ROOM_BIN=target/release where the binaries are (target/debug works for a quick check)
#   ROOM_OUT=path.md       results file (default loadtest/results/<date>-<sha>-room-wait.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${ROOM_BASE_PORT:-29800}"
DURATION="${ROOM_DURATION:-120}"
WAITS="${ROOM_WAITS:-0s 3s}"
CLIENTS="${ROOM_CLIENTS:-8}"
MODELS="${ROOM_MODELS:-8}"
BATCH="${ROOM_BATCH:-20}"
BUILD="${ROOM_BUILD:-1}"
BIN="$ROOT/${ROOM_BIN:-target/release}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${ROOM_OUT:-loadtest/results/$DATE-$SHA-room-wait.md}"
WORKERS=auto
ACCESS_LOG=off
STARTED=$SECONDS

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
on_exit() { stop_tritons; }

require_triton
check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) $((BASE + 11)) $((BASE + 12)) \
    $((BASE + 20)) $((BASE + 21)) $((BASE + 22)) $((BASE + 23))
build_release infergate
describe_machine src Cargo.toml Cargo.lock

# ---------------------------------------------------------------- the models
REPO="$TMP/models"
for ((i = 0; i < MODELS; i++)); do
    mkdir -p "$REPO/room_$i/1"
    sed "s/\"sized_a\"/\"room_$i\"/" tests/models/sized_a/config.pbtxt >"$REPO/room_$i/config.pbtxt"
    cp tests/models/sized_a/1/model.py "$REPO/room_$i/1/model.py"
done

# ---------------------------------------------------------------- Tritons, empty
start_tritons "$REPO" "$BASE" $((BASE + 10))

# ---------------------------------------------------------------- the clients
# One JSON line: {"requests", "statuses": {code: n}, "no_room", "p50_ms", "p99_ms"}.
cat >"$TMP/clients.py" <<'PY'
import json, random, sys, threading, time, urllib.error, urllib.request

url, clients, models, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
seconds = float(sys.argv[5])
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}).encode()
lock = threading.Lock()
statuses, no_room, answered = {}, 0, []
deadline = time.monotonic() + seconds

def client(seed):
    global no_room
    rng = random.Random(seed)
    sent = 0
    while time.monotonic() < deadline:
        if sent % batch == 0:
            model = f"room_{rng.randrange(models)}"
        sent += 1
        request = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body,
                                         headers={"Content-Type": "application/json"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        took = time.monotonic() - started
        with lock:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                answered.append(took)
            elif b"no backend has room" in text:
                no_room += 1

threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
answered.sort()
pick = lambda q: round(1000 * answered[min(len(answered) - 1, int(q * len(answered)))], 1) if answered else None
print(json.dumps({"requests": sum(statuses.values()), "statuses": statuses, "no_room": no_room,
                  "p50_ms": pick(0.50), "p99_ms": pick(0.99)}))
PY

# ---------------------------------------------------------------- runs
IG=$((BASE + 20))
metric() { # name filter -> the sum of the gateway's series of NAME whose line holds FILTER
    curl -s "127.0.0.1:$((IG + 2))/metrics" |
        awk -v name="$1" -v filter="$2" 'index($0, name) == 1 && index($0, filter) { s += $NF } END { print s + 0 }'
}
unload_all() { # leave both Tritons empty for the next run
    local port model
    for port in "$BASE" $((BASE + 10)); do
        for model in $(curl -s -XPOST -d '{}' "127.0.0.1:$port/v2/repository/index" | jq -r '.[] | select(.state == "READY") | .name'); do
            curl -s -o /dev/null -XPOST -d '{}' "127.0.0.1:$port/v2/repository/models/$model/unload"
        done
        until [[ "$(curl -s -XPOST -d '{}' "127.0.0.1:$port/v2/repository/index" | jq '[.[] | select(.state == "READY" or .state == "UNLOADING")] | length')" == 0 ]]; do sleep 0.2; done
    done
}
ROWS=()
for wait in $WAITS; do
    models_toml=""
    for ((i = 0; i < MODELS; i++)); do models_toml+=$'[[models]]\n'"name = \"room_$i\""$'\nsize = "1GiB"\n'; done
    cat >"$TMP/infergate.toml" <<EOF
$(listen_table "$IG" http metrics admin)

[placement]
mem_buffer = "0"
min_churn_age = "0s"
scale_up_rps = 0.0
room_wait = "$wait"

[[backends]]
name = "t0"
http = "http://127.0.0.1:$BASE"
capacity = "3.2GiB"

[[backends]]
name = "t1"
http = "http://127.0.0.1:$((BASE + 10))"
capacity = "3.2GiB"

$models_toml
EOF
    start_infergate "room-$wait" "$TMP/infergate.toml"
    wait_http "http://127.0.0.1:$IG/v2/health/ready" 20 || die "infergate never became ready: $(tail "$TMP/room-$wait.log")"
    say "room_wait = $wait: $CLIENTS clients over $MODELS models, batches of $BATCH, for ${DURATION}s"
    python3 "$TMP/clients.py" "http://127.0.0.1:$IG" "$CLIENTS" "$MODELS" "$BATCH" "$DURATION" >"$TMP/run-$wait.json"
    r="$TMP/run-$wait.json"
    total="$(jq .requests "$r")"
    no_room="$(jq .no_room "$r")"
    other_503="$(jq "(.statuses[\"503\"] // 0) - .no_room" "$r")"
    loads="$(metric infergate_placement_loads_total 'result="success"')"
    ROWS+=("| \`$wait\` | $total | $(jq -r '.statuses | to_entries | map("\(.key): \(.value)") | join(", ")' "$r") | $no_room ($(calc '%.1f' "100 * $no_room / $total")%) | $other_503 | $(jq -r '"\(.p50_ms) / \(.p99_ms)"' "$r") | $loads | $(metric infergate_placement_room_waits_total placed) / $(metric infergate_placement_room_waits_total refused) |")
    say "${ROWS[-1]}"
    stop_pids "${PID[room-$wait]}"
    unload_all
done
LOAD_AFTER="$(loadavg)"

# ---------------------------------------------------------------- report
mkdir -p "$(dirname "$OUT")"
{
    echo "# Waiting for room ($DATE, $SHA)"
    echo
    echo "\`loadtest/room_wait.sh\`: $CLIENTS clients, each sending one request after another in batches of $BATCH to one of $MODELS identity models drawn at random, for ${DURATION} s per run, through infergate over two Tritons ($TRITON_VERSION, started empty with default flags) that hold 3 of the 1 GiB models each (\`capacity = \"3.2GiB\"\`, \`min_churn_age = \"0s\"\`). The runs differ only in \`placement.room_wait\`."
    echo
    echo "| room_wait | requests | answers | refused: no room | other 503 | p50 / p99 ms (answered) | loads | room waits placed / refused |"
    echo "|---|--:|---|--:|--:|--:|--:|--:|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Machine: $CPU_MODEL, $NPROC cores, $MEM, $KERNEL; load average $LOAD_BEFORE before, $LOAD_AFTER after; binaries $BIN ($DIRTY uncommitted files). $((SECONDS - STARTED)) s in all."
} >"$OUT"
cat "$OUT"
