#!/usr/bin/env bash
# The main job on a fresh machine: install real Triton (scripts/setup.sh), start two empty
# Triton instances over the example model repository (explicit model control, Triton's
# default flags: nothing is loaded), start the gateway with config/gateway.toml, and show
# placement at work: the first request for a model waits while the gateway loads it on a
# backend of its choice, the second is served warm, and `GET /admin/placement` shows the
# books. The gateway then keeps serving on 127.0.0.1:8000 until Ctrl-C; `scripts/demo.sh
# --once` stops everything after the sample instead.
#
# Environment (for tests; the defaults are the quick start's): INFERGATE_BIN (a built
# infergate; default: build the release binary), DEMO_CONFIG (default config/gateway.toml),
# DEMO_TRITON_PORT (the first Triton's HTTP port, as in the config; default 19000),
# DEMO_HTTP and DEMO_ADMIN (the gateway's listeners, as in the config; default
# 127.0.0.1:8000 and 127.0.0.1:8003).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
once=false
[[ "${1:-}" == "--once" ]] && once=true
config="${DEMO_CONFIG:-config/gateway.toml}"
triton_port="${DEMO_TRITON_PORT:-19000}"
http="${DEMO_HTTP:-127.0.0.1:8000}"
admin="${DEMO_ADMIN:-127.0.0.1:8003}"

scripts/setup.sh
if [[ -n "${INFERGATE_BIN:-}" ]]; then
    bin="$INFERGATE_BIN"
else
    echo "== building infergate (release)"
    cargo build --release -p infergate 2>&1 | tail -n 1
    bin=target/release/infergate
fi

gateway_pid=""
cleanup() {
    [[ -n "$gateway_pid" ]] && kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" 2>/dev/null
    scripts/triton.sh stop 2 "$triton_port" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

echo "== starting two empty Triton instances (http $triton_port and $((triton_port + 10)); explicit model control, nothing loaded)"
scripts/triton.sh start 2 "$triton_port"

echo "== starting infergate ($config)"
mkdir -p target
log=target/infergate-demo.log
"$bin" --config "$config" >"$log" 2>&1 &
gateway_pid=$!
for _ in $(seq 1 100); do
    if curl -sf -o /dev/null "http://$http/v2/health/ready"; then break; fi
    sleep 0.1
done
curl -sf -o /dev/null "http://$http/v2/health/ready" || {
    cat "$log" >&2
    echo "gateway did not become ready" >&2
    exit 1
}

# One inference of add_sub([1,2,3,4], [10,20,30,40]); prints the status and the time it took.
infer() {
    curl -sS -o target/demo-answer.json -w '%{http_code} %{time_total}' \
        "http://$http/v2/models/add_sub/infer" \
        -H 'content-type: application/json' -H "x-request-id: $1" \
        -d '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},
                       {"name":"INPUT1","datatype":"FP32","shape":[4],"data":[10,20,30,40]}]}'
}
ms() { awk '{ printf "%d", $2 * 1000 }' <<<"$1"; }

echo "== first request for add_sub: no backend has it, so the gateway loads it and the request waits"
cold="$(infer demo-cold)"
echo "   HTTP ${cold%% *} after $(ms "$cold") ms (cold: the load included)"
# The gateway's own log says where the load went and how long it took (the log is written
# from a background thread: give it a moment).
for _ in $(seq 1 30); do grep -q 'model loaded' "$log" && break; sleep 0.1; done
grep -m1 'model loaded' "$log" |
    sed -E 's/.*model="?([^" ]+)"? backend=([^ ]+).*load_ms=([0-9]+).*/   placed: \1 loaded on \2 in \3 ms (gateway log: "model loaded")/' || true
echo "   answer: $(cat target/demo-answer.json)"
echo "== second request for add_sub: the copy is loaded, the request is served warm"
warm="$(infer demo-warm)"
echo "   HTTP ${warm%% *} after $(ms "$warm") ms"
echo "== a third time with the official Python tritonclient (binary tensors), warm too"
.venv/bin/python - "$http" <<'PY'
import sys
import time

import numpy as np
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient(sys.argv[1])
a = np.array([1, 2, 3, 4], dtype=np.float32)
b = np.array([10, 20, 30, 40], dtype=np.float32)
inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
inputs[0].set_data_from_numpy(a, binary_data=True)
inputs[1].set_data_from_numpy(b, binary_data=True)
started = time.monotonic()
result = client.infer("add_sub", inputs)
took = (time.monotonic() - started) * 1000
print(f"   OUTPUT0 = {result.as_numpy('OUTPUT0')}  OUTPUT1 = {result.as_numpy('OUTPUT1')}  ({took:.0f} ms)")
PY
echo "== the books after: GET http://$admin/admin/placement"
curl -sS "http://$admin/admin/placement" | .venv/bin/python -m json.tool

if ! $once; then
    echo "== infergate is serving on http://$http (admin $admin); Ctrl-C stops it"
    wait "$gateway_pid"
fi
