# Source me (bash or zsh): `source scripts/env.sh` after scripts/setup.sh has run.
# (Other POSIX shells: run `. scripts/env.sh` from the repository root.)
# Exports TRITONSERVER (tritonserver binary), TRITON_BACKENDS (its --backend-directory)
# and activates <repo>/.venv (VIRTUAL_ENV set, .venv/bin first on PATH), which
# tritonserver needs so that the python backend stub finds numpy.
if [ -n "${BASH_SOURCE:-}" ]; then
    _infergate_env_src="${BASH_SOURCE[0]}"
elif [ -n "${ZSH_VERSION:-}" ]; then
    _infergate_env_src="${(%):-%x}"
else
    _infergate_env_src="./scripts/env.sh"
fi
INFERGATE_ROOT="$(cd "$(dirname "$_infergate_env_src")/.." && pwd)"
unset _infergate_env_src
export INFERGATE_ROOT
export VIRTUAL_ENV="$INFERGATE_ROOT/.venv"
case ":$PATH:" in
    ":$VIRTUAL_ENV/bin:"*) ;;
    *) export PATH="$VIRTUAL_ENV/bin:$PATH" ;;
esac
for _infergate_ts in "$VIRTUAL_ENV"/lib/python3*/site-packages/pytriton/tritonserver; do
    if [ -x "$_infergate_ts/bin/tritonserver" ]; then
        export TRITONSERVER="$_infergate_ts/bin/tritonserver"
        export TRITON_BACKENDS="$_infergate_ts/backends"
    fi
done
unset _infergate_ts
if [ -z "${TRITONSERVER:-}" ]; then
    echo "scripts/env.sh: no tritonserver under $VIRTUAL_ENV; run scripts/setup.sh first" >&2
fi
