#!/usr/bin/env bash
# README command 2: set up (idempotent) and run the whole test suite: unit (tiny random models, CPU) and
# end-to-end (one real tritonserver for the session, default model), after the lint (ruff, settings in
# pyproject.toml). Extra args go to pytest.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
source "$REPO/scripts/env.sh"
cd "$REPO"
python -m ruff check .
exec python -m pytest tests -q -rs "$@"
