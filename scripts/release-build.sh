#!/usr/bin/env bash
# scripts/release-build.sh — the gateway's release binary as it ships: optimised with a profile
# of its own request path (profile-guided optimisation, PGO), on top of the release profile's
# LTO. The Docker image is built with it, and the performance figures are measured on it.
#
#   scripts/release-build.sh            # writes target/pgo/release/infergate
#
# Why: with LTO alone, rustc's inliner guesses which of the many small generic calls of a
# request (hyper, http, tokio, the pipeline) to inline, and lays hot and cold code side by
# side. A profile tells it: the request path then runs 25% fewer instructions over HTTP
# (49.8k -> 37.2k a request, validation off) and 19% fewer over gRPC, and misses the L1
# instruction cache 38% less often; CPU per request at 10k req/s, validation on, fell 14-18% in two A/B runs
# beside nginx (loadtest/results/2026-12-07-5c832df-pgo-*.md).
#
# Steps:
#   1. fake-triton and infergate-load, the training's backend and load (without LTO), in
#      target/pgo-tools;
#   2. infergate built instrumented (`-Cprofile-generate`), in target/pgo-generate;
#   3. the training: that binary in front of fake-triton, on loopback ports (PGO_BASE_PORT),
#      through the requests users send most: KServe v2 inference over HTTP (JSON, and binary
#      tensors) and gRPC, with validation off, on, and everything on (RS256 JWT, a 90/10
#      route with a guard), after the metadata, readiness and config calls clients make
#      first; then stopped with SIGTERM so that it writes its profile;
#   4. the profile merged by `llvm-profdata` (rustup's llvm-tools component, added when missing);
#   5. infergate built with the profile (`-Cprofile-use`), in target/pgo.
# Code the training does not reach (OpenAI, admin, streams, errors) is compiled as code seldom
# run. Trained on HTTP alone, gRPC ran 11% more instructions than without a profile: each
# front-end must be in the training (loadtest/results/2026-12-07-5c832df-pgo-*.md).
# Without llvm-profdata (no rustup, or offline) the script says so and fails: build the plain
# binary with `cargo build --release -p infergate` then.
#
# Knobs: PGO_TRAIN_SECONDS=4 (each load of the training), PGO_BASE_PORT=29700.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BIN=target/pgo-tools/release WORKERS=2 ACCESS_LOG=on BUILD=0 STARTED=$SECONDS
# shellcheck source=../loadtest/lib.sh
source loadtest/lib.sh
require cargo curl openssl
SECONDS_EACH="${PGO_TRAIN_SECONDS:-4}"
BASE="${PGO_BASE_PORT:-29700}"
check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 3)) # two fakes, the gateway's HTTP and gRPC
TOOLS="$ROOT/target/pgo-tools" GENERATE="$ROOT/target/pgo-generate" USE="$ROOT/target/pgo"
# Inside the instrumented build's directory: the path is in its RUSTFLAGS, so a path that
# changed from run to run would rebuild it every time.
PROFILES="$GENERATE/profiles"
export CARGO_INCREMENTAL=0

host="$(rustc -vV | awk '/^host:/ { print $2 }')"
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [[ ! -x "$profdata" ]]; then
    say "adding rustup's llvm-tools component (for llvm-profdata)"
    rustup component add llvm-tools >"$TMP/rustup.log" 2>&1 || true
fi
[[ -x "$profdata" ]] || die "no llvm-profdata ($profdata): this needs rustup's llvm-tools component"

say "1/5 building fake-triton and infergate-load"
# Tools of the training only: without LTO, in a third of the time.
CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_TARGET_DIR="$TOOLS" \
    cargo_release tools -p infergate-load --bins
say "2/5 building infergate instrumented (target/pgo-generate)"
RUSTFLAGS="-Cprofile-generate=$PROFILES" CARGO_TARGET_DIR="$GENERATE" \
    cargo_release instrumented -p infergate --bin infergate

# train ON NAME — the instrumented gateway (fake_gateway_config ON, with a gRPC listener)
# under closed-loop loads after its model's first request and what clients ask before it,
# then stopped so that it writes its profile: JSON over HTTP, the binary tensor extension
# (validation on), and gRPC.
train() {
    local on="$1" name="$2" http=$((BASE + 2)) grpc=$((BASE + 3)) pid model=add_sub bearer="" auth=()
    fake_gateway_config "$http" "$on" "" "$BASE" "" "$grpc" >"$TMP/$name.toml"
    start_infergate "$name" "$TMP/$name.toml" "$GENERATE/release/infergate"
    pid="${PID[$name]}"
    if ((on == 1)); then model=bench bearer="$TOKEN" auth=(--bearer "$TOKEN"); fi
    wait_infer "http://127.0.0.1:$http" "$model" 30 "$bearer" ||
        { tail -20 "$TMP/$name.log" >&2; die "$name: no answer"; }
    local path header=()
    [[ -n "$bearer" ]] && header=(-H "authorization: Bearer $bearer")
    for path in "" /ready /config; do
        curl -s -o /dev/null "${header[@]}" "http://127.0.0.1:$http/v2/models/$model$path"
    done
    load() { # URL FLAGS... — one closed-loop load of add_sub's inference
        "$BIN/infergate-load" --url "$1" "${@:2}" -m "$model" "${auth[@]}" \
            -i INPUT0:FP32:4 -i INPUT1:FP32:4 -c 16 --warmup 0s -d "${SECONDS_EACH}s" --quiet \
            >"$TMP/$name.load" 2>&1 ||
            { tail -20 "$TMP/$name.load" "$TMP/$name.log" >&2; die "$name: the training load failed ($*)"; }
    }
    load "http://127.0.0.1:$http"
    if ((on == 2)); then load "http://127.0.0.1:$http" --binary; fi
    load "http://127.0.0.1:$grpc" --protocol grpc
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
}

rm -rf "$PROFILES"
say "3/5 training: HTTP (JSON, binary) and gRPC inference, validation off, on, everything on"
# Two fakes: the backend's HTTP on BASE, its gRPC on BASE+1 (fake_gateway_config's ports).
for port in "$BASE" $((BASE + 1)); do
    "$BIN/fake-triton" --listen "127.0.0.1:$port" --threads 1 2>"$TMP/fake-triton-$port.log" &
    PIDS+=("$!")
    wait_http "http://127.0.0.1:$port/v2/health/ready" 30 || die "fake-triton did not answer on $port"
done
everything_on_key
train 0 validation-off
train 2 validation-on
train 1 everything-on

say "4/5 merging the profile"
# A new path each run: cargo sees only the flag, not the file, so it rebuilds with each new
# profile (every crate: the profile covers the dependencies too).
"$profdata" merge -o "$TMP/merged.profdata" "$PROFILES"/*.profraw

say "5/5 building infergate with the profile (target/pgo)"
RUSTFLAGS="-Cprofile-use=$TMP/merged.profdata" CARGO_TARGET_DIR="$USE" \
    cargo_release optimised -p infergate --bin infergate
say "wrote target/pgo/release/infergate in $((SECONDS - STARTED)) s"
