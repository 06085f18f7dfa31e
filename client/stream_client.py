#!/usr/bin/env python3
"""Stream a generation from the Triton model `llm` over gRPC and print it as it arrives.

Examples:
    python client/stream_client.py "Write a haiku about GPUs" --max-tokens 64
    python client/stream_client.py --chat --messages '[{"role":"user","content":"Hi!"}]'
    python client/stream_client.py "Give me a JSON object" --guide-type json --guide @schema.json --json

Text deltas go to stdout as they arrive; the summary line (TTFT, tokens, tok/s, finish reason,
speculative stats) goes to stderr.  With --json, one JSON object (full text, output_ids, stats) is
printed to stdout instead.  An error response prints its message to stderr and exits 1.

Arguments taking JSON or long text (--messages, --sampling-parameters, --guide) accept `@path`
to read the value from a file; a prompt of `-` is read from stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    from specgram.serving import contract
except ImportError:  # a source tree without the engine installed: the contract module is plain Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend"))
    from specgram.serving import contract

# Triton dtypes of the `llm` inputs as tritonclient takes them (STRING is BYTES on the client side)
INPUT_DTYPES = {f.name: f.client_dtype for f in contract.INPUTS}
_NP = {"BYTES": np.object_, "BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32}
SCALAR_OUTPUTS = tuple(f.name for f in contract.OUTPUTS if f.scalar)


def build_inputs(values: dict[str, Any]):
    """name -> python value (str/bool/int/float, list for `stop`, dict/list for JSON inputs), a numpy array
    (its shape kept, cast to the contract's dtype; names outside the contract keep their own dtype), or an
    InferInput sent exactly as built (any dtype and shape: how tests send a wrong dtype under a known name)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, grpcclient.InferInput):
            if value.name() != name:
                raise ValueError(f"InferInput {value.name()!r} given under the name {name!r}")
            inputs.append(value)
            continue
        if isinstance(value, np.ndarray):
            arr, dtype = value, INPUT_DTYPES.get(name) or np_to_triton_dtype(value.dtype)
            inp = grpcclient.InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr.astype(_NP[dtype]) if dtype in _NP else arr)
            inputs.append(inp)
            continue
        if name not in INPUT_DTYPES:
            raise KeyError(f"unknown input {name!r}: pass a numpy array to send it anyway")
        dtype = INPUT_DTYPES[name]
        if name in ("sampling_parameters", "messages", "chat_template_kwargs") and not isinstance(value, (str, bytes)):
            value = json.dumps(value)
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if dtype == "BYTES":
            items = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in items]
        arr = np.array(items, dtype=_NP[dtype])
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def _decode(arr) -> list:
    return [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else x for x in arr.reshape(-1).tolist()]


def _arg_text(value: str | None) -> str | None:
    if value is not None and value.startswith("@"):
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    return value


def _arg_json(value: str | None, kind: type, flag: str):
    text = _arg_text(value)
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{flag}: invalid JSON: {e}") from None
    if not isinstance(obj, kind):
        raise SystemExit(f"{flag}: expected a JSON {kind.__name__}")
    return obj


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default=None, help="text_input ('-' reads stdin)")
    ap.add_argument("--url", default="localhost:8001", help="gRPC endpoint host:port (default %(default)s)")
    ap.add_argument("--model", default="llm", help="model name (default %(default)s)")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--min-tokens", type=int, help="tokens before EOS or a stop string may end the output")
    ap.add_argument(
        "--max-reasoning-chars", type=int, help="a thinking model's reasoning before a guided answer, in characters"
    )
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stop", action="append", help="stop string (repeatable)")
    ap.add_argument("--num-draft-tokens", type=int, help="speculative draft length k (0 = off)")
    ap.add_argument("--drafter", help="ngram | draft_model | grammar (default: the server's configured drafter)")
    ap.add_argument("--ignore-eos", action="store_true", default=None, help="keep generating past EOS")
    ap.add_argument("--guide-type", help="guided_decoding_guide_type (json, json_schema, regex, ebnf, structural_tag)")
    ap.add_argument("--guide", help="guided_decoding_guide (text or @file)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--exclude-input-in-output", dest="exclude_input", action="store_true", default=None)
    g.add_argument("--include-input", dest="exclude_input", action="store_false")
    ap.add_argument("--sampling-parameters", help="JSON object with the same keys as the inputs (or @file)")
    ap.add_argument("--chat", action="store_true", help="apply_chat_template=true")
    ap.add_argument("--messages", help='JSON list of {"role", "content"} (or @file)')
    ap.add_argument(
        "--chat-template-kwargs", help="JSON object of chat-template variables, e.g. '{\"enable_thinking\": false}'"
    )
    s = ap.add_mutually_exclusive_group()
    s.add_argument("--stream", dest="stream", action="store_true", default=None, help="stream=true (default)")
    s.add_argument("--no-stream", dest="stream", action="store_false", help="stream=false: one response")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the human output")
    ap.add_argument("--timeout", type=float, default=600.0, help="overall timeout in seconds (default %(default)s)")
    args = ap.parse_args(argv)
    if args.prompt == "-":
        args.prompt = sys.stdin.read()
    args.sampling_parameters = _arg_json(args.sampling_parameters, dict, "--sampling-parameters")
    args.messages = _arg_json(args.messages, list, "--messages")
    args.chat_template_kwargs = _arg_json(args.chat_template_kwargs, dict, "--chat-template-kwargs")
    args.guide = _arg_text(args.guide)
    if args.prompt is None and args.messages is None:
        ap.error("a prompt or --messages is required")
    return args


