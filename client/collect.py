"""One request to a decoupled Triton model over a gRPC stream: every response up to the final one.

Used by stream_client.py, the end-to-end tests and the serving benchmarks. A response is a dict:

    {"outputs": {name: np.ndarray}, "error": str | None, "final": bool, "time": float}

`time` is seconds since the request was sent. The model sends an error as its FINAL response; Triton's gRPC
stream delivers that as the error's message alone (no final marker, no status code), so an error ends the
request.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Callable

import numpy as np
from stream_client import build_inputs


class StreamTimeout(TimeoutError):
    """No final response in time; `responses` holds what did arrive."""

    def __init__(self, message: str, responses: list[dict]):
        super().__init__(message)
        self.responses = responses


# the outputs the model sends only when asked (vllm_backend's switches): this client asks for them unless the
# request's inputs say otherwise (a switch given as None is not sent)
ASK = {"return_finish_reason": True, "return_num_input_tokens": True, "return_num_output_tokens": True}


def stream_infer(
    grpc_url: str,
    inputs: dict[str, Any],
    model: str = "llm",
    timeout: float = 300.0,
    request_id: str = "",
    parameters: dict | None = None,
    on_response: Callable[[dict], None] | None = None,
    request_timeout_us: int | None = None,
) -> list[dict]:
    """Send one request (inputs: name -> value, see stream_client.build_inputs) and return its responses in
    order; on_response sees each one as it arrives. Raises StreamTimeout if nothing final arrives within
    `timeout`; on KeyboardInterrupt the request is cancelled. request_timeout_us: Triton's per-request timeout
    (the model ends the request once it passes: finish_reason timeout)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url.split("://", 1)[-1])
    q: queue.Queue = queue.Queue()
    responses: list[dict] = []
    client.start_stream(callback=lambda result, error: q.put((time.perf_counter(), result, error)))
    t0 = time.perf_counter()
    cancel = False
    try:
        client.async_stream_infer(
            model,
            build_inputs({**ASK, **inputs}),
            request_id=request_id,
            parameters=parameters,
            enable_empty_final_response=True,
            timeout=request_timeout_us,
        )
        deadline = t0 + timeout
        while True:
            try:
                t, result, err = q.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                raise StreamTimeout(
                    f"no final response within {timeout:.0f}s; got {len(responses)} responses: {responses[-3:]}",
                    responses,
                ) from None
            resp = _response(result, err, t - t0)
            responses.append(resp)
            if on_response is not None:
                on_response(resp)
            if resp["final"]:
                return responses
    except KeyboardInterrupt:
        cancel = True
        raise
    finally:
        try:
            client.stop_stream(cancel_requests=cancel)
        finally:
            client.close()


def _response(result, err, seconds: float) -> dict:
    """A stream callback's (result, error) -> a response dict (see the module docstring)."""
    if err is not None:
        msg = err.message() if hasattr(err, "message") else str(err)
        return {"outputs": {}, "error": msg, "final": True, "time": seconds}
    r = result.get_response()
    final = bool(r.parameters["triton_final_response"].bool_param) if "triton_final_response" in r.parameters else False
    return {
        "outputs": {o.name: result.as_numpy(o.name) for o in r.outputs},
        "error": None,
        "final": final,
        "time": seconds,
    }


def cut_stream(
    grpc_url: str,
    inputs: dict[str, Any],
    after_responses: int | None = None,
    after_seconds: float = 60.0,
    model: str = "llm",
) -> list[dict]:
    """Send one request and cancel it the way a client that goes away does (stop_stream(cancel_requests=True),
    then close the connection) once `after_responses` responses have arrived (None: no such limit; 0: at once)
    or `after_seconds` have passed, whichever comes first. Returns the responses that arrived before the cut; a
    request that ends sooner returns complete (its last response final)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url.split("://", 1)[-1])
    q: queue.Queue = queue.Queue()
    responses: list[dict] = []
    client.start_stream(callback=lambda result, error: q.put((time.perf_counter(), result, error)))
    t0 = time.perf_counter()
    try:
        client.async_stream_infer(model, build_inputs({**ASK, **inputs}), enable_empty_final_response=True)
        while after_responses is None or len(responses) < after_responses:
            try:
                t, result, err = q.get(timeout=max(0.0, t0 + after_seconds - time.perf_counter()))
            except queue.Empty:
                break
            responses.append(_response(result, err, t - t0))
            if responses[-1]["final"]:
                break
    finally:
        try:
            client.stop_stream(cancel_requests=True)
        finally:
            client.close()
    return responses


def _decode(x):
    return x.decode("utf-8", errors="replace") if isinstance(x, bytes) else x


def text_of(responses: list[dict]) -> str:
    """Concatenation of every text_output element of every response (the full text when streaming)."""
    return "".join(
        _decode(x)
        for r in responses
        if "text_output" in r["outputs"]
        for x in r["outputs"]["text_output"].reshape(-1).tolist()
    )


def ids_of(responses: list[dict]) -> list[int]:
    """Concatenation of output_ids over the responses."""
    return [
        int(i)
        for r in responses
        if "output_ids" in r["outputs"]
        for i in r["outputs"]["output_ids"].reshape(-1).tolist()
    ]


def last_value(responses: list[dict], name: str, default=None):
    """The last non-empty scalar value of output `name` (decoded str for STRING outputs; a non-final
    finish_reason, "None", counts as empty)."""
    for r in reversed(responses):
        arr = r["outputs"].get(name)
        if arr is not None and arr.size:
            v = _decode(arr.reshape(-1)[0].item() if arr.dtype != np.object_ else arr.reshape(-1)[0])
            if v not in ("", "None"):
                return v
    return default


def total_of(responses: list[dict], name: str) -> int:
    """The sum of a per-response count (num_output_tokens) over the responses."""
    return sum(int(r["outputs"][name].reshape(-1)[0]) for r in responses if name in r["outputs"])


def errors_of(responses: list[dict]) -> list[str]:
    return [r["error"] for r in responses if r["error"]]
