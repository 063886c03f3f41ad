#!/usr/bin/env bash
# loadtest/moves.sh — how many bytes the gateway moves per request, and where: a census of
# every call to libc's memmove/memcpy (a uprobe reading its length argument) while a fixed
# number of infer requests passes, for one or more builds.
#
#   loadtest/moves.sh GATEWAY_BINARY [GATEWAY_BINARY...]
#
# Why: `memmove` is the largest user-space item of the time profile (profile.sh: ~4% of the
# gateway's CPU at 10k req/s), and callgrind cannot say how many bytes a call moved. Rust moves
# a value by copying it: a request (`http::Request`, 240 bytes) passed by value through async
# layers is copied into each layer's state. This counts the calls and the bytes per request,
# by size, and (MOVES_CALLERS) names the functions that make the calls of the sizes asked for;
# the count is deterministic within a few percent, where CPU time is not on a shared machine.
#
# Each binary runs alone, validation off (compare.sh's ig-off; MOVES_STAGE=ig-val for validation
# on), 2 workers, access log on, over one fake-triton. After a warm-up, `perf record` of the
# uprobe attached to the gateway while h2load sends MOVES_REQUESTS requests (c=16); per request
# = the calls the probe saw ÷ requests (idle work in the window included: health checks).
# Needs root (uprobes), perf and the libc's symbols.
#
# Knobs (environment):
#   MOVES_BIN=target/release   fake-triton      MOVES_REQUESTS=5000   MOVES_STAGE=ig-off
#   MOVES_CALLERS="240 224"    sizes whose callers to list (DWARF call chains; slower)
#   MOVES_BASE_PORT=33900      MOVES_OUT=path.md (default: stdout only)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
(($# > 0)) || { echo "usage: loadtest/moves.sh GATEWAY_BINARY [GATEWAY_BINARY...]" >&2; exit 2; }
BIN="$(realpath "${MOVES_BIN:-$ROOT/target/release}")"
REQUESTS="${MOVES_REQUESTS:-5000}"
STAGE="${MOVES_STAGE:-ig-off}"
read -r -a CALLERS <<<"${MOVES_CALLERS:-}"
BASE="${MOVES_BASE_PORT:-33900}"
OUT="${MOVES_OUT:-}"
WORKERS=2 ACCESS_LOG=on BUILD=0 STARTED=$SECONDS
# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh

[[ -x "$BIN/fake-triton" ]] || die "no $BIN/fake-triton: cargo build --release -p infergate-load"
[[ "$(id -u)" == 0 ]] || die "uprobes need root"
require curl python3
ensure_debian h2load:nghttp2-client perf:linux-perf
[[ "$STAGE" == ig-off || "$STAGE" == ig-val ]] || die "MOVES_STAGE is ig-off or ig-val"
check_ports "$BASE" $((BASE + 1))

# The memmove every Rust copy calls: glibc's ifunc picks one implementation for this CPU; the
# probe goes on each vector variant this libc has (memcpy is the same code as memmove).
LIBC="$(ldd "$(realpath "$1")" | awk '/libc\.so/ { print $3 }')"
PROBES=()
for variant in __memmove_evex_unaligned_erms __memmove_avx_unaligned_erms __memmove_avx512_unaligned_erms \
    __memmove_sse2_unaligned_erms; do
    name="ig_moves_${variant//_/}"
    perf probe -q -d "probe_libc:$name" 2>/dev/null || true
    if perf probe -q -x "$LIBC" -a "$name=$variant len=%dx:u64" 2>/dev/null; then PROBES+=("probe_libc:$name"); fi
done
((${#PROBES[@]})) || die "no memmove probe could be placed in $LIBC"
cleanup_probes() { local p; for p in "${PROBES[@]}"; do perf probe -q -d "$p" 2>/dev/null || true; done; }
trap 'cleanup_probes; cleanup' EXIT
EVENTS="$(IFS=,; echo "${PROBES[*]}")"

printf '%s' "$INFER_BODY" >"$TMP/body.json"
taskset -c 0 "$BIN/fake-triton" --listen "127.0.0.1:$BASE" --threads 1 >"$TMP/fake.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$BASE/v2/health/ready" || die "fake-triton did not start"
URL="http://127.0.0.1:$((BASE + 1))/v2/models/add_sub/infer"
load() { timeout 120 h2load --h1 -t 1 -c 16 -n "$1" -H 'content-type: application/json' -d "$TMP/body.json" "$URL" |
    h2load_ok; }

# census BINARY — one run; appends its section to $TMP/report.md.
census() {
    local binary name="$(basename "$1")" ok
    binary="$(realpath "$1")"
    fake_gateway_config $((BASE + 1)) "$(stage_on "$STAGE")" "" "$BASE" >"$TMP/$name.toml"
    start_infergate "$name" "$TMP/$name.toml" "$binary"
    wait_http "http://127.0.0.1:$((BASE + 1))/v2/health/ready" 120 || die "$name did not start"
    wait_infer "http://127.0.0.1:$((BASE + 1))" add_sub 120 || die "$name never answered an inference"
    load 2000 >/dev/null
    timeout 300 perf record -q -e "$EVENTS" -p "${PID[$name]}" -o "$TMP/$name.data" >/dev/null 2>&1 &
    local recorder=$!
    sleep 1
    ok="$(load "$REQUESTS")"
    sleep 0.5
    kill -INT "$recorder"
    wait "$recorder" || true
    perf script -i "$TMP/$name.data" -F trace 2>/dev/null | sed -n 's/.*len=\(0x[0-9a-f]*\|[0-9]*\).*/\1/p' >"$TMP/$name.lens"
    if ((${#CALLERS[@]})); then
        local filter
        filter="$(printf 'len == %s || ' "${CALLERS[@]}" | sed 's/ || $//')"
        timeout 300 perf record -q -e "$EVENTS" --filter "$filter" --call-graph dwarf,16384 -p "${PID[$name]}" \
            -o "$TMP/$name.callers.data" >/dev/null 2>&1 &
        recorder=$!
        sleep 1
        load 1000 >/dev/null
        sleep 0.5
        kill -INT "$recorder"
        wait "$recorder" || true
        perf script -i "$TMP/$name.callers.data" -F trace,ip,sym 2>/dev/null >"$TMP/$name.callers"
    fi
    stop_pids "${PID[$name]}"
    python3 - "$name" "$ok" "$TMP/$name.lens" "$TMP/$name.callers" "${CALLERS[@]}" >>"$TMP/report.md" <<'EOF'
import collections, os, sys
name, ok, lens_file, callers_file, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
lens = [int(x, 0) for x in open(lens_file).read().split()]
print(f"## {name}: {ok} requests\n")
print(f"**{len(lens) / ok:.1f} calls and {sum(lens) / ok:,.0f} bytes a request.**\n")
print("| size | calls a request | bytes a request |\n|---|--:|--:|")
calls, moved = collections.Counter(), collections.Counter()
for n in lens:
    bucket = 0 if n == 0 else 1 << (n.bit_length() - 1)
    calls[bucket] += 1
    moved[bucket] += n
for b in sorted(calls):
    label = "0" if b == 0 else f"{b}–{2 * b - 1}"
    print(f"| {label} | {calls[b] / ok:.2f} | {moved[b] / ok:,.0f} |")
print("\nThe most frequent sizes (bytes: calls a request): " + ", ".join(
    f"{n}: {c / ok:.2f}" for n, c in collections.Counter(lens).most_common(12)) + "\n")
if sizes and os.path.exists(callers_file):
    # The caller of each call: the frame above memmove (inlined frames named as perf names them).
    sites, size, frames = collections.Counter(), None, []
    def flush():
        if size is not None and len(frames) > 1:
            sites[(size, frames[1])] += 1
    for line in open(callers_file):
        line = line.rstrip()
        if "len=" in line:
            flush()
            size, frames = int(line.split("len=")[1].split()[0], 0), []
        elif line.strip():
            parts = line.split(None, 1)
            if len(parts) == 2:
                frames.append(parts[1][:140])
    flush()
    print("Who makes the calls of " + ", ".join(sizes) + " bytes (per request of the 1000 sent with call chains):\n")
    print("| size | calls a request | caller |\n|--:|--:|---|")
    for (n, caller), c in sites.most_common(25):
        print(f"| {n} | {c / 1000:.2f} | `{caller}` |")
    print()
EOF
}

for binary in "$@"; do census "$binary"; done
{
    echo "# Bytes moved per request (memmove census), $(date +%F)"
    echo
    echo "\`loadtest/moves.sh\` in $((SECONDS - STARTED)) s: a uprobe on libc's memmove ($(basename "$LIBC")) counts every call and its length while \`h2load -n $REQUESTS -c 16\` sends lib.sh's INFER_BODY to the gateway ($STAGE, 2 workers, access log on) over fake-triton; per request = calls seen ÷ requests answered. Load average $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    cat "$TMP/report.md"
} | if [[ -n "$OUT" ]]; then tee "$OUT"; else cat; fi