def request_values(args: argparse.Namespace) -> dict[str, Any]:
    stream = args.stream
    if stream is None and "stream" not in (args.sampling_parameters or {}):
        stream = True
    return {
        "text_input": args.prompt if args.prompt is not None else "",
        "stream": stream,
        "max_tokens": args.max_tokens,
        "min_tokens": args.min_tokens,
        "max_reasoning_chars": args.max_reasoning_chars,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop,
        "num_draft_tokens": args.num_draft_tokens,
        "drafter": args.drafter,
        "ignore_eos": args.ignore_eos,
        "guided_decoding_guide_type": args.guide_type,
        "guided_decoding_guide": args.guide,
        "exclude_input_in_output": args.exclude_input,
        "sampling_parameters": args.sampling_parameters,
        "apply_chat_template": True if args.chat else None,
        "messages": args.messages,
        "chat_template_kwargs": args.chat_template_kwargs,
        # vllm_backend's switches: the model sends these outputs only when asked
        "return_finish_reason": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }


def run(args: argparse.Namespace) -> int:
    from collect import StreamTimeout, stream_infer

    text_parts: list[str] = []
    output_ids: list[int] = []
    scalars: dict[str, Any] = {}
    error: str | None = None
    n_responses = 0
    t_first = t_last = None
    tokens_in_first = 0
    human = not args.json

    def on_response(resp: dict) -> None:
        nonlocal n_responses, t_first, t_last, tokens_in_first
        outputs = resp["outputs"]
        if outputs:
            n_responses += 1
        delta = "".join(_decode(outputs["text_output"])) if "text_output" in outputs else ""
        ids = outputs["output_ids"].reshape(-1).tolist() if "output_ids" in outputs else []
        if delta or ids:
            if t_first is None:
                t_first = resp["time"]
                tokens_in_first = len(ids)
            t_last = resp["time"]
        text_parts.append(delta)
        output_ids.extend(int(i) for i in ids)
        for name in SCALAR_OUTPUTS:
            if name in outputs:
                v = _decode(outputs[name])[0]
                if name == "num_output_tokens":  # this response's tokens
                    scalars[name] = scalars.get(name, 0) + int(v)
                elif name not in ("finish_reason", "spec_detail") or v not in ("", "None"):  # set on the final one
                    scalars[name] = v
        if human and delta:
            sys.stdout.write(delta)
            sys.stdout.flush()

    t0 = time.perf_counter()
    try:
        responses = stream_infer(
            args.url, request_values(args), model=args.model, timeout=args.timeout, on_response=on_response
        )
        error = responses[-1]["error"]
    except StreamTimeout:
        error = f"timeout after {args.timeout:.0f}s waiting for the final response"
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - t0

    n_out = int(scalars.get("num_output_tokens", len(output_ids)))
    ttft_ms = t_first * 1e3 if t_first is not None else None
    # decode rate: tokens after the first response over the time from the first to the last response
    decode_tok_s = None
    if t_first is not None and t_last is not None and t_last > t_first and n_out > tokens_in_first:
        decode_tok_s = (n_out - tokens_in_first) / (t_last - t_first)
    e2e_end = t_last if t_last is not None else elapsed
    e2e_tok_s = n_out / e2e_end if n_out and e2e_end > 0 else None
    stats = {
        "ttft_ms": ttft_ms,
        "num_output_tokens": n_out,
        "decode_tok_s": decode_tok_s,
        "e2e_tok_s": e2e_tok_s,
        "elapsed_ms": elapsed * 1e3,
        "num_responses": n_responses,
    }

    if args.json:
        out = {
            "text": "".join(text_parts),
            "output_ids": output_ids,
            "finish_reason": scalars.get("finish_reason"),
            "num_input_tokens": scalars.get("num_input_tokens"),
            "num_cached_tokens": scalars.get("num_cached_tokens"),
            "num_output_tokens": n_out,
            "spec_drafted_tokens": scalars.get("spec_drafted_tokens"),
            "spec_accepted_tokens": scalars.get("spec_accepted_tokens"),
            "spec_acceptance_rate": scalars.get("spec_acceptance_rate"),
            "spec_detail": json.loads(scalars["spec_detail"]) if scalars.get("spec_detail") else None,
            "stats": stats,
            "error": error,
        }
        print(json.dumps(out))
    elif n_responses or not error:
        if any(text_parts):
            sys.stdout.write("\n")
            sys.stdout.flush()
        fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
        line = (
            f"[stats] ttft {fmt(ttft_ms, '.1f')} ms | output tokens {n_out} | "
            f"decode {fmt(decode_tok_s, '.1f')} tok/s | e2e {fmt(e2e_tok_s, '.1f')} tok/s | "
            f"finish_reason {scalars.get('finish_reason', 'n/a')}"
        )
        if "num_input_tokens" in scalars:
            line += f" | input tokens {scalars['num_input_tokens']}"
            if scalars.get("num_cached_tokens"):
                line += f" ({scalars['num_cached_tokens']} from the prefix cache)"
        if scalars.get("spec_drafted_tokens"):
            line += (
                f" | spec drafted {scalars['spec_drafted_tokens']} accepted "
                f"{scalars.get('spec_accepted_tokens', 'n/a')} "
                f"rate {fmt(scalars.get('spec_acceptance_rate'), '.3f')}"
            )
        print(line, file=sys.stderr)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
