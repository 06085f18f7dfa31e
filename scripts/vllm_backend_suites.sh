#!/usr/bin/env bash
# Run vllm_backend's own CI client tests against this model, to show that clients written for vllm_backend
# work unchanged. The tests are triton-inference-server/vllm_backend's:
#   ci/L0_additional_outputs_vllm/additional_outputs_test.py  finish_reason, logprobs, cumulative_logprob,
#       num_input_tokens, num_output_tokens, streamed and not (1,458 cases, pytest)
#   ci/L0_backend_vllm/accuracy_test/accuracy_test.py          greedy text, and structured outputs (`choice`)
#   ci/L0_backend_vllm/metrics_test/vllm_metrics_test.py       the cases that do not need vLLM's own metrics
#   ci/L0_multi_gpu_vllm/multi_lora/multi_lora_test.py         LoRA adapters by `lora_name`, and an unknown one's
#       error (2 cases, unittest); and its test.sh's two generate-endpoint checks (a valid and an unknown adapter)
# They are copied into a temporary folder and changed only where they cannot apply to another model and
# server, each change made with sed and printed:
#   - the gRPC and metrics ports (localhost:8001, :8002) -> the free ports this server uses;
#   - the model name: none; our model is served as `vllm_opt`, the name the tests use;
#   - model-specific references, computed by sending the tests' own requests to this server (printed):
#       additional outputs: the finish_reason the final response must carry (vLLM's facebook/opt-125m runs
#         into the 16-token limit, "length"; a model that ends the sentence earlier says "stop");
#       accuracy: its two baseline files, which the test makes with an in-process vLLM engine, are made from
#         this server's answers to the same requests (greedy, 16 tokens). vLLM is not needed: its imports,
#         used only by the baseline modes, are satisfied by an import-only stand-in.
#       multi-LoRA: the adapters `doll` and `sheep` (Gemma-2B fine-tunes there) are two random PEFT adapters of
#         this checkpoint, written here; the two expected answers are transformers + PEFT's greedy continuations
#         (16 tokens) of the test's prompts under them, computed in this script, not by this server.
# The server: this checkout's model_repository/llm, copied as `vllm_opt` with an absolute checkpoint and
# default_max_tokens 16 (vLLM's default max_tokens, which the tests rely on; a server setting, not a test
# change), and once more as `vllm_llama_multi_lora` with enable_lora and the adapters' multi_lora.json in its
# version folder; run like client/triton_server.py runs it, on free ports; stopped at the end.
# The unittest-based files (accuracy, metrics) run as their own test.sh runs them, `python3 <file>`, with
# test.sh's result check (test_results.txt: that many tests, no errors, no failures): their
# TestResultCollector.run() reads result.testsRun, which pytest's result object lacks, so pytest cannot host them.
# Not run, because they test vLLM itself: test_vllm_metrics (vllm:* metric names and OPT token counts),
# test_custom_sampling_params (passes only when vllm:request_params_n_* exists; its n=2 is also refused by this
# model, which generates one sequence per request), the REPORT_CUSTOM_METRICS / model.json variants (vLLM
# settings), multi-LoRA's run without enable_lora (its message, "LoRA feature is not enabled.", is this model's
# too: tests/unit/test_lora.py), and the suites for engine arguments, multi-GPU and GPU memory.
#
#   scripts/vllm_backend_suites.sh VLLM_BACKEND [REV]
#     VLLM_BACKEND  a vllm_backend checkout, or its bare git dir (files are read at REV, default HEAD)
#   Env: PYTEST_ARGS (default -q; e.g. "-x -q"), KEEP_WORK=1 keeps the temporary folder,
#        SUITES (default "additional_outputs accuracy metrics multi_lora": the suites to run),
#        SPECGRAM_CHECKPOINT (another checkpoint). Exit status: 0 when every suite passed.
set -euo pipefail

