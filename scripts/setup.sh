#!/usr/bin/env bash
# Prepare everything the tests, the quick-start demo and the benchmark need to run
# real Triton (CPU, python backend) from the nvidia-pytriton wheel:
#   - <repo>/.venv with the pinned packages of scripts/requirements.txt
#   - the python backend stub matching the venv's Python copied into the wheel's
#     backends/python/ (the wheel does not put it there)
#   - the padding files of tests/models/sized_{a,b,c} (not committed)
# and, on Debian, the packages it needs when they are missing (apt-get, step 0).
# Idempotent and fast when already done (a marker file records the requirements hash).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
REQS="$ROOT/scripts/requirements.txt"
PYTHON="${PYTHON:-python3}"

die() { echo "setup.sh: $*" >&2; exit 1; }

# Serialize concurrent runs (parallel tests, scripts/triton.sh) on a lock of this file.
exec 9<"${BASH_SOURCE[0]}"
flock 9

# 0. Debian packages, installed only when missing (one `apt-get update` first, as a fresh
#    image has no package lists): python3-venv to create the venv, curl for scripts/demo.sh,
#    openssl for the auth tests' keys, prometheus (with promtool) and docker-compose for the
#    deployment kit's tests (docker/); etcd-server (etcd 3.4, v3 API) and haproxy for the
#    replicas' tests (tests/cluster.rs); stress-ng to make the machine busy under them;
#    libpython for the python backend stub (step 3).
#    No protoc: the build compiles every .proto in pure Rust (build.rs, protox).
apt_updated=""
apt_install() { # package...
    command -v apt-get >/dev/null || die "missing: $* (install them; no apt-get here)"
    local sudo=()
    if [[ $EUID -ne 0 ]]; then
        command -v sudo >/dev/null || die "missing: $* (as root: apt-get install $*)"
        sudo=(sudo -n)
    fi
    if [[ -z "$apt_updated" ]]; then
        echo "setup.sh: apt-get update" >&2
        "${sudo[@]}" apt-get update -q >/dev/null || die "apt-get update failed"
        apt_updated=1
    fi
    echo "setup.sh: apt-get install $*" >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "$@" \
        >/dev/null || die "apt-get install $* failed"
}
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
{ command -v prometheus && command -v promtool; } >/dev/null || need+=(prometheus)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v etcd >/dev/null || need+=(etcd-server)
command -v haproxy >/dev/null || need+=(haproxy)
command -v stress-ng >/dev/null || need+=(stress-ng)
command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
# Debian's python3 has no venv/ensurepip without python3-venv (only needed to create .venv).
if [[ ! -x "$VENV/bin/python" ]] && [[ "$PYTHON" == python3 ]] \
    && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    need+=(python3-venv)
fi
if ((${#need[@]})); then
    apt_install "${need[@]}"
fi

# 1. virtualenv
if [[ ! -x "$VENV/bin/python" ]]; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found (need Python 3.8-3.13)"
    if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>"$ROOT/.venv-create.err"; then
        cat "$ROOT/.venv-create.err" >&2
        rm -rf "$VENV" "$ROOT/.venv-create.err"
        die "'$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
    fi
    rm -f "$ROOT/.venv-create.err"
fi

# 2. pinned packages, skipped when the marker for this requirements hash exists
hash="$(sha256sum "$REQS" | cut -c1-16)"
marker="$VENV/.infergate-setup-$hash"
if [[ ! -e "$marker" ]]; then
    echo "setup.sh: installing $REQS into $VENV (one-time)" >&2
    log="$VENV/.infergate-pip.log"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQS" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "pip install failed (full log: $log)"
    fi
    rm -f "$VENV"/.infergate-setup-*
    touch "$marker"
fi

# 3. python backend stub for the venv's Python version
read -r pyver site < <("$VENV/bin/python" -c \
    'import sys, sysconfig; print(f"{sys.version_info[0]}.{sys.version_info[1]}", sysconfig.get_paths()["purelib"])')
tsdir="$site/pytriton/tritonserver"
stub_src="$tsdir/python_backend_stubs/$pyver/triton_python_backend_stub"
stub_dst="$tsdir/backends/python/triton_python_backend_stub"
[[ -x "$tsdir/bin/tritonserver" ]] || die "no tritonserver in $tsdir (is nvidia-pytriton installed?)"
[[ -f "$stub_src" ]] || die "nvidia-pytriton has no python backend stub for Python $pyver"
if ! cmp -s "$stub_src" "$stub_dst"; then
    cp "$stub_src" "$stub_dst"
    chmod +x "$stub_dst"
fi
if ldd "$stub_dst" 2>/dev/null | grep -q "libpython$pyver.*not found"; then
    apt_install "libpython$pyver"
fi
if missing="$(ldd "$stub_dst" 2>/dev/null | grep 'not found')"; then
    die "triton_python_backend_stub has unresolved libraries:
$missing"
fi

# The stub's embedded interpreter runs isolated (ignores PYTHONDONTWRITEBYTECODE) and would
# write model.py bytecode into tests/models/*/1/__pycache__, changing the models' on-disk size
# after their first load. This .pth turns bytecode writing off in isolated interpreters only.
pth="$site/infergate_isolated_nobytecode.pth"
pth_line='import sys; sys.dont_write_bytecode = sys.dont_write_bytecode or bool(sys.flags.isolated)'
if [[ "$(cat "$pth" 2>/dev/null)" != "$pth_line" ]]; then
    printf '%s\n' "$pth_line" >"$pth"
fi

# 4. padding files giving tests/models/sized_* distinct on-disk sizes (real bytes, not sparse)
pad() { # model MiB
    local f="$ROOT/tests/models/$1/1/weights.bin" want=$(($2 * 1024 * 1024))
    [[ -d "$(dirname "$f")" ]] || return 0
    if [[ ! -f "$f" || "$(stat -c %s "$f")" != "$want" ]]; then
        head -c "$want" /dev/zero >"$f.tmp" && mv "$f.tmp" "$f"
    fi
}
pad sized_a 1
pad sized_b 2
pad sized_c 4
