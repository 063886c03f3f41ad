#!/usr/bin/env bash
# loadtest/cluster.sh — what `[cluster]` (replicas sharing placement through etcd) costs,
# the figures issue 15 asks for, in one run on one machine:
#
#   1. Warm hits with and without [cluster]: one fake-triton (add_sub, loaded) behind two
#      gateways with the default config, one without [cluster], one with it pointing at a
#      real etcd; infergate-load closed loop at each CLUSTER_CONCURRENCY on the one warm
#      model, the two gateways taking turns (off, on, then on, off, ... per round).
#      Throughput, p50/p99 and the gateway's CPU µs per request (/proc/PID/stat); the
#      ratio on/off (a warm hit never waits on etcd, so they must match).
#   2. Cold misses: CLUSTER_MODELS models over two fake-tritons started empty
#      (`--unloaded`, each load taking CLUSTER_LOAD_DELAY) that hold CLUSTER_SLOTS models
#      each (`[[models]] size`, `min_churn_age = "0s"`, no scale-up). CLUSTER_COLD_CLIENTS
#      python threads ask for the models in turn (request i: model i mod MODELS, replica
#      i mod 2), so nearly every request is a cold miss that evicts. Once through one
#      gateway without [cluster] (the reference), then through two replicas with
#      [cluster]. Reported: end-to-end p50/p99 of the requests, loads per request, and
#      from the replicas' /metrics (p50/p99 interpolated in the buckets, as Prometheus'
#      histogram_quantile does): `infergate_placement_agree_duration_seconds{result}`
#      and `infergate_cluster_etcd_duration_seconds{op="txn"}`, and the conflicts.
#   3. etcd writes at a fixed open-loop rate: CLUSTER_RATES requests/s spread over two
#      replicas for CLUSTER_RATE_DURATION seconds, churning (step 2's replicas;
#      CLUSTER_CHURN_SHARE of the requests go to the other models, in turn) and warm (the
#      replicas started again with the default min_churn_age; one model). etcd's own
#      /metrics before and after: revisions (write transactions that changed a key),
#      `etcd_mvcc_put_total`, `etcd_mvcc_delete_total` and raft proposals committed (every
#      write, failed compare-and-sets and lease grants included); per second and per
#      request, and the loads the gateways made meanwhile.
#
# etcd is Debian's etcd-server (scripts/setup.sh installs it), on loopback ports with its
# data in the temp dir. Writes loadtest/results/<date>-<short sha>-cluster.md and prints
# it. Stays on loopback, stops only what it started. About 7 minutes plus the build.
#
# Knobs (environment):
#   CLUSTER_BASE_PORT=30000   etcd base, base+1; fakes base+10..12; gateways base+20..23,
#                             +30..33, +40..43 (4 ports each: http, -, metrics, admin)
#   CLUSTER_CONCURRENCY="16 64" CLUSTER_ROUNDS=2   step 1's levels and rounds
#   CLUSTER_WARMUP=1s CLUSTER_WINDOW=3s CLUSTER_WINDOWS=3   per step 1 step
#   CLUSTER_MODELS=32 CLUSTER_SLOTS=4 CLUSTER_LOAD_DELAY=20ms   step 2's pool
#   CLUSTER_COLD_CLIENTS=6 CLUSTER_COLD_DURATION=30
#   CLUSTER_RATES="200 1000" CLUSTER_RATE_DURATION=15 CLUSTER_CHURN_SHARE=0.05   step 3
#   CLUSTER_LOAD_THREADS=1 CLUSTER_BACKEND_THREADS=1   infergate-load / fake-triton threads
#   CLUSTER_ACCESS_LOG=off    on: the gateways log at info level, a line per request (with
#                             CLUSTER_LOGS, to see what a slow request waited on)
#   CLUSTER_BUILD=1           0 skips `cargo build --release`
#   CLUSTER_BIN=target/release   where the binaries are
#   CLUSTER_OUT=path.md       results file (default loadtest/results/<date>-<sha>-cluster.md)
#   CLUSTER_LOGS=dir          keep the gateways', fakes' and etcd's logs there (and each
#                             gateway's /metrics at the end of its run)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${CLUSTER_BASE_PORT:-30000}"
read -r -a LEVELS <<<"${CLUSTER_CONCURRENCY:-16 64}"
ROUNDS="${CLUSTER_ROUNDS:-2}"
WARMUP="${CLUSTER_WARMUP:-1s}"
WINDOW="${CLUSTER_WINDOW:-3s}"
WINDOWS="${CLUSTER_WINDOWS:-3}"
MODELS="${CLUSTER_MODELS:-32}"
SLOTS="${CLUSTER_SLOTS:-4}"
LOAD_DELAY="${CLUSTER_LOAD_DELAY:-20ms}"
COLD_CLIENTS="${CLUSTER_COLD_CLIENTS:-6}"
COLD_DURATION="${CLUSTER_COLD_DURATION:-30}"
read -r -a RATES <<<"${CLUSTER_RATES:-200 1000}"
RATE_DURATION="${CLUSTER_RATE_DURATION:-15}"
CHURN_SHARE="${CLUSTER_CHURN_SHARE:-0.05}"
LOAD_THREADS="${CLUSTER_LOAD_THREADS:-1}"
BACKEND_THREADS="${CLUSTER_BACKEND_THREADS:-1}"
BUILD="${CLUSTER_BUILD:-1}"
BIN="$ROOT/${CLUSTER_BIN:-target/release}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${CLUSTER_OUT:-loadtest/results/$DATE-$SHA-cluster.md}"
WORKERS=auto
ACCESS_LOG="${CLUSTER_ACCESS_LOG:-off}"
STARTED=$SECONDS

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
on_exit() { if [[ -n "${CLUSTER_LOGS:-}" ]]; then mkdir -p "$CLUSTER_LOGS" && cp "$TMP"/*.log "$TMP"/*.metrics "$CLUSTER_LOGS"/ 2>/dev/null || true; fi; }
keep_metrics() { # name port: the gateway's /metrics, for CLUSTER_LOGS
    curl -s "127.0.0.1:$2/metrics" >"$TMP/$1.metrics" || true
}

require curl jq python3
command -v etcd >/dev/null || die "etcd is required (scripts/setup.sh installs Debian's etcd-server)"
PORTS=("$BASE" $((BASE + 1)) $((BASE + 10)) $((BASE + 11)) $((BASE + 12)))
for gw in 20 30 40; do PORTS+=($((BASE + gw)) $((BASE + gw + 2)) $((BASE + gw + 3))); done
check_ports "${PORTS[@]}"
build_release infergate infergate-load fake-triton
describe_machine src loadtest/src Cargo.toml Cargo.lock

ETCD="http://127.0.0.1:$BASE"
WARM_FAKE=$((BASE + 10))
COLD_FAKES=($((BASE + 11)) $((BASE + 12)))
GW_OFF=$((BASE + 20)) GW_A=$((BASE + 30)) GW_B=$((BASE + 40))

# ---------------------------------------------------------------- etcd
etcd --name=bench --data-dir="$TMP/etcd" \
    --listen-client-urls="$ETCD" --advertise-client-urls="$ETCD" \
    --listen-peer-urls="http://127.0.0.1:$((BASE + 1))" \
    --initial-advertise-peer-urls="http://127.0.0.1:$((BASE + 1))" \
    --initial-cluster="bench=http://127.0.0.1:$((BASE + 1))" \
    --log-level=warn --logger=zap </dev/null >"$TMP/etcd.log" 2>&1 &
PIDS+=("$!")
deadline=$((SECONDS + 30))
until curl -s "$ETCD/health" 2>/dev/null | grep -q '"true"'; do
    ((SECONDS < deadline)) || { tail -20 "$TMP/etcd.log" >&2; die "etcd never became healthy"; }
    sleep 0.2
done
ETCD_VERSION="$(curl -s "$ETCD/version" | jq -r .etcdserver)"

# etcd's counters now: "revision puts deletes proposals".
etcd_counters() {
    local revision
    revision="$(curl -s -XPOST "$ETCD/v3/kv/range" -d '{"key":"AA=="}' | jq -r .header.revision)"
    curl -s "$ETCD/metrics" | awk -v rev="$revision" '
        $1 == "etcd_mvcc_put_total" { p = $2 } $1 == "etcd_mvcc_delete_total" { d = $2 }
        $1 == "etcd_server_proposals_committed_total" { c = $2 }
        END { printf "%d %d %d %d\n", rev, p, d, c }'
}

# ---------------------------------------------------------------- helpers (python)
# metrics.py URL... -- NAME [label=value...]: over every URL's /metrics, the sum of NAME's
# counter series whose labels match ("sum"), or for a histogram "count p50_ms p99_ms"
# (buckets summed over the URLs and interpolated, as histogram_quantile does).
cat >"$TMP/metrics.py" <<'PY'
import re, sys, urllib.request

split = sys.argv.index("--")
urls, name, want = sys.argv[1:split], sys.argv[split + 1], dict(a.split("=", 1) for a in sys.argv[split + 2:])
line = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
total, buckets, count = 0.0, {}, 0.0
for url in urls:
    for text in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        m = line.match(text)
        if not m:
            continue
        metric, labels, value = m.group(1), dict(label.findall(m.group(2) or "")), float(m.group(3))
        if any(labels.get(k) != v for k, v in want.items()):
            continue
        if metric == name:
            total += value
        elif metric == name + "_bucket":
            buckets[float(labels["le"])] = buckets.get(float(labels["le"]), 0.0) + value
        elif metric == name + "_count":
            count += value
if not buckets:
    print(int(total) if total == int(total) else total)
    sys.exit()

def quantile(q):
    if count == 0:
        return "-"
    rank, lower, below = q * count, 0.0, 0.0
    for le in sorted(buckets):
        if buckets[le] >= rank:
            if le == float("inf"):
                return f">{lower * 1000:g}"
            return f"{1000 * (lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-9)):.2f}"
        lower, below = le, buckets[le]
    return "-"

print(int(count), quantile(0.50), quantile(0.99))
PY
metric() { # name [label=value...] over the /metrics of $MURLS
    python3 "$TMP/metrics.py" "${MURLS[@]}" -- "$@"
}

# clients.py: one JSON line {"requests", "statuses", "p50_ms", "p99_ms", "rps"}.
#   cold URLS MODELS CLIENTS SECONDS: closed loop, request i to model cold_{i mod MODELS}
#     through URL i mod len(URLS).
#   open URLS RATE SECONDS SHARE MODELS: open loop at RATE/s (latency from the scheduled
#     time); a SHARE of the requests go to cold_1.. cold_{MODELS-1} in turn, the rest to
#     cold_0; the URLs in turn.
cat >"$TMP/clients.py" <<'PY'
import http.client, itertools, json, queue, sys, threading, time, urllib.parse

mode, urls = sys.argv[1], sys.argv[2].split(",")
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                              {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [4, 3, 2, 1]}]})
lock, statuses, took, samples, slow = threading.Lock(), {}, [], {}, []
began = time.monotonic()
counter = itertools.count()

class Conns(threading.local):
    def get(self, url):
        if not hasattr(self, "by_url"):
            self.by_url = {}
        if url not in self.by_url:
            self.by_url[url] = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=30)
        return self.by_url[url]

conns = Conns()

def send(url, model, since):
    status, text = 0, b""
    for attempt in range(2):
        conn = conns.get(url)
        try:
            conn.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            text = answer.read()
            status = answer.status
            break
        except TimeoutError:
            conn.close()
            conns.by_url.pop(url, None)
            status = "no answer in 30 s"
            break
        except (OSError, http.client.HTTPException):
            # A kept-alive connection the server closed: once more on a new one.
            conn.close()
            conns.by_url.pop(url, None)
            status = "connection failed"
    elapsed = time.monotonic() - since
    with lock:
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            took.append(elapsed)
        else:
            samples.setdefault(status, text.decode(errors="replace")[:300])
        if elapsed > 5 and len(slow) < 5:
            slow.append(f"{model} via {url} from {since - began:.1f}s: {elapsed:.1f}s, status {status}")

def report(seconds, late=None):
    took.sort()
    pick = lambda q: round(1000 * took[min(len(took) - 1, int(q * len(took)))], 2) if took else None
    total = sum(statuses.values())
    print(json.dumps({"requests": total, "statuses": statuses, "p50_ms": pick(0.50), "p99_ms": pick(0.99),
                      "rps": round(total / seconds, 1), "late_p99_ms": late,
                      "samples": samples, "slow": slow}))

if mode == "cold":
    models, clients, seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    deadline = time.monotonic() + seconds
    def client():
        while time.monotonic() < deadline:
            i = next(counter)
            send(urls[i % len(urls)], f"cold_{i % models}", time.monotonic())
    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for t in threads: t.start()
    for t in threads: t.join()
    report(time.monotonic() - started)
else:
    rate, seconds, share, models = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    jobs, lags = queue.Queue(), []
    def worker():
        while (job := jobs.get()) is not None:
            lags.append(time.monotonic() - job[2])
            send(*job)
    workers = [threading.Thread(target=worker) for _ in range(64)]
    for w in workers: w.start()
    start, n, cold, owed = time.monotonic(), int(rate * seconds), 0, 0.0
    for i in range(n):
        at = start + i / rate
        pause = at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        owed += share
        if owed >= 1 and models > 1:
            owed -= 1
            model, cold = f"cold_{1 + cold % (models - 1)}", cold + 1
        else:
            model = "cold_0"
        jobs.put((urls[i % len(urls)], model, at))
    for w in workers: jobs.put(None)
    for w in workers: w.join()
    lags.sort()
    report(time.monotonic() - start, round(1000 * lags[int(0.99 * len(lags))], 1) if lags else None)
PY

# ---------------------------------------------------------------- configs
gateway_config() { # out http_port cluster(off|warm|cold-REPLICA) [extra toml...]
    local out="$1" port="$2" cluster="$3"
    shift 3
    {
        listen_table "$port" http metrics admin
        if [[ "$cluster" != off ]]; then
            printf '[cluster]\netcd = ["%s"]\nprefix = "/infergate/%s"\nreplica = "%s"\n\n' \
                "$ETCD" "${cluster%%-*}" "${cluster#*-}"
        fi
        printf '%s\n' "$@"
    } >"$out"
}
wait_ready() { # name port
    wait_http "http://127.0.0.1:$2/v2/health/ready" 30 || { tail -20 "$TMP/$1.log" >&2; die "$1 never became ready"; }
}

# ================================================================ 1. warm hits
"$BIN/fake-triton" --listen "127.0.0.1:$WARM_FAKE" --threads "$BACKEND_THREADS" >"$TMP/fake-warm.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$WARM_FAKE/v2/health/ready" 10 || die "fake-triton never became ready"
WARM_BACKEND=$'[[backends]]\nname = "fake"\nhttp = "http://127.0.0.1:'"$WARM_FAKE"$'"'
gateway_config "$TMP/warm-off.toml" "$GW_OFF" off "$WARM_BACKEND"
gateway_config "$TMP/warm-on.toml" "$GW_A" warm-gw-warm "$WARM_BACKEND"
start_infergate warm-off "$TMP/warm-off.toml"
start_infergate warm-on "$TMP/warm-on.toml"
wait_ready warm-off "$GW_OFF"
wait_ready warm-on "$GW_A"
wait_placement warm-off $((GW_OFF + 3)) add_sub
wait_placement warm-on $((GW_A + 3)) add_sub

LOAD_ARGS=(-i INPUT0:FP32:4 -i INPUT1:FP32:4 --check --threads "$LOAD_THREADS"
    --warmup "$WARMUP" --duration "$WINDOW" --windows "$WINDOWS" --json -q)
declare -A WARM_PORT=([off]=$GW_OFF [on]=$GW_A)
WARM_ETCD_BEFORE="$(etcd_counters)"
WARM_T0=$SECONDS
for ((round = 1; round <= ROUNDS; round++)); do
    order=(off on)
    ((round % 2)) || order=(on off)
    for c in "${LEVELS[@]}"; do
        for stage in "${order[@]}"; do
            load_step "$TMP/warm-$stage-c$c-r$round.json" "warm $stage c=$c round $round" \
                "http://127.0.0.1:${WARM_PORT[$stage]}" "$c" "" "${PID[warm-$stage]}"
        done
    done
done
WARM_SECONDS=$((SECONDS - WARM_T0))
WARM_ETCD_AFTER="$(etcd_counters)"
stop_pids "${PID[warm-off]}" "${PID[warm-on]}"

# Medians over the rounds of one stage at one level: "rps p50 p99 cpu".
warm_figures() { # stage c
    local f rps=() p50=() p99=() cpu=()
    for f in "$TMP/warm-$1-c$2-r"*.json; do
        rps+=("$(jq '.steps[0].throughput_rps' "$f")")
        p50+=("$(jq '.steps[0].latency_us.p50' "$f")")
        p99+=("$(jq '.steps[0].latency_us.p99' "$f")")
        cpu+=("$(cut -d' ' -f1 "$f.cpu")")
    done
    printf '%s %s %s %s\n' "$(printf '%s\n' "${rps[@]}" | median)" "$(printf '%s\n' "${p50[@]}" | median)" \
        "$(printf '%s\n' "${p99[@]}" | median)" "$(printf '%s\n' "${cpu[@]}" | median)"
}
WARM_ROWS=()
for c in "${LEVELS[@]}"; do
    read -r off_rps off_p50 off_p99 off_cpu <<<"$(warm_figures off "$c")"
    read -r on_rps on_p50 on_p99 on_cpu <<<"$(warm_figures on "$c")"
    WARM_ROWS+=("| $c | $(calc '%.0f' "$off_rps") / $(calc '%.0f' "$on_rps") | $(ratio "$on_rps" "$off_rps") | $off_p50 / $on_p50 | $off_p99 / $on_p99 | $off_cpu / $on_cpu | $(ratio "$on_cpu" "$off_cpu") |")
done
read -r r0 p0 d0 c0 <<<"$WARM_ETCD_BEFORE"
read -r r1 p1 d1 c1 <<<"$WARM_ETCD_AFTER"
WARM_ETCD="etcd meanwhile (one replica, ${WARM_SECONDS} s): $((r1 - r0)) revisions, $((p1 - p0)) puts, $((d1 - d0)) deletes, $((c1 - c0)) proposals ($(calc '%.2f' "($r1 - $r0) / $WARM_SECONDS") revisions/s)"
say "$WARM_ETCD"

# ================================================================ 2. cold misses
COLD_MODELS=()
for ((i = 0; i < MODELS; i++)); do COLD_MODELS+=(--model "cold_$i"); done
for port in "${COLD_FAKES[@]}"; do
    "$BIN/fake-triton" --listen "127.0.0.1:$port" --threads "$BACKEND_THREADS" --unloaded \
        --load-delay "$LOAD_DELAY" "${COLD_MODELS[@]}" >"$TMP/fake-$port.log" 2>&1 &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$port/v2/health/ready" 10 || die "fake-triton :$port never became ready"
done
COLD_TOML=("[placement]" 'mem_buffer = "0"' 'min_churn_age = "0s"' 'scale_up_rps = 0.0' 'scale_up_queue = 0' "")
for i in 0 1; do
    COLD_TOML+=("[[backends]]" "name = \"fake$i\"" "http = \"http://127.0.0.1:${COLD_FAKES[$i]}\"" "capacity = \"$((SLOTS * 100 + 50))MiB\"" "")
done
for ((i = 0; i < MODELS; i++)); do COLD_TOML+=("[[models]]" "name = \"cold_$i\"" 'size = "100MiB"'); done
unload_all() { # leave both cold fakes empty
    local port i
    for port in "${COLD_FAKES[@]}"; do
        for ((i = 0; i < MODELS; i++)); do curl -s -o /dev/null -XPOST "127.0.0.1:$port/v2/repository/models/cold_$i/unload"; done
    done
}

# cold_run SLUG NAME URLS METRICS_URLS...: the cold clients, then the figures; sets COLD_ROW.
cold_run() {
    local slug="$1" name="$2" urls="$3" r="$TMP/cold-$1.json" loads
    shift 3
    MURLS=("$@")
    say "$name: $COLD_CLIENTS clients over $MODELS models (${SLOTS} fit per backend), ${COLD_DURATION}s"
    python3 "$TMP/clients.py" cold "$urls" "$MODELS" "$COLD_CLIENTS" "$COLD_DURATION" >"$r"
    loads="$(metric infergate_placement_loads_total result=success)"
    COLD_ROW="| $name | $(jq .requests "$r") ($(jq .rps "$r")/s) | $(jq -r '.statuses | to_entries | map("\(.key): \(.value)") | join(", ")' "$r") | $loads ($(ratio "$loads" "$(jq .requests "$r")")) | $(jq -r '"\(.p50_ms) / \(.p99_ms)"' "$r") |"
    say "$COLD_ROW"
}

gateway_config "$TMP/cold-off.toml" "$GW_OFF" off "${COLD_TOML[@]}"
start_infergate cold-off "$TMP/cold-off.toml"
wait_ready cold-off "$GW_OFF"
cold_run off "one gateway, no \`[cluster]\`" "http://127.0.0.1:$GW_OFF" "http://127.0.0.1:$((GW_OFF + 2))/metrics"
COLD_ROWS=("$COLD_ROW")
keep_metrics cold-off $((GW_OFF + 2))
stop_pids "${PID[cold-off]}"
unload_all

gateway_config "$TMP/cold-a.toml" "$GW_A" cold-gw-a "${COLD_TOML[@]}"
gateway_config "$TMP/cold-b.toml" "$GW_B" cold-gw-b "${COLD_TOML[@]}"
start_infergate cold-a "$TMP/cold-a.toml"
start_infergate cold-b "$TMP/cold-b.toml"
wait_ready cold-a "$GW_A"
wait_ready cold-b "$GW_B"
REPLICA_URLS="http://127.0.0.1:$GW_A,http://127.0.0.1:$GW_B"
REPLICA_METRICS=("http://127.0.0.1:$((GW_A + 2))/metrics" "http://127.0.0.1:$((GW_B + 2))/metrics")
COLD_ETCD_BEFORE="$(etcd_counters)"
cold_run on "two replicas, \`[cluster]\`" "$REPLICA_URLS" "${REPLICA_METRICS[@]}"
COLD_ETCD_AFTER="$(etcd_counters)"
COLD_ROWS+=("$COLD_ROW")
MURLS=("${REPLICA_METRICS[@]}")
AGREE_ROWS=()
for result in agreed lost unreachable; do
    read -r n p50 p99 <<<"$(metric infergate_placement_agree_duration_seconds result="$result")"
    [[ "$n" == 0 ]] || AGREE_ROWS+=("| agree, \`$result\` | $n | $p50 / $p99 |")
done
for op in txn get put; do
    read -r n p50 p99 <<<"$(metric infergate_cluster_etcd_duration_seconds op="$op")"
    [[ "$n" == 0 ]] || AGREE_ROWS+=("| etcd round trip, \`$op\` | $n | $p50 / $p99 |")
done
CONFLICTS="$(for key in placement settle; do printf '%s %s; ' "$key" "$(metric infergate_cluster_conflicts_total key="$key")"; done)"
read -r r0 p0 d0 c0 <<<"$COLD_ETCD_BEFORE"
read -r r1 p1 d1 c1 <<<"$COLD_ETCD_AFTER"
COLD_REQUESTS="$(jq .requests "$TMP/cold-on.json")"
COLD_ETCD="etcd meanwhile: $((r1 - r0)) revisions ($(calc '%.1f' "($r1 - $r0) / $COLD_DURATION")/s, $(ratio $((r1 - r0)) "$COLD_REQUESTS") per request), $((p1 - p0)) puts, $((d1 - d0)) deletes, $((c1 - c0)) proposals"
say "$COLD_ETCD"

# ================================================================ 3. etcd writes at a rate
# Churning first, on step 2's replicas (min_churn_age 0s): a share of the requests go to
# the other models. Then warm, on the two replicas started again with the default
# min_churn_age (60s: every copy used within it is marked in use): cold_0 only.
ANSWER_SAMPLES=()
rate_row() { # kind rate share label
    local kind="$1" rate="$2" share="$3" label="$4" f="$TMP/rate-$1-$2.json" n t0 span loads0 loads1
    loads0="$(metric infergate_placement_loads_total result=success)"
    read -r r0 p0 d0 c0 <<<"$(etcd_counters)"
    t0="$(date +%s.%N)"
    python3 "$TMP/clients.py" open "$REPLICA_URLS" "$rate" "$RATE_DURATION" "$share" "$MODELS" >"$f"
    read -r r1 p1 d1 c1 <<<"$(etcd_counters)"
    span="$(calc '%.2f' "$(date +%s.%N) - $t0")"
    loads1="$(metric infergate_placement_loads_total result=success)"
    n="$(jq .requests "$f")"
    RATE_ROWS+=("| $rate | $label | $n ($(jq -r '"\(.rps)/s, lag p99 \(.late_p99_ms) ms"' "$f")) | $(jq -r '.statuses | to_entries | map("\(.key): \(.value)") | join(", ")' "$f") | $(jq -r '"\(.p50_ms) / \(.p99_ms)"' "$f") | $((loads1 - loads0)) | $((r1 - r0)) ($(calc '%.1f' "($r1 - $r0) / $span")/s) | $(calc '%.4f' "($r1 - $r0) / $n") | $((p1 - p0)) / $((d1 - d0)) | $((c1 - c0)) ($(calc '%.1f' "($c1 - $c0) / $span")/s) |")
    say "${RATE_ROWS[-1]}"
    collect_samples "$f" "$rate/s $kind"
}
collect_samples() { # json label: the first answer of each status other than 200
    local line
    while IFS= read -r line; do ANSWER_SAMPLES+=("- $2: $line"); done < <(jq -r '(.samples | to_entries[] | "\(.key) `\(.value | gsub("\n"; " "))`"), (.slow[] | "slower than 5 s: \(.)")' "$1")
}
collect_samples "$TMP/cold-on.json" "cold, two replicas"
collect_samples "$TMP/cold-off.json" "cold, one gateway"
first_infer() { # port model
    curl -s -o /dev/null -H 'content-type: application/json' \
        -d '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[4,3,2,1]}]}' \
        "http://127.0.0.1:$1/v2/models/$2/infer"
}
RATE_ROWS=()
first_infer "$GW_A" cold_0
sleep 1
for rate in "${RATES[@]}"; do
    rate_row churn "$rate" "$CHURN_SHARE" "churning: $(calc '%.0f' "100 * $CHURN_SHARE")% to the other models (\`min_churn_age = \"0s\"\`)"
done
keep_metrics cold-a $((GW_A + 2))
keep_metrics cold-b $((GW_B + 2))
stop_pids "${PID[cold-a]}" "${PID[cold-b]}"
WARM_TOML=()
for line in "${COLD_TOML[@]}"; do [[ "$line" == min_churn_age* ]] || WARM_TOML+=("$line"); done
gateway_config "$TMP/rate-a.toml" "$GW_A" rate-gw-a "${WARM_TOML[@]}"
gateway_config "$TMP/rate-b.toml" "$GW_B" rate-gw-b "${WARM_TOML[@]}"
start_infergate rate-a "$TMP/rate-a.toml"
start_infergate rate-b "$TMP/rate-b.toml"
wait_ready rate-a "$GW_A"
wait_ready rate-b "$GW_B"
first_infer "$GW_A" cold_0
sleep 2
for rate in "${RATES[@]}"; do
    rate_row warm "$rate" 0 "warm: one model (default \`min_churn_age\`)"
done
keep_metrics rate-a $((GW_A + 2))
keep_metrics rate-b $((GW_B + 2))
LOAD_AFTER="$(loadavg)"

# ---------------------------------------------------------------- report
mkdir -p "$(dirname "$OUT")"
{
    echo "# Replicas through etcd: what \`[cluster]\` costs ($DATE, $SHA)"
    echo
    echo "\`loadtest/cluster.sh\`: release infergate over fake-triton (\`--threads $BACKEND_THREADS\`), real etcd $ETCD_VERSION (one member, loopback, data in a temp dir)."
    echo
    echo "## 1. Warm hits, without / with \`[cluster]\`"
    echo
    echo "One fake-triton serving add_sub (loaded) behind two gateways with the default config, the second with \`[cluster]\` on the etcd (one replica). infergate-load (\`--threads $LOAD_THREADS\`, JSON, \`--check\`) closed loop, warm-up $WARMUP, $WINDOWS × $WINDOW windows; the gateways take turns, $ROUNDS rounds, medians. CPU is the gateway's (user + system, /proc/PID/stat) per request."
    echo
    echo "| concurrency | infer/s off / on | ratio on/off | p50 µs off / on | p99 µs off / on | gateway CPU µs/request off / on | CPU ratio on/off |"
    echo "|--:|--:|--:|--:|--:|--:|--:|"
    printf '%s\n' "${WARM_ROWS[@]}"
    echo
    echo "$WARM_ETCD."
    echo
    echo "## 2. Cold misses"
    echo
    echo "$MODELS models over two fake-tritons started empty (\`--unloaded\`, a load takes $LOAD_DELAY) that hold $SLOTS models each (\`[[models]] size = \"100MiB\"\`, \`capacity = \"$((SLOTS * 100 + 50))MiB\"\`, \`mem_buffer = \"0\"\`, \`min_churn_age = \"0s\"\`, no scale-up). $COLD_CLIENTS python clients (one request after another) ask for the models in turn, request i for model i mod $MODELS through replica i mod 2, for ${COLD_DURATION} s: nearly every request is a cold miss that evicts. End to end (the load's $LOAD_DELAY included):"
    echo
    echo "| gateways | requests | answers | loads (per request) | p50 / p99 ms |"
    echo "|---|--:|---|--:|--:|"
    printf '%s\n' "${COLD_ROWS[@]}"
    echo
    echo "The replicas' own timings (both replicas' /metrics, p50 / p99 interpolated within the buckets):"
    echo
    echo "| what | count | p50 / p99 ms |"
    echo "|---|--:|--:|"
    printf '%s\n' "${AGREE_ROWS[@]}"
    echo
    echo "Conflicts (\`infergate_cluster_conflicts_total\`): ${CONFLICTS% }. $COLD_ETCD."
    echo
    echo "## 3. etcd writes at a fixed rate"
    echo
    echo "Two replicas, python open loop (latency from the scheduled send time, 64 client threads) spread over both, ${RATE_DURATION} s per row. Churning: step 2's replicas, that share of the requests go to the $((MODELS - 1)) other models in turn; warm: the replicas started again with the default \`min_churn_age\` (60 s, so every copy used within it is marked in use), every request for one model (loaded first). etcd's counters before and after: revisions (write transactions that changed a key), \`etcd_mvcc_put_total\` / \`etcd_mvcc_delete_total\`, and \`etcd_server_proposals_committed_total\` (every raft entry: failed compare-and-sets, lease grants and revokes too; not lease keep-alives)."
    echo
    echo "| rate/s | traffic | requests (achieved, send lag) | answers | p50 / p99 ms | loads | etcd revisions | revisions per request | puts / deletes | raft proposals |"
    echo "|--:|---|--:|---|--:|--:|--:|--:|--:|--:|"
    printf '%s\n' "${RATE_ROWS[@]}"
    echo
    echo "Answers other than 200 (the first of each status):"
    echo
    printf '%s\n' "${ANSWER_SAMPLES[@]:-"- none"}"
    echo
    echo "Machine: $CPU_MODEL, $NPROC cores, $MEM, $KERNEL; load average $LOAD_BEFORE before, $LOAD_AFTER after; binaries $BIN ($DIRTY uncommitted files). $((SECONDS - STARTED)) s in all."
} >"$OUT"
cat "$OUT"
