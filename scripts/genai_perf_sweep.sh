#!/usr/bin/env bash
# genai-perf against model `llm` over gRPC streaming, one run per concurrency, figures summarized.
#   bash scripts/genai_perf_sweep.sh [concurrency ...]       (default: 1 2 4 8 16)
# Env: URL (default: start our own tritonserver on free ports, stopped at the end), REQUESTS_PER_C (2 x c,
# at least 4), OUTPUT_TOKENS (48), INPUT_TOKENS (200), OUT_DIR (docs/benchmarks/genai_perf).
# genai-perf 0.0.16 goes into its own venv, build/peers/genai-perf, on demand (never by set-up or CI). Its
# PyPI dependency `perf-analyzer` is an empty placeholder, so it runs the project's perf_analyzer 2.51
# (.venv/bin, libraries from build/lib; scripts/setup.sh provides both). Exact output lengths come from
# max_tokens + ignore_eos (genai-perf's --output-tokens-mean-deterministic, which sends min_tokens, would work
# too: docs/operating.md). No warm-up requests: perf_analyzer 2.51
# with --warmup-request-count 1 at concurrency 2 never stopped sending (seen here).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/env.sh"
GP_VENV="$REPO/build/peers/genai-perf"
CONCURRENCY=("${@:-1 2 4 8 16}")
read -ra CONCURRENCY <<<"${CONCURRENCY[*]}"
OUT_DIR="${OUT_DIR:-$REPO/docs/benchmarks/genai_perf}"
OUTPUT_TOKENS="${OUTPUT_TOKENS:-48}"
INPUT_TOKENS="${INPUT_TOKENS:-200}"

if ! "$GP_VENV/bin/genai-perf" --version >/dev/null 2>&1; then
  /usr/bin/python3.11 -m venv "$GP_VENV"
  "$GP_VENV/bin/pip" install -q -U pip
  "$GP_VENV/bin/pip" install -q genai-perf==0.0.16
fi

server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill -- -"$server_pid" 2>/dev/null || true; }
trap cleanup EXIT
if [[ -z "${URL:-}" ]]; then
  read -r HTTP_PORT GRPC_PORT METRICS_PORT < <(python -c "
import sys; sys.path.insert(0, '$REPO/client'); from triton_server import free_ports; print(*free_ports(3))")
  export HTTP_PORT GRPC_PORT METRICS_PORT
  setsid bash "$REPO/scripts/serve.sh" > "$REPO/build/genai-perf-server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do
    curl -fs "localhost:$HTTP_PORT/v2/models/llm/ready" >/dev/null 2>&1 && break; sleep 1
  done
  curl -fs "localhost:$HTTP_PORT/v2/models/llm/ready" >/dev/null || { echo "server not ready" >&2; exit 1; }
  URL="localhost:$GRPC_PORT"
fi

mkdir -p "$OUT_DIR"
artifacts="$REPO/build/genai-perf-artifacts"
rm -rf "$artifacts"
for c in "${CONCURRENCY[@]}"; do
  n=$(( c * 2 > 4 ? c * 2 : 4 ))
  n="${REQUESTS_PER_C:-$n}"
  echo "[genai-perf] concurrency $c, $n requests" >&2
  # PATH: genai-perf from its venv, perf_analyzer from the project venv (env.sh put .venv/bin on PATH).
  PATH="$GP_VENV/bin:$PATH" genai-perf profile -m llm --backend vllm --endpoint-type kserve --streaming -u "$URL" \
    --tokenizer "$REPO/models/SmolLM2-135M-Instruct" --concurrency "$c" --request-count "$n" \
    --warmup-request-count 0 --synthetic-input-tokens-mean "$INPUT_TOKENS" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "$OUTPUT_TOKENS" --extra-inputs ignore_eos:true \
    --random-seed 0 \
    --artifact-dir "$artifacts/c$c" > "$OUT_DIR/c$c.log" 2>&1 || { tail -20 "$OUT_DIR/c$c.log" >&2; exit 1; }
  cp "$(find "$artifacts/c$c" -name '*genai_perf.csv' | head -1)" "$OUT_DIR/c$c.csv"
done
python "$REPO/scripts/genai_perf_summary.py" "$OUT_DIR" "genai-perf $("$GP_VENV/bin/pip" show genai-perf | awk '/^Version/{print $2}')" \
  "bash scripts/genai_perf_sweep.sh ${CONCURRENCY[*]}" "$OUTPUT_TOKENS" "$INPUT_TOKENS"
