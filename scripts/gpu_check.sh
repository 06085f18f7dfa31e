#!/usr/bin/env bash
# The GPU check: unit tests on CUDA + the GPU benchmark, figures written to $OUT (default build/gpu_check).
#
# On a machine with access to the package index, once:
#   bash scripts/gpu_check.sh --prepare
#     -> .gpu_carry/ (git-ignored): cp312 wheels a CUDA PyTorch image lacks (xgrammar; transformers and
#        tokenizers at our pinned versions) and SmolLM2's tokenizer files (no weights: the benchmark builds
#        random models)
# On the GPU machine (python3 with CUDA torch, numpy and pytest; the repository copied with .gpu_carry/):
#   OUT=/some/dir bash scripts/gpu_check.sh          # ~9 min at most
#     -> $OUT/env.txt, $OUT/unit_cuda.log, $OUT/report.md, $OUT/gpu.json (python3 scripts/bench.py gpu)
# Each part runs even if the one before failed; the exit status is the first failure's.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$REPO/.gpu_carry"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  exclude="$(git -C "$REPO" rev-parse --git-path info/exclude)"
  grep -qx "/.gpu_carry/" "$exclude" 2>/dev/null || echo "/.gpu_carry/" >> "$exclude"
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" "$CARRY/tokenizer"
  plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  # versions from requirements.lock; the image already has torch, numpy, safetensors, huggingface_hub, pytest
  # xgrammar imports pydantic at module load, and the image has no pydantic: carried with its three helpers
  for pkg in xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 transformers==5.24.0 tokenizers==0.23.3 regex==2026.11.19 \
             pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
             typing_extensions==4.16.0; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d "$CARRY/wheels" "$pkg"
  done
  model="${SPECGRAM_MODEL_DIR:-$REPO/models/SmolLM2-135M-Instruct}"   # scripts/setup.sh puts it there
  cp "$model"/tokenizer* "$CARRY/tokenizer/"
  cp "$model"/special_tokens_map.json "$CARRY/tokenizer/" 2>/dev/null || true
  du -sh "$CARRY"
  exit 0
fi

OUT="${OUT:-$REPO/build/gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ -d "$CARRY/wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$CARRY"/wheels/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/backend:$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO"
status=0

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, xgrammar, importlib.metadata as m; print('torch', torch.__version__,
'cuda', torch.version.cuda, torch.cuda.get_device_name(); print('transformers', transformers.__version__,
'xgrammar', m.version('xgrammar'))"; } 2>&1 | tee "$OUT/env.txt"

# 1. the unit suite with every engine on CUDA (gpu-marked tests included); corpus/e2e need the real model + server
SPECGRAM_TEST_DEVICE=cuda timeout 240 python3 -m pytest tests/unit -q -rs -p no:cacheprovider 2>&1 \
  | tee "$OUT/unit_cuda.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

# 2. step costs and throughput on random ~1B / 135M-shape models with the real tokenizer
timeout 300 python3 scripts/bench.py gpu --tokenizer "$CARRY/tokenizer" --raw "$OUT" 2>&1 | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
