#!/usr/bin/env bash
# On demand only (never by setup.sh or CI): llama.cpp's own GGUF converter (convert_hf_to_gguf.py) and a venv to run
# it in, without compiling llama.cpp; the venv is setup_llamacpp.sh's (build/peers/llamacpp), which calls this for
# its conversions, so nothing is installed twice.
#   bash scripts/compare/setup_converter.sh
#     -> prints the converter's path; run it as build/peers/llamacpp/bin/python <that path> CHECKPOINT --outtype T
# The converter and its gguf-py come from the llama-cpp-python source dist (vendor/llama.cpp), so they are the ones
# its runtime was built with; the venv has the converter's own pins (numpy 2, transformers 4.57), which the project
# venv does not match, and the CPU torch the project pins (requirements.lock: torch==2.13.0+cpu).
# Idempotent: a kept source dist, extracted converter and importable packages are not fetched again.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/build/peers/llamacpp"
LLAMA_CPP_VERSION="0.3.36"
SDIST="$VENV/src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
CONVERTER="$VENV/src/llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"

# Without --clear, venv leaves an existing venv's packages (a compiled llama-cpp-python included) in place.
if [ ! -x "$VENV/bin/python" ]; then
  /usr/bin/python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
fi
mkdir -p "$VENV/src"
[ -f "$SDIST" ] || "$VENV/bin/pip" download -q --no-binary :all: --no-deps -d "$VENV/src" \
  "llama-cpp-python==$LLAMA_CPP_VERSION"
# the converter is a script plus its conversion/ package (one module per model family) and gguf-py
if [ ! -f "$CONVERTER/convert_hf_to_gguf.py" ] || [ ! -d "$CONVERTER/conversion" ]; then
  tar -xzf "$SDIST" -C "$VENV/src" "llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp/convert_hf_to_gguf.py" \
    "llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp/conversion" \
    "llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp/gguf-py"
fi
if ! "$VENV/bin/python" -c "import torch, transformers, sentencepiece, google.protobuf, gguf" 2>/dev/null; then
  # torch: the CPU build the project pins (requirements.lock), from where pip finds it for setup.sh (a plain
  # torch==2.13.0 from PyPI is the multi-GB CUDA one); where pip is not configured with it, give its index, e.g.
  # PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
  "$VENV/bin/pip" install -q "torch==2.13.0+cpu" "numpy==2.2.6" "transformers==4.57.6" "sentencepiece==0.2.1" \
    "protobuf==4.25.9" "$CONVERTER/gguf-py"
fi
echo "$CONVERTER/convert_hf_to_gguf.py"
