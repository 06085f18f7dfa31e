#!/usr/bin/env bash
# On demand only (never by setup.sh or CI): OpenVINO GenAI in its own venv, and int4 OpenVINO IR of the checkpoints
# our engine serves, exported by optimum-intel, for the compare scenario (python scripts/bench.py compare, which
# runs this).
#   bash scripts/compare/setup_openvino.sh CHECKPOINT [DRAFT_CHECKPOINT]
#     -> build/peers/openvino/bin/python and build/peers/openvino/models/<checkpoint folder name>-int4 (and the
#        draft's), each a float32 Hugging Face folder exported with `optimum-cli export openvino --weight-format int4`
#        (NNCF's default int4 scheme for the model: asymmetric, groups of 128, a few layers kept in int8)
# Idempotent: an installed venv of the pinned versions and existing IR folders (by checkpoint folder name: delete
# them after changing the checkpoint in place) are kept. The export of a 1.5B takes ~2 min on 2 cores.
# Why each package: openvino-genai (the pipeline: LLMPipeline, prompt lookup, draft model, structured output) with
# the openvino and openvino-tokenizers of the same release (their ABIs must match); optimum-intel and nncf (the
# export and its int4 weight compression); torch, the CPU build the project pins (optimum-intel traces the model).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/build/peers/openvino"
OV_VERSION="2026.4.1"
PINS=("openvino-genai==$OV_VERSION.0" "openvino-tokenizers==$OV_VERSION.0" "openvino==$OV_VERSION"
  "optimum-intel[openvino]==2.2.0" "nncf==3.4.0" "torch==2.13.0")
if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
  "import importlib.metadata as m; assert m.version('openvino_genai') == '$OV_VERSION.0'" 2>/dev/null; }; then
  /usr/bin/python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q "${PINS[@]}"
fi
"$VENV/bin/python" -c "import openvino_genai; print('openvino-genai', openvino_genai.__version__)"
mkdir -p "$VENV/models"
for ckpt in "$@"; do
  CKPT="$(cd "$ckpt" && pwd)"
  OUT="$VENV/models/$(basename "$CKPT")-int4"
  if [ ! -f "$OUT/openvino_model.xml" ]; then
    rm -rf "$OUT"
    "$VENV/bin/optimum-cli" export openvino --model "$CKPT" --weight-format int4 \
      --task text-generation-with-past "$OUT"
  fi
  echo "$OUT"
done
