#!/usr/bin/env bash
# One-shot, idempotent setup from a fresh clone:
#   venv (.venv, Debian's /usr/bin/python3.11) + pinned requirements + the engine package (editable),
#   a Triton backends folder with the Python backend stub (build/triton/backends),
#   library symlinks for perf_analyzer (build/lib), and the default model (models/SmolLM2-135M-Instruct).
# Re-running when everything is in place takes a few seconds.
# Env: FORCE_PIP=1 reinstalls the requirements even if the marker says they are satisfied.
#      SPECGRAM_MODEL=gemma3-270m also builds that model (models/gemma-3-270m; scripts/fetch_model.py lists them).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="$REPO/.venv"
PY_BASE=/usr/bin/python3.11   # the stub links Debian's libpython3.11: the venv must come from it
PY="$VENV/bin/python"

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
sha_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
PIP_LOG="$REPO/build/setup-pip.log"
rm -f "$PIP_LOG"
pipq() {  # quiet pip: full output to build/setup-pip.log, shown (tail) only on failure
  mkdir -p "$(dirname "$PIP_LOG")"
  local rc=0
  "$PY" -m pip "$@" >>"$PIP_LOG" 2>&1 || rc=$?
  if (( rc != 0 )); then
    grep -v 'is ignored: it is neither a file nor a directory' "$PIP_LOG" | tail -40 >&2
    die "pip $* failed (rc=$rc); full log: $PIP_LOG"
  fi
}

# ---------------------------------------------------------------- venv
venv_healthy() {
  [[ -x "$PY" ]] || return 1
  "$PY" - <<'PY' >/dev/null 2>&1 || return 1
import sys, pip  # noqa: F401
assert sys.version_info[:2] == (3, 11), sys.version
assert sys.base_prefix == "/usr", sys.base_prefix   # made from Debian's /usr/bin/python3.11
PY
}

if venv_healthy; then
  log "venv: $VENV ok ($("$PY" -V 2>&1))"
else
  [[ -x "$PY_BASE" ]] || die "$PY_BASE not found (apt-get install python3.11 python3.11-venv)"
  if [[ -e "$VENV" ]]; then
    log "venv: $VENV exists but is not a healthy /usr/bin/python3.11 venv; recreating"
    rm -rf "$VENV"
  fi
  log "venv: creating $VENV with $PY_BASE"
  "$PY_BASE" -m venv "$VENV"
fi

# ---------------------------------------------------------------- requirements
REQ_MARK="$VENV/.specgram-requirements.sha256"
req_hash="$(sha_of requirements.txt requirements.lock)"
if [[ "${FORCE_PIP:-0}" != 1 && -f "$REQ_MARK" && "$(cat "$REQ_MARK")" == "$req_hash" ]]; then
  log "requirements: up to date (marker matches)"
else
  log "pip: upgrading pip"
  pipq install -q -U pip
  log "requirements: installing requirements.txt with requirements.lock as constraints (may take minutes)"
  pipq install -q -r requirements.txt -c requirements.lock
  echo "$req_hash" > "$REQ_MARK"
  log "requirements: done"
fi

# ---------------------------------------------------------------- engine package (editable)
if [[ -f backend/pyproject.toml ]]; then
  BE_MARK="$VENV/.specgram-backend.sha256"
  be_hash="$(sha_of backend/pyproject.toml)"
  if [[ -f "$BE_MARK" && "$(cat "$BE_MARK")" == "$be_hash" ]] \
     && "$PY" -c 'import importlib.metadata as m; m.distribution("specgram")' >/dev/null 2>&1; then
    log "backend: specgram already installed (editable)"
  else
    log "backend: pip install --no-deps -e ./backend"
    pipq install -q --no-deps -e ./backend
    echo "$be_hash" > "$BE_MARK"
  fi
else
  log "backend: backend/pyproject.toml not present yet; skipping the engine install"
fi
"$PY" -m specgram.model.kernels build || log "WARNING: native CPU kernels NOT built (needs gcc with OpenMP and an x86-64 CPU with AVX-512 or AVX2 + FMA): the CPU forward will run on PyTorch, slower"