SRC=${1:?usage: $0 VLLM_BACKEND_REPO_OR_GIT_DIR [REV]}
REV=${2:-HEAD}
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
PY="$VENV/bin/python"
MODEL=vllm_opt
LORA_MODEL=vllm_llama_multi_lora
SUITES=${SUITES:-additional_outputs accuracy metrics multi_lora}
want() { [[ " $SUITES " == *" $1 "* ]]; }
FILES=(ci/common/test_util.py
       ci/L0_additional_outputs_vllm/additional_outputs_test.py
       ci/L0_backend_vllm/accuracy_test/accuracy_test.py
       ci/L0_backend_vllm/metrics_test/vllm_metrics_test.py
       ci/L0_multi_gpu_vllm/multi_lora/multi_lora_test.py)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/vllm_backend_suites.XXXXXX")
SERVER_PID=""
stop_server() {
  [[ -n "$SERVER_PID" ]] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null || true      # the server's process group: its Python-backend stubs
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}
cleanup() {
  stop_server
  if [[ "${KEEP_WORK:-0}" == 1 ]]; then echo "[suites] kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
log() { echo "[suites] $*"; }

# ---- 1. the tests, from a checkout or a git dir
for f in "${FILES[@]}"; do
  mkdir -p "$WORK/$(dirname "$f")"
  if [[ -f "$SRC/$f" ]]; then
    cp "$SRC/$f" "$WORK/$f"
  else
    git -C "$SRC" show "$REV:$f" >"$WORK/$f"
  fi
done
log "tests from $SRC ($(git -C "$SRC" rev-parse "$REV" 2>/dev/null || echo 'not a git repository'))"

# ---- 2. the model repository: model_repository/llm served as vllm_opt
mkdir -p "$WORK/models/$MODEL/1"
cp "$REPO/model_repository/llm/1/model.py" "$WORK/models/$MODEL/1/model.py"
ln -s "$REPO/backend" "$WORK/backend"     # model.py loads the engine found three folders above it: this checkout's
CFG="$WORK/models/$MODEL/config.pbtxt"
ckpt=$(sed -n 's/.*key: "checkpoint", value: { string_value: "\([^"]*\)".*/\1/p' "$REPO/model_repository/llm/config.pbtxt")
[[ "$ckpt" == /* ]] || ckpt=$(realpath -m "$REPO/model_repository/llm/$ckpt")
sed -e "s|^name: \"llm\"|name: \"$MODEL\"|" \
    -e "s|key: \"checkpoint\", value: { string_value: \"[^\"]*\" }|key: \"checkpoint\", value: { string_value: \"$ckpt\" }|" \
    -e 's|key: "default_max_tokens", value: { string_value: "[^"]*" }|key: "default_max_tokens", value: { string_value: "16" }|' \
    "$REPO/model_repository/llm/config.pbtxt" >"$CFG"
grep -q "^name: \"$MODEL\"" "$CFG" && grep -q 'key: "default_max_tokens", value: { string_value: "16" }' "$CFG" \
  || { echo "[suites] could not set name / default_max_tokens in $CFG" >&2; exit 1; }
# the same model with LoRA adapters, as vllm_backend's multi-LoRA test serves it: two random PEFT adapters of this
# checkpoint under the test's names, listed in the version folder's multi_lora.json; the expected answers are
# transformers + PEFT's
mkdir -p "$WORK/models/$LORA_MODEL/1"
cp "$REPO/model_repository/llm/1/model.py" "$WORK/models/$LORA_MODEL/1/model.py"
sed -e "s|^name: \"$MODEL\"|name: \"$LORA_MODEL\"|" "$CFG" >"$WORK/models/$LORA_MODEL/config.pbtxt"
echo 'parameters { key: "enable_lora", value: { string_value: "1" } }' >>"$WORK/models/$LORA_MODEL/config.pbtxt"
"$PY" - "$ckpt" "$WORK" "$LORA_MODEL" <<'EOF'
import copy, json, sys
from pathlib import Path
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
ckpt, work, model_name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
tok = AutoTokenizer.from_pretrained(ckpt)
base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
prompts = {"doll": "Instruct: What do you think of Computer Science?\nOutput:",   # the test's prompt per adapter
           "sheep": "Instruct: Tell me more about soccer\nOutput:"}
expected, listing = {}, {}
for seed, (name, prompt) in enumerate(prompts.items()):
    torch.manual_seed(seed)
    cfg = LoraConfig(r=8, lora_alpha=2, target_modules="all-linear", init_lora_weights=False)  # a mild change
    peft = get_peft_model(copy.deepcopy(base), cfg).eval()
    folder = work / "weights" / "loras" / name
    peft.save_pretrained(str(folder))
    listing[name] = str(folder)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = peft.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    expected[name] = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    print(f"  {name}: PEFT greedy {expected[name]!r}", file=sys.stderr)
(work / "models" / model_name / "1" / "multi_lora.json").write_text(json.dumps(listing))
(work / "lora_expected.json").write_text(json.dumps(expected))
EOF
log "multi-LoRA: adapters doll and sheep written; expected answers from transformers + PEFT (above)"

read -r HTTP GRPC METRICS < <("$PY" -c "import sys; sys.path.insert(0, '$REPO/client')
from triton_server import free_ports; print(*free_ports(3))")

start_server() {     # extra tritonserver args
  local ld
  ld=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -vx "$REPO/build/lib" | paste -sd: || true)
  # as client/triton_server.py: build/lib (perf_analyzer's CUDA runtime) kept away from the model's torch
  (cd "$REPO" && if [[ -n "$ld" ]]; then export LD_LIBRARY_PATH="$ld"; else unset LD_LIBRARY_PATH; fi
   PYTHONUNBUFFERED=1 exec setsid "$TRITON_BIN" \
     --model-repository="$WORK/models" --backend-directory="$TRITON_BACKENDS" \
     --http-port="$HTTP" --grpc-port="$GRPC" --metrics-port="$METRICS" --log-verbose=0 "$@" \
     >>"$WORK/tritonserver.log" 2>&1 </dev/null) &
  SERVER_PID=$!
  for _ in $(seq 600); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      tail -40 "$WORK/tritonserver.log"; echo "[suites] tritonserver exited" >&2; SERVER_PID=""; return 1
    fi
    curl -sf "localhost:$HTTP/v2/models/$MODEL/ready" >/dev/null \
      && curl -sf "localhost:$HTTP/v2/models/$LORA_MODEL/ready" >/dev/null \
      && { log "server ready: grpc $GRPC metrics $METRICS $*"; return 0; }
    sleep 0.5
  done
  tail -40 "$WORK/tritonserver.log"; echo "[suites] tritonserver not ready after 300 s" >&2; return 1
}
start_server

# ---- the substitutions
subst() {     # file sed-expression what
  local before; before=$(cksum <"$WORK/$1")
  sed -i "$2" "$WORK/$1"
  [[ "$(cksum <"$WORK/$1")" != "$before" ]] || { echo "[suites] no match for '$2' in $1" >&2; exit 1; }
  log "changed $1: $3"
}
AO=ci/L0_additional_outputs_vllm/additional_outputs_test.py
ACC=ci/L0_backend_vllm/accuracy_test/accuracy_test.py
MET=ci/L0_backend_vllm/metrics_test/vllm_metrics_test.py
LORA=ci/L0_multi_gpu_vllm/multi_lora/multi_lora_test.py
for f in "$AO" "$ACC" "$MET" "$LORA"; do
  subst "$f" "s/localhost:8001/localhost:$GRPC/" "gRPC localhost:8001 -> localhost:$GRPC"
done
"$PY" - "$WORK/$LORA" "$WORK/lora_expected.json" <<'EOF' || exit 1
# multi-LoRA: the two expected answers (Gemma-2B's adapters there) -> transformers + PEFT's for these adapters
import json, sys
path, expected = sys.argv[1], json.load(open(sys.argv[2]))
text = open(path).read()
for name, theirs in (("doll", r" I think it is a very interesting subject.\n\nInstruct: What do you"),
                     ("sheep", r" I love soccer. I play soccer every day.\nInstruct: Tell me")):
    old = 'b"' + theirs + '"'
    if text.count(old) != 1:
        sys.exit(f"[suites] no single match for the {name} answer in {path}")
    text = text.replace(old, repr(expected[name].encode()))
    print(f"[suites] changed multi_lora_test.py: the {name} answer -> {expected[name].encode()!r}")
open(path, "w").write(text)
EOF
subst "$MET" "s#:8002/metrics#:$METRICS/metrics#" "metrics port 8002 -> $METRICS"

# additional outputs: the final finish_reason for the test's own request, streamed and not (must agree)
FINISH=$(cd "$WORK" && "$PY" - "localhost:$GRPC" "$MODEL" <<'EOF'
import json, sys
import numpy as np, tritonclient.grpc as grpcclient
url, model = sys.argv[1:]
sp = {"temperature": "0", "top_p": "1"}           # TestAdditionalOutputs._sampling_parameters
reasons = set()
for stream in (True, False):
    inputs = []
    for name, dtype, value in (("text_input", "BYTES", "In this example,".encode()), ("stream", "BOOL", stream),
                               ("sampling_parameters", "BYTES", json.dumps(sp).encode()),
                               ("return_finish_reason", "BOOL", True)):
        inputs.append(grpcclient.InferInput(name, [1], dtype))
        inputs[-1].set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else bool))
    got = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(lambda result, error: got.append(error or result))
        client.async_stream_infer(model, inputs=inputs, parameters=sp)
        client.stop_stream()
    if not got or isinstance(got[-1], Exception):
        sys.exit(f"reference request failed: {got[-1:]}")
    reasons.add(got[-1].as_numpy("finish_reason")[0].decode())
    text = "".join(r.as_numpy("text_output")[0].decode() for r in got)
    print(f"  stream={stream}: {len(got)} responses, finish_reason {reasons}, text {text!r}", file=sys.stderr)
if len(reasons) != 1:
    sys.exit(f"streamed and unstreamed finish_reason differ: {reasons}")
print(reasons.pop())
EOF
)
if [[ "$FINISH" != length ]]; then
  subst "$AO" "s/assert finish_reason == \"length\"/assert finish_reason == \"$FINISH\"/" \
    "final finish_reason \"length\" -> \"$FINISH\" (this model's answer to the test's request, above)"
fi

# accuracy: the baselines from this server, and the import-only vLLM stand-in
ACC_DIR="$WORK/$(dirname "$ACC")"
mkdir -p "$WORK/vllm_stub/vllm/engine"
cat >"$WORK/vllm_stub/vllm/__init__.py" <<'EOF'
class SamplingParams:                     # import-only stand-in: accuracy_test.py's baseline modes need vLLM
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
EOF
cat >"$WORK/vllm_stub/vllm/sampling_params.py" <<'EOF'
from vllm import SamplingParams as StructuredOutputsParams  # noqa: F401
EOF
: >"$WORK/vllm_stub/vllm/engine/__init__.py"
echo 'AsyncEngineArgs = None' >"$WORK/vllm_stub/vllm/engine/arg_utils.py"
echo 'AsyncLLMEngine = None' >"$WORK/vllm_stub/vllm/engine/async_llm_engine.py"
echo 'from uuid import uuid4; random_uuid = lambda: uuid4().hex' >"$WORK/vllm_stub/vllm/utils.py"
(cd "$ACC_DIR" && "$PY" - "localhost:$GRPC" "$MODEL" <<'EOF'
# accuracy_test.py --generate-baseline / --generate-structured-baseline, answered by this server: the same
# prompts and sampling parameters, sent as the test sends them (non-streaming, so text_output = prompt + text,
# the baseline's prompt + output.text)
import json, pickle, sys
sys.path.append("../../common")
from test_util import create_vllm_request
import tritonclient.grpc as grpcclient
url, model = sys.argv[1:]
PROMPTS = ["The most dangerous animal is", "The capital of France is", "The future of AI is"]
STRUCTURED_PROMPTS = ["Classify intent of the sentence: Harry Potter is underrated. "]
plain = {"temperature": 0, "top_p": 1}
structured = dict(plain, structured_outputs=json.dumps({"choice": ["Positive", "Negative"]}))
for name, prompts, sp in (("vllm_baseline_output.pkl", PROMPTS, plain),
                          ("vllm_structured_baseline_output.pkl", STRUCTURED_PROMPTS, structured)):
    outs = []
    with grpcclient.InferenceServerClient(url) as client:
        for i, prompt in enumerate(prompts):
            req = create_vllm_request(prompt, i, False, sp, model)
            got = []
            client.start_stream(callback=lambda result, error: got.append(error or result))
            client.async_stream_infer(model_name=model, request_id=req["request_id"], inputs=req["inputs"],
                                      outputs=req["outputs"], parameters=req["parameters"])
            client.stop_stream()
            if len(got) != 1 or isinstance(got[0], Exception):
                sys.exit(f"baseline request failed: {got}")
            outs.extend(got[0].as_numpy("text_output").tolist())
    pickle.dump(outs, open(name, "wb"))
    print(f"  {name}: {outs}")
EOF
) || exit 1
log "accuracy baselines made from this server's answers (above)"

# ---- 3. the suites
declare -A RESULT
FAILED=0
unittest_case() {     # name dir file expected_tests [unittest args...]
  local name=$1 dir=$2 file=$3 n=$4; shift 4
  rm -f "$dir/test_results.txt"
  local rc=0
  (cd "$dir" && PYTHONPATH="$WORK/vllm_stub" "$PY" "$file" "$@") || rc=$?
  if [[ $rc == 0 ]] && "$PY" -c "import json, sys; r = json.load(open(sys.argv[1]))
sys.exit(not (r['total'] == $n and r['errors'] == 0 and r['failures'] == 0))" "$dir/test_results.txt"; then
    RESULT[$name]=passed
  else
    RESULT[$name]=FAILED; FAILED=1
  fi
}

if want additional_outputs; then
  t0=$SECONDS
  log "additional outputs: pytest ${PYTEST_ARGS:--q}"
  # shellcheck disable=SC2086
  if (cd "$WORK/$(dirname "$AO")" && "$PY" -m pytest ${PYTEST_ARGS:--q} -p no:cacheprovider "$(basename "$AO")"); then
    RESULT[additional_outputs]=passed; else RESULT[additional_outputs]=FAILED; FAILED=1; fi
  log "additional outputs: $((SECONDS - t0)) s"
fi

if want accuracy; then
  log "accuracy (unittest, as its test.sh runs it)"
  unittest_case accuracy "$ACC_DIR" accuracy_test.py 2
fi

if want multi_lora; then
  log "multi-LoRA (unittest, as its test.sh runs it, SERVER_ENABLE_LORA=true)"
  export SERVER_ENABLE_LORA=true  # multi_lora_test.py reads it (test.sh sets it so)
  unittest_case multi_lora "$WORK/$(dirname "$LORA")" multi_lora_test.py 2
  log "multi-LoRA: test.sh's generate-endpoint checks"
  if "$PY" - "localhost:$HTTP" "$LORA_MODEL" "$WORK/lora_expected.json" <<'EOF'; then
# test.sh: a valid adapter's answer, and an unknown adapter's error, through the HTTP generate endpoint
import json, sys
import requests
url, model, expected = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
failed = False
for name, want_text, want_error in (("sheep", expected["sheep"], None),
                                    ("unavailable", None, "LoRA unavailable is not supported, we currently support "
                                                          "['doll', 'sheep']")):
    body = {"text_input": "Instruct: Tell me more about soccer\nOutput:",
            "parameters": {"stream": False, "temperature": 0, "top_p": 1, "lora_name": name,
                           "exclude_input_in_output": True}}
    got = requests.post(f"http://{url}/v2/models/{model}/generate", json=body, timeout=300).json()
    ok = got.get("text_output") == want_text if want_error is None else got.get("error") == want_error
    print(f"  {name}: {'ok' if ok else 'FAILED'} {got}")
    failed |= not ok
sys.exit(failed)
EOF
    RESULT[multi_lora_generate]=passed; else RESULT[multi_lora_generate]=FAILED; FAILED=1; fi
fi

if want metrics; then
  MET_DIR="$WORK/$(dirname "$MET")"
  log "metrics: test_vllm_metrics_disabled"
  unittest_case metrics_disabled "$MET_DIR" vllm_metrics_test.py 1 VLLMTritonMetricsTest.test_vllm_metrics_disabled -v
  stop_server
  start_server --allow-metrics=false
  log "metrics: test_vllm_metrics_refused (--allow-metrics=false)"
  unittest_case metrics_refused "$MET_DIR" vllm_metrics_test.py 1 VLLMTritonMetricsTest.test_vllm_metrics_refused -v
fi
stop_server

log "summary ($SECONDS s):"
for k in "${!RESULT[@]}"; do log "  $k: ${RESULT[$k]}"; done
log "  not run (vLLM itself): test_vllm_metrics, test_custom_sampling_params, REPORT_CUSTOM_METRICS / model.json variants"
exit "$FAILED"
