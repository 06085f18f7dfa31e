#!/usr/bin/env bash
# README command 1: set everything up, start a real tritonserver with the default model, stream an answer
# over gRPC with client/stream_client.py, then stop the server (KEEP_SERVER=1 leaves it running).
#   bash scripts/demo.sh ["your prompt"] [extra client args...]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
source "$REPO/scripts/env.sh"
export HTTP_PORT="${HTTP_PORT:-8000}" GRPC_PORT="${GRPC_PORT:-8001}" METRICS_PORT="${METRICS_PORT:-8002}"
PROMPT="${1:-Explain in two sentences what speculative decoding is.}"
shift || true
LOG="$REPO/build/demo-tritonserver.log"

echo "[demo] starting tritonserver (log: $LOG)"
setsid bash "$REPO/scripts/serve.sh" >"$LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
  [[ "${KEEP_SERVER:-0}" == 1 ]] && { echo "[demo] server left running (pid $SERVER_PID)"; return; }
  kill -TERM -- -"$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- -"$SERVER_PID" 2>/dev/null || true
}
trap stop_server EXIT

for i in $(seq 300); do
  if curl -sf "localhost:$HTTP_PORT/v2/models/llm/ready" >/dev/null; then break; fi
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -40 "$LOG"; echo "[demo] tritonserver exited" >&2; exit 1; }
  sleep 1
done
curl -sf "localhost:$HTTP_PORT/v2/models/llm/ready" >/dev/null || { tail -40 "$LOG"; exit 1; }
echo "[demo] model llm ready after ${i}s; streaming over gRPC:"
echo "[demo] > $PROMPT"
python "$REPO/client/stream_client.py" --url "localhost:$GRPC_PORT" --chat --max-tokens 96 "$PROMPT" "$@"
