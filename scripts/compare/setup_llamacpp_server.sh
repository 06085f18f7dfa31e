#!/usr/bin/env bash
# On demand only (never by setup.sh or CI): llama.cpp's own server (llama-server), for the compare scenario's
# llama.cpp draft-model rows (python scripts/bench.py compare --llamacpp-draft DRAFT.gguf, which runs this).
#   bash scripts/compare/setup_llamacpp_server.sh     -> prints the path of build/peers/llamacpp/server/bin/llama-server
# Built from the same source as the llama-cpp-python rows: the llama.cpp that llama-cpp-python's pinned source dist
# vendors (setup_llamacpp.sh downloads it, and runs first if it has not), with the same ISA flags (its build-args).
# Why the server: llama-cpp-python drafts by prompt lookup only; llama.cpp's draft-model speculation (a second,
# smaller GGUF drafting for the target, --spec-draft-model) lives in its server. Idempotent: a server built from
# that source dist with those flags is kept. The first run compiles ggml, llama, its common library and the server:
# ~15 minutes on 2 cores.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$REPO/build/peers/llamacpp"
LLAMA_CPP_VERSION="0.3.36"  # setup_llamacpp.sh's pin
SDIST="$VENV/src/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
OUT="$VENV/server"
if [ ! -f "$SDIST" ] || [ ! -f "$VENV/build-args" ]; then
  bash "$REPO/scripts/compare/setup_llamacpp.sh" "$REPO/models/SmolLM2-135M-Instruct" none > /dev/null
fi
BUILD_ARGS="$(cat "$VENV/build-args")"
STAMP="$LLAMA_CPP_VERSION $BUILD_ARGS"
if ! { [ -x "$OUT/bin/llama-server" ] && [ "$(cat "$OUT/stamp" 2>/dev/null)" == "$STAMP" ]; }; then
  SRC="$OUT/src"
  rm -rf "$OUT" && mkdir -p "$SRC" "$OUT/bin"
  tar xzf "$SDIST" -C "$SRC" --strip-components=3 "llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"
  # no HTTPS (it listens on localhost), no downloads of a prebuilt web UI, no tests or examples
  # shellcheck disable=SC2086  # BUILD_ARGS is a list of -D flags
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release $BUILD_ARGS -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF > "$OUT/cmake.log" 2>&1 ||
    { tail -n 40 "$OUT/cmake.log" >&2; exit 1; }
  cmake --build "$SRC/build" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" --target llama-server > "$OUT/build.log" 2>&1 ||
    { tail -n 40 "$OUT/build.log" >&2; exit 1; }
  cp "$SRC/build/bin/llama-server" "$OUT/bin/llama-server"
  rm -rf "$SRC"
  echo "$STAMP" > "$OUT/stamp"
fi
echo "$OUT/bin/llama-server"
