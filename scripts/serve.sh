#!/usr/bin/env bash
# Start tritonserver (2.51, from the nvidia-pytriton wheel) in the foreground with this repo's models.
#   scripts/serve.sh [extra tritonserver args...]
# Env: HTTP_PORT (8000), GRPC_PORT (8001), METRICS_PORT (8002), MODEL_REPOSITORY (repo's model_repository);
# SPECGRAM_MODEL (a name of scripts/fetch_model.py, which setup.sh fetched) serves that model where
# SPECGRAM_CHECKPOINT does not name a checkpoint. Run scripts/setup.sh once first.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

MODEL_REPOSITORY="${MODEL_REPOSITORY:-$REPO/model_repository}"
if [[ -n "${SPECGRAM_MODEL:-}" && -z "${SPECGRAM_CHECKPOINT:-}" ]]; then
  SPECGRAM_CHECKPOINT="$(python "$REPO/scripts/fetch_model.py" --model "$SPECGRAM_MODEL" --checkpoint-path)"
  export SPECGRAM_CHECKPOINT
  echo "[serve] SPECGRAM_MODEL=$SPECGRAM_MODEL: checkpoint $SPECGRAM_CHECKPOINT" >&2
fi
HTTP_PORT="${HTTP_PORT:-8000}"
GRPC_PORT="${GRPC_PORT:-8001}"
METRICS_PORT="${METRICS_PORT:-8002}"

if [[ ! -x "$TRITON_BIN" || ! -x "$TRITON_BACKENDS/python/triton_python_backend_stub" ]]; then
  echo "[serve] tritonserver or the Python backend stub is missing; run scripts/setup.sh first" >&2
  exit 1
fi

# build/lib (libcudart.so.12 from nvidia-pytriton, for perf_analyzer) must not reach the server: the
# model's torch would load that CUDA 12.6 runtime instead of its own. tritonserver finds its libs by RPATH.
_keep=()
IFS=: read -ra _parts <<<"${LD_LIBRARY_PATH:-}"
for _p in "${_parts[@]}"; do
  [[ -n "$_p" && "$_p" != "$REPO/build/lib" ]] && _keep+=("$_p")
done
if ((${#_keep[@]})); then LD_LIBRARY_PATH="$(IFS=:; echo "${_keep[*]}")"; export LD_LIBRARY_PATH; else unset LD_LIBRARY_PATH; fi
unset _keep _parts _p

echo "[serve] tritonserver: models=$MODEL_REPOSITORY http=$HTTP_PORT grpc=$GRPC_PORT metrics=$METRICS_PORT" >&2
# PATH starts with $VENV/bin (env.sh): the stub's embedded interpreter then uses the venv's site-packages.
exec "$TRITON_BIN" \
  --model-repository="$MODEL_REPOSITORY" \
  --backend-directory="$TRITON_BACKENDS" \
  --http-port="$HTTP_PORT" \
  --grpc-port="$GRPC_PORT" \
  --metrics-port="$METRICS_PORT" \
  --log-verbose=0 \
  "$@"
