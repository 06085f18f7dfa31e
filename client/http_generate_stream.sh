#!/usr/bin/env bash
# Stream a generation over HTTP with Triton's generate extension (server-sent events).
#   client/http_generate_stream.sh "Write a haiku about GPUs" [max_tokens]
# Env: HTTP_URL (default http://localhost:8000), MODEL (default llm).
# Each event is a line `data: {...}` holding that response's outputs (text_output is the delta);
# the last one has a non-empty finish_reason. Top-level JSON keys are the model's input names
# (a [-1] input such as `stop` takes a JSON array). Outputs with one element come back as scalars.
set -euo pipefail
HTTP_URL="${HTTP_URL:-http://localhost:8000}"
MODEL="${MODEL:-llm}"
PROMPT="${1:-Write a haiku about GPUs.}"
MAX_TOKENS="${2:-64}"
# JSON-escape the prompt with python (any python3 will do)
PROMPT_JSON="$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$PROMPT")"

curl -sS -N --fail-with-body -X POST "$HTTP_URL/v2/models/$MODEL/generate_stream" \
  -H 'Content-Type: application/json' \
  -d @- <<JSON
{
  "text_input": $PROMPT_JSON,
  "stream": true,
  "max_tokens": $MAX_TOKENS,
  "temperature": 0.0,
  "apply_chat_template": true,
  "exclude_input_in_output": true,
  "stop": ["</answer>"],
  "return_finish_reason": true,
  "return_num_output_tokens": true
}
JSON
echo
