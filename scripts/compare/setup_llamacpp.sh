#!/usr/bin/env bash
# On demand only (never by setup.sh or CI): llama.cpp through llama-cpp-python in its own venv, and GGUF copies of
# the checkpoint our engine serves, for the compare scenario (python scripts/bench.py compare, which runs this).
#   bash scripts/compare/setup_llamacpp.sh [CHECKPOINT] [TYPE ...]
#     -> build/peers/llamacpp/bin/python and build/peers/llamacpp/models/<checkpoint name>-<type>.gguf
#        (CHECKPOINT default models/SmolLM2-135M-Instruct; TYPE: convert_hf_to_gguf.py's --outtype, default f32 q8_0;
#        the one TYPE none converts nothing: the install alone, for GGUF files given to compare as they are)
# Idempotent: an installed llama-cpp-python of the pinned version and build flags, and existing GGUF files, are
# kept (GGUFs by checkpoint folder name and type: delete them after changing the checkpoint in place). The first run
# compiles llama.cpp (PyPI has only the source dist): several minutes on 2 cores.
# The GGUF files come from llama.cpp's own converter (vendor/llama.cpp/convert_hf_to_gguf.py in the same source
# dist, so converter and runtime agree on the format), run in this venv with the converter's own pins (numpy 2,
# transformers 4.57), which the project venv does not match; torch is the CPU build the project pins. The converter
# alone, without compiling: scripts/compare/setup_converter.sh (the same venv).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/build/peers/llamacpp"
LLAMA_CPP_VERSION="0.3.36"
CKPT="$(cd "${1:-$REPO/models/SmolLM2-135M-Instruct}" && pwd)"
shift || true
if [ $# -gt 0 ]; then TYPES=("$@"); else TYPES=(f32 q8_0); fi
if [ "${TYPES[*]}" == "none" ]; then TYPES=(); fi
SDIST="$VENV/src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
CONVERTER="$VENV/src/llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"

# GGML_NATIVE: kernels for this CPU (AVX-512 / AVX2 as present), as a local llama.cpp build would have; except
# AMX: where the CPU has it, llama.cpp 0.3.36's AMX matmul (Q8_0 weights) crashes (SIGSEGV in
# ggml_backend_amx_mul_mat on a 2-core Sapphire Rapids VM), so the build names the CPU's other x86 features itself
# and leaves AMX out (Q8_0 then runs on its AVX-512 VNNI kernels with weight repacking, as on CPUs without AMX).
isa_args() {
  local flags; flags="$(grep -m1 '^flags' /proc/cpuinfo)"
  if [[ " $flags " != *" amx_int8 "* ]]; then echo "-DGGML_NATIVE=ON"; return; fi
  local out="-DGGML_NATIVE=OFF" f opt
  for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
    avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    opt="${f#*:}"; f="${f%%:*}"
    if [[ " $flags " == *" $f "* ]]; then out+=" -DGGML_$opt=ON"; else out+=" -DGGML_$opt=OFF"; fi
  done
  echo "$out"
}
BUILD_ARGS="${CMAKE_ARGS:-$(isa_args)}"
if ! { [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/build-args" 2>/dev/null)" == "$BUILD_ARGS" ] &&
  "$VENV/bin/python" -c \
  "import importlib.metadata as m; assert m.version('llama_cpp_python') == '$LLAMA_CPP_VERSION'" 2>/dev/null; }; then
  /usr/bin/python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
  mkdir -p "$VENV/src"
  # The source dist is kept: its vendor/llama.cpp holds the converter used below.
  [ -f "$SDIST" ] || "$VENV/bin/pip" download -q --no-binary :all: --no-deps -d "$VENV/src" \
    "llama-cpp-python==$LLAMA_CPP_VERSION"
  # its dependencies pinned (numpy at the converter's pin), then the package rebuilt alone for these flags
  "$VENV/bin/pip" install -q "numpy==2.2.6" "typing-extensions==4.16.0" "diskcache==5.6.3" "jinja2==3.1.6"
  CMAKE_ARGS="$BUILD_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$VENV/bin/pip" install -q --force-reinstall --no-deps "$SDIST"
  echo "$BUILD_ARGS" > "$VENV/build-args"
fi
"$VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"

NAME="$(basename "$CKPT")"
mkdir -p "$VENV/models"
# the converter and its packages in this venv (scripts/compare/setup_converter.sh: no compiling)
if [ ${#TYPES[@]} -gt 0 ]; then bash "$REPO/scripts/compare/setup_converter.sh" > /dev/null; fi
for t in "${TYPES[@]+"${TYPES[@]}"}"; do
  out="$VENV/models/$NAME-$t.gguf"
  if [ -s "$out" ]; then echo "$out ready"; continue; fi
  # The converter reads the checkpoint with transformers 4.57, which does not know the tokenizer class that
  # transformers 5 writes ("TokenizersBackend"): it reads a view of the checkpoint (links to its files) whose
  # tokenizer_config.json names the equivalent PreTrainedTokenizerFast (the same tokenizer.json).
  view="$VENV/src/view/$NAME"
  rm -rf "$view" && mkdir -p "$view"
  for f in "$CKPT"/*; do ln -s "$f" "$view/$(basename "$f")"; done
  if [ -f "$CKPT/tokenizer_config.json" ]; then
    rm "$view/tokenizer_config.json"
    sed 's/"tokenizer_class": *"TokenizersBackend"/"tokenizer_class": "PreTrainedTokenizerFast"/' \
      "$CKPT/tokenizer_config.json" > "$view/tokenizer_config.json"
  fi
  # written to a temporary name first: an interrupted conversion must not pass for a cached file
  "$VENV/bin/python" "$CONVERTER/convert_hf_to_gguf.py" "$view" --outtype "$t" --outfile "$out.part"
  mv "$out.part" "$out"
  echo "$out ready"
done
