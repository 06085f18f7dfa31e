#!/usr/bin/env bash
# README command 2: set up (idempotent) and run the whole test suite: unit (tiny random models, CPU) and
# end-to-end (one real tritonserver for the session, default model), after the lint and the layout (ruff check,
# ruff format --check; settings in pyproject.toml); then the engine's exactness tests once more over the PyTorch
# forward (the path CUDA runs, which "auto" does not pick where the native CPU kernels build), in process and
# served: a second tritonserver serves the model with linear=torch for the end-to-end tests of the step
# (serving, speculation, guides, the contract fuzz). Extra args go to the first pytest run.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPECGRAM_MODEL="${SPECGRAM_MODEL:-gemma3-270m}" bash "$REPO/scripts/setup.sh"  # Gemma 3 270M: tests/e2e/test_models.py
source "$REPO/scripts/env.sh"
cd "$REPO"
python -m ruff check .
python -m ruff format --check .
python -m pytest tests -q -rs "$@"
SPECGRAM_TEST_LINEAR=torch python -m pytest -q -p no:cacheprovider \
  tests/unit/test_engine.py tests/unit/test_speculative.py tests/unit/test_min_tokens.py \
  tests/unit/test_seed_invariance.py tests/unit/test_adaptive.py tests/unit/test_penalties.py tests/unit/test_logprobs.py \
  tests/unit/test_containment.py tests/unit/test_lora.py
E2E_ENGINE_SETTINGS=linear=torch,draft_quantization=int8 SPECGRAM_FUZZ_N=120 python -m pytest -q -p no:cacheprovider \
  tests/e2e/test_serving.py tests/e2e/test_speculative_serving.py tests/e2e/test_guided_serving.py tests/e2e/test_fuzz.py
