#!/usr/bin/env bash
# The main job on a fresh machine: install real Triton (scripts/setup.sh), start two Triton
# instances over the example model repository, start the gateway with config/gateway.toml,
# and send a sample inference through it. The gateway then keeps serving on 127.0.0.1:8000
# until Ctrl-C; `scripts/demo.sh --once` stops everything after the sample instead.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
once=false
[[ "${1:-}" == "--once" ]] && once=true

scripts/setup.sh
echo "== building infergate (release)"
cargo build --release -p infergate 2>&1 | tail -n 1

gateway_pid=""
cleanup() {
    [[ -n "$gateway_pid" ]] && kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" 2>/dev/null
    scripts/triton.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

echo "== starting two Triton instances (http 19000 and 19010)"
scripts/triton.sh start 2 19000 --load-model=add_sub --load-model=string_echo --load-model=batched_double

echo "== starting infergate (config/gateway.toml)"
mkdir -p target
target/release/infergate --config config/gateway.toml >target/infergate-demo.log 2>&1 &
gateway_pid=$!
for _ in $(seq 1 100); do
    if curl -sf -o /dev/null http://127.0.0.1:8000/v2/health/ready; then break; fi
    sleep 0.1
done
curl -sf -o /dev/null http://127.0.0.1:8000/v2/health/ready || {
    cat target/infergate-demo.log >&2
    echo "gateway did not become ready" >&2
    exit 1
}

echo "== sample inference through the gateway: add_sub([1,2,3,4], [10,20,30,40])"
curl -sS -i http://127.0.0.1:8000/v2/models/add_sub/infer \
    -H 'content-type: application/json' -H 'x-request-id: demo-1' \
    -d '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},
                   {"name":"INPUT1","datatype":"FP32","shape":[4],"data":[10,20,30,40]}]}'
echo
echo "== the same with the official Python tritonclient"
.venv/bin/python - <<'PY'
import numpy as np
import tritonclient.http as httpclient
client = httpclient.InferenceServerClient("127.0.0.1:8000")
a = np.array([1, 2, 3, 4], dtype=np.float32)
b = np.array([10, 20, 30, 40], dtype=np.float32)
inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
inputs[0].set_data_from_numpy(a, binary_data=True)
inputs[1].set_data_from_numpy(b, binary_data=True)
result = client.infer("add_sub", inputs)
print("OUTPUT0 =", result.as_numpy("OUTPUT0"), " OUTPUT1 =", result.as_numpy("OUTPUT1"))
PY
echo "== backends as the gateway sees them (GET :8003/admin/backends)"
curl -sS http://127.0.0.1:8003/admin/backends; echo
tail -n 3 target/infergate-demo.log

if ! $once; then
    echo "== infergate is serving on http://127.0.0.1:8000 (metrics :8002, admin :8003); Ctrl-C stops it"
    wait "$gateway_pid"
fi