# ---------------------------------------------------------------- Triton backends folder
SP="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TS="$SP/pytriton/tritonserver"
[[ -x "$TS/bin/tritonserver" ]] || die "tritonserver not found under $TS (is nvidia-pytriton installed?)"
STUB_SRC="$TS/python_backend_stubs/3.11/triton_python_backend_stub"
[[ -f "$STUB_SRC" ]] || die "Python 3.11 backend stub not found: $STUB_SRC"
BACKENDS="$REPO/build/triton/backends"
# The stub is a symlink, not a copy: its RPATH is $ORIGIN/../../../../nvidia_pytriton.libs and glibc takes
# $ORIGIN of an executable from /proc/self/exe (the resolved path), so a symlink keeps its libraries
# (libcudart-*.so.12) resolvable, while a copy under build/ fails with "error while loading shared libraries".
STUB_DST="$BACKENDS/python/triton_python_backend_stub"
if [[ -L "$STUB_DST" && "$(readlink "$STUB_DST")" == "$STUB_SRC" ]] \
   && cmp -s "$TS/backends/python/libtriton_python.so" "$BACKENDS/python/libtriton_python.so"; then
  log "triton: $BACKENDS up to date"
else
  log "triton: preparing $BACKENDS (python backend + 3.11 stub)"
  rm -rf "$BACKENDS"
  mkdir -p "$(dirname "$BACKENDS")"
  cp -r "$TS/backends" "$BACKENDS"
  rm -rf "$BACKENDS"/*/__pycache__
  ln -sfn "$STUB_SRC" "$STUB_DST"
fi
if ldd "$(readlink -f "$STUB_DST")" | grep -q 'not found'; then
  ldd "$(readlink -f "$STUB_DST")" | grep 'not found' >&2
  die "the Python backend stub has unresolved shared libraries"
fi
if ldd "$TS/bin/tritonserver" | grep -q 'not found'; then
  ldd "$TS/bin/tritonserver" | grep 'not found' >&2
  die "tritonserver has unresolved shared libraries"
fi

# ---------------------------------------------------------------- perf_analyzer libraries
LIBS="$SP/nvidia_pytriton.libs"
mkdir -p build/lib
link_one() {  # link_one <glob in nvidia_pytriton.libs> <link name>
  local matches=("$LIBS"/$1)
  [[ -e "${matches[0]}" ]] || die "no $1 in $LIBS"
  ln -sfn "${matches[0]}" "build/lib/$2"
}
link_one 'libb64-*.so.0d' libb64.so.0d
link_one 'libcudart-*.so.12*' libcudart.so.12
[[ -x "$VENV/bin/perf_analyzer" ]] || die "perf_analyzer not in $VENV/bin (tritonclient[grpc,http]==2.51.0 ships it)"
# perf_analyzer 2.51 has no --help flag (it prints the usage and exits 99); --version exits 0.
pa_out="$(LD_LIBRARY_PATH="$REPO/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$VENV/bin/perf_analyzer" --help 2>&1 || true)"
if ! grep -q 'Usage:' <<<"$pa_out" \
   || ! LD_LIBRARY_PATH="$REPO/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$VENV/bin/perf_analyzer" --version >/dev/null 2>&1; then
  printf '%s\n' "$pa_out" | tail -5 >&2
  die "perf_analyzer does not run with LD_LIBRARY_PATH=build/lib"
fi
log "perf_analyzer: ok ($(LD_LIBRARY_PATH="$REPO/build/lib" "$VENV/bin/perf_analyzer" --version 2>&1 | head -1))"

# ---------------------------------------------------------------- default model
"$PY" scripts/fetch_model.py
if [[ -n "${SPECGRAM_MODEL:-}" && "${SPECGRAM_MODEL}" != smollm2 ]]; then
  "$PY" scripts/fetch_model.py --model "$SPECGRAM_MODEL"
fi

log "done. Next: source scripts/env.sh; scripts/serve.sh"
