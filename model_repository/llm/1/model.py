"""Triton Python-backend adapter for the specgram engine (decoupled: any number of responses per request).

Only translation lives here: tensors -> protocol.parse -> engine request; engine outputs -> responses.
Threads: Triton calls execute() (returns at once); the EngineLoop thread owns the engine; one sender thread
sends every response, watches for cancelled requests and sets the load gauges. Every request ends with exactly
one FINAL response: refusals (at capacity, shutting down) and the ends of a shutdown included.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

# The engine of the same checkout as this model repository comes first (the adapter and the contract it reads
# must match); without one next to it, the installed package (scripts/setup.sh, the container) is used.
_SOURCE = Path(__file__).resolve().parents[3] / "backend"
if (_SOURCE / "specgram" / "serving" / "contract.py").is_file():
    sys.path.insert(0, str(_SOURCE))

from typing import TYPE_CHECKING

from specgram.errors import EngineError, InvalidRequest, Overloaded
from specgram.serving.placement import resolve_device
from specgram.wire import ErrorKind, FinishReason

if TYPE_CHECKING:
    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine
    from specgram.request import RequestOutput
    from specgram.serving.protocol import ClientRequest


def _import_engine() -> None:
    """The engine's modules (torch, transformers, xgrammar beneath them), imported by initialize() into this
    module's names. Triton's Python backend loads this file twice a load: first in a stub of its own, only to look
    for auto_complete_config (this file has none), then in the instance's stub; imported at the top, torch and the
    engine cost that first stub ~4 s of every model load for nothing."""
    global EngineConfig, truthy, Engine, INPUTS, OUTPUTS, EngineLoop, Metrics, ClientRequest, logprobs_json, parse
    from specgram.config import EngineConfig, truthy
    from specgram.engine.engine import Engine
    from specgram.serving.contract import INPUTS, OUTPUTS
    from specgram.serving.loop import EngineLoop
    from specgram.serving.metrics import Metrics
    from specgram.serving.protocol import ClientRequest, logprobs_json, parse


# contract data type -> numpy dtype of the tensors the adapter builds (STRING travels as bytes objects)
_NUMPY = {
    "STRING": np.object_,
    "BOOL": np.bool_,
    "INT32": np.int32,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP32": np.float32,
}
# Each is_cancelled() is a round trip to the server process; polling every stream every 20 ms cost a 2-core
# machine ~25% of its tokens at 8 streams (CPU demo, SmolLM2-135M). Each stream is asked at most this often;
# a cancelled request stops within about this long.
_CANCEL_CHECK_S = 0.25
_OUTBOX_WAIT_S = 0.05
# Each gauge set is a round trip to the server process too, but publish() sets only the gauges whose value
# changed (admissions and ends: a few per second): the load is looked at this often, so that a gateway's picker
# that scrapes every 50 ms sees a burst of requests land (at 0.5 s it sent a whole burst to one replica).
_GAUGE_PERIOD_S = 0.05


def explicit_model_control(argv: list[str]) -> bool:
    """Whether tritonserver's command line `argv` sets explicit model control (its last --model-control-mode,
    given as one argument or two, names explicit: Triton reads the mode in any case)."""
    mode = None
    for i, arg in enumerate(argv):
        if arg.startswith("--model-control-mode="):
            mode = arg.split("=", 1)[1]
        elif arg == "--model-control-mode" and i + 1 < len(argv):
            mode = argv[i + 1]
    return mode is not None and mode.lower() == "explicit"


def _server_argv() -> list[str]:
    """The command line of the tritonserver that started this stub (its parent); [] where it cannot be read (a
    server embedded in another program's process reads as one without explicit model control)."""
    try:
        return Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _error_code(kind: ErrorKind | None):
    """ErrorKind -> Triton error code (looked up per call: the stub that auto-completes the config imports this
    module without pb_utils.TritonError)."""
    errors = pb_utils.TritonError
    return {ErrorKind.INVALID: errors.INVALID_ARG, ErrorKind.UNAVAILABLE: errors.UNAVAILABLE}.get(kind, errors.INTERNAL)


def _py(value, name: str):
    """numpy element of input `name` -> python value (bytes are decoded as UTF-8)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequest(f"input {name} is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    return value.item() if isinstance(value, np.generic) else value


def read_inputs(request) -> dict:
    """The request's input tensors -> name -> python value: one element for dims [1], a list for dims [-1]."""
    inputs = {}
    for field in INPUTS:
        tensor = pb_utils.get_input_tensor_by_name(request, field.name)
        if tensor is None:
            continue
        arr = tensor.as_numpy().reshape(-1)
        if not field.scalar:
            inputs[field.name] = [_py(v, field.name) for v in arr]
        elif arr.size != 1:
            raise InvalidRequest(f"input {field.name} must hold exactly one element, got {arr.size}")
        else:
            inputs[field.name] = _py(arr[0], field.name)
    return inputs


def read_parameters(request) -> dict:
    try:
        return json.loads(request.parameters() or "{}")
    except (ValueError, AttributeError):  # ValueError: JSONDecodeError, or an integer too long to convert
        return {}


def read_timeout(request) -> float | None:
    """The client's Triton request timeout (microseconds on the wire; 0 = none) in seconds."""
    micros = request.timeout()
    return micros / 1e6 if micros else None


def _load_engine(config: EngineConfig) -> Engine:
    engine = Engine.from_config(config)
    engine.grammar.start()  # the compile workers now: a server's first guided request does not wait for them
    return engine


class _Stream:
    """Adapter-side state of one request: where responses go and what non-streaming mode accumulates."""

    def __init__(self, sender, creq: ClientRequest, prefix: str):
        self.sender = sender
        self.stream = creq.stream
        self.outputs = creq.outputs  # the outputs sent only when asked that this request asked for
        self.top_n = creq.params.logprobs  # None: the logprobs output (when asked) is JSON null
        self.lora_name = creq.params.lora_name  # its LoRA adapter (None: the base model), for the metrics
        self.prefix = prefix  # the prompt text, sent first when the input is included in the output
        self.text: list[str] = []
        self.ids: list[int] = []
        self.logprobs: list = []  # non-streaming: per token, what the single response carries
        self.arrived = time.monotonic()
        self.first_token_at: float | None = None
        self.cancel_checked = time.monotonic()  # last is_cancelled() round trip for this stream


def _model_json(version: Path) -> dict:
    """vllm_backend's <version>/model.json, where one is (its enable_lora is read: Triton's OpenAI frontend lists a
    model's adapters only where it says so); {} where there is none or it is not a JSON object."""
    try:
        raw = json.loads((version / "model.json").read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


class TritonPythonModel:
    def initialize(self, args):
        _import_engine()
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("model 'llm' must be decoupled (model_transaction_policy)")
        params = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        params["checkpoint"] = os.environ.get("SPECGRAM_CHECKPOINT", params.get("checkpoint", ""))
        params["draft_checkpoint"] = os.environ.get("SPECGRAM_DRAFT_CHECKPOINT", params.get("draft_checkpoint", ""))
        version = Path(args["model_repository"]) / args["model_version"]
        if "enable_lora" not in params:  # vllm_backend's model.json switch, which Triton's OpenAI frontend reads too
            params["enable_lora"] = str(_model_json(version).get("enable_lora", "0")).lower()
        if truthy(params["enable_lora"]) and not params.get("lora_adapters"):
            params["lora_adapters"] = str(version / "multi_lora.json")  # vllm_backend's layout
        for key in ("checkpoint", "draft_checkpoint", "draft_vocab_corpus", "lora_adapters"):  # relative: this folder
            if params.get(key) and not Path(params[key]).is_absolute():
                params[key] = str((Path(args["model_repository"]) / params[key]).resolve())
        try:
            params["device"] = resolve_device(
                args.get("model_instance_kind"), args.get("model_instance_device_id"), params.get("device", "auto")
            )
            config = EngineConfig.from_dict(params)
            # loaded on the engine thread, which steps it (loop.py: one OpenMP pool, not two)
            self.loop = EngineLoop.build(lambda: _load_engine(config))
        except EngineError as e:
            raise pb_utils.TritonModelException(str(e)) from e
        self.engine = self.loop.engine
        self.model_name = args["model_name"]
        self.withdrawn = False  # whether this instance has withdrawn itself (its engine is down: loop.down())
        # Only explicit model control lets a model unload itself. Outside it the unload is not even asked for:
        # Triton refuses it with an error whose text the Python backend's server side frees while the stub still
        # reads it, which can crash the stub and abort the server (Triton 2.51).
        self.explicit_control = explicit_model_control(_server_argv())
        # "instance": this instance's own series. Triton hands every instance that asks for the same family and
        # labels the same metric object, and an unloading instance deletes its metrics: on a reload (the new
        # instance loads before the old one unloads) shared series would be freed under the new instance.
        labels = {
            "model": args["model_name"],
            "version": args["model_version"],
            "instance": f"{args.get('model_instance_name', 'llm')}-{os.getpid()}",
        }
        self.metrics = Metrics(
            pb_utils.MetricFamily,
            labels,
            self.engine.config.max_draft_len,
            self.engine.config.max_slots,
            self.engine.target.linear_kind,
            list(self.engine.target.adapters.index) if self.engine.target.adapters is not None else [],
            self.engine.config.lora_metric_prefix,
        )
        self.gauges_at = 0.0  # last time the sender thread looked at the load
        self.streams: dict[int, _Stream] = {}  # owned by the sender thread after submission
        self.outbox: queue.Queue = queue.Queue()
        self.running = True
        self.sender_thread = threading.Thread(target=self._send_loop, name="llm-sender", daemon=True)
        self.sender_thread.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                creq = parse(read_inputs(request), read_parameters(request))
                timeout_s = read_timeout(request)
                req = self.engine.make_request(
                    creq.params,
                    text=creq.text,
                    messages=creq.messages,
                    chat=creq.chat,
                    template_kwargs=creq.template_kwargs,
                )
            except InvalidRequest as e:
                self._send_error(sender, str(e), pb_utils.TritonError.INVALID_ARG)
                continue
            except Overloaded as e:
                self._send_error(sender, str(e), pb_utils.TritonError.UNAVAILABLE)
                continue
            except Exception as e:  # noqa: BLE001 - one request's failure is that request's error alone
                pb_utils.Logger.log_error(f"llm: reading a request failed: {e!r}")
                self._send_error(
                    sender, f"internal error while reading the request: {e!r}", pb_utils.TritonError.INTERNAL
                )
                continue
            prefix = "" if creq.exclude_input_in_output else (creq.text or "")
            self.outbox.put(("open", req.request_id, _Stream(sender, creq, prefix)))
            # a refusal (at capacity, shutting down) comes back through the outbox as the request's final output
            self.loop.submit(req, lambda out: self.outbox.put(("out", out.request_id, out)), timeout_s)
        return None

    def is_ready(self) -> bool:
        """Triton's model readiness (Python backends that ask the model; 2.51's does not)."""
        return self.loop.down() is None

    def _withdraw(self, why: str) -> None:
        """This instance can no longer serve (loop.down(), which also refuses every new request with UNAVAILABLE
        and sets specgram_engine_up to 0). Under explicit model control: ask Triton to unload it, so that its
        readiness (and the server's) says so at once and a load brings a new instance. In the other modes the
        model stays READY (the Python backend of Triton 2.51 never asks is_ready()): its refusals and the gauge
        are what a load balancer sees, and the log says to restart the server."""
        self.withdrawn = True
        if not self.explicit_control:
            pb_utils.Logger.log_error(
                f"llm: {why}; model '{self.model_name}' still reports ready (the server does not run explicit model "
                "control, so it cannot unload itself) and refuses every new request: restart the server"
            )
            return

        def unload():  # on a thread of its own: the unload finalizes this instance, which joins the sender
            try:
                pb_utils.unload_model(self.model_name)
                pb_utils.Logger.log_error(f"llm: {why}; model '{self.model_name}' unloaded itself")
            except Exception as e:  # noqa: BLE001 - the unload refused: stay loaded, refusing every request
                pb_utils.Logger.log_error(
                    f"llm: {why}; unloading model '{self.model_name}' failed ({e}), so it still reports ready: "
                    "restart the server"
                )

        threading.Thread(target=unload, name="llm-withdraw", daemon=True).start()

    def finalize(self):
        self.loop.shutdown()  # every request ends: its final output lands in the outbox
        self.running = False
        self.sender_thread.join(timeout=5)
        self.metrics.release()

    # ---- sender thread ----------------------------------------------------------------------------------

    def _send_loop(self):
        """The sender thread. Nothing may end it while responses are owed: each part of a round is guarded."""
        while self.running or not self.outbox.empty():
            try:
                kind, rid, payload = self.outbox.get(timeout=_OUTBOX_WAIT_S)
                if kind == "open":
                    self.streams[rid] = payload
                else:
                    self._send_output(rid, payload)
            except queue.Empty:
                pass
            except Exception as e:  # noqa: BLE001 - one bad response must not stop every other stream
                pb_utils.Logger.log_error(f"llm: sending a response failed: {e!r}")
            now = time.monotonic()
            for rid, st in list(self.streams.items()):
                if now - st.cancel_checked >= _CANCEL_CHECK_S:
                    st.cancel_checked = now
                    self._check_cancelled(rid, st)
            down = self.loop.down()  # one answer per round: the withdrawal and the engine_up gauge agree
            if not self.withdrawn and down is not None:
                self._withdraw(down)
            if now - self.gauges_at >= _GAUGE_PERIOD_S:
                self.gauges_at = now
                try:
                    self.metrics.publish(self.loop.load, up=down is None)
                except Exception as e:  # noqa: BLE001 - metrics must not stop the responses
                    pb_utils.Logger.log_error(f"llm: setting the load gauges failed: {e!r}")

    def _check_cancelled(self, rid: int, st: _Stream) -> None:
        """A cancelled request is aborted: its final output (finish_reason cancelled) comes back here. A poll that
        fails leaves the stream as it is: the next poll, or the request's own end, settles it."""
        try:
            if st.sender.is_cancelled():
                self.loop.abort(rid)
        except Exception as e:  # noqa: BLE001 - a failed poll must not stop the other streams
            pb_utils.Logger.log_error(f"llm: checking request {rid} for cancellation failed: {e!r}")

    def _send_output(self, rid: int, out: RequestOutput):
        st = self.streams.get(rid)
        if st is None:
            return
        if out.finished:
            del self.streams[rid]
        try:
            self.metrics.record(st, out)
        except Exception as e:  # noqa: BLE001 - metrics must not stop the responses
            pb_utils.Logger.log_error(f"llm: recording metrics failed: {e!r}")
        try:
            self._respond(st, out)
        except Exception as e:  # noqa: BLE001 - the stream still gets its one final response
            pb_utils.Logger.log_error(f"llm: building a response failed: {e!r}")
            if out.finished:
                self._send_error(
                    st.sender, f"internal error while sending the response: {e!r}", pb_utils.TritonError.INTERNAL
                )

    def _respond(self, st: _Stream, out: RequestOutput):
        if out.finish_reason == FinishReason.ERROR:
            self._send_error(st.sender, out.error or "internal error", _error_code(out.error_kind))
            return
        if out.finish_reason == FinishReason.CANCELLED:
            # older Triton Python backends lack the CANCELLED code
            code = getattr(pb_utils.TritonError, "CANCELLED", pb_utils.TritonError.UNAVAILABLE)
            self._send_error(st.sender, out.error or "request cancelled", code)
            return
        if st.stream:
            text, ids, logprobs = st.prefix + out.text, out.token_ids, out.logprobs
            st.prefix = ""
        else:
            st.text.append(out.text)
            st.ids.extend(out.token_ids)
            st.logprobs.extend(out.logprobs or [])
            if not out.finished:
                return
            text, ids, logprobs = st.prefix + "".join(st.text), st.ids, st.logprobs
        self._send(st.sender, self._response(st, out, text, ids, logprobs), out.finished)

    @staticmethod
    def _response(st: _Stream, out: RequestOutput, text: str, ids: list[int], logprobs: list | None):
        spec = out.spec
        values = {
            "text_output": [text.encode("utf-8")],
            "output_ids": ids,
            "finish_reason": [str(out.finish_reason).encode()],  # vllm_backend's: "None" until the final one
            "num_input_tokens": [out.num_input_tokens],
            "num_output_tokens": [len(ids)],
            "logprobs": [logprobs_json(logprobs if st.top_n is not None else None).encode()],
            "cumulative_logprob": [out.cumulative_logprob],
            "num_cached_tokens": [out.num_cached_tokens],
            "spec_drafted_tokens": [spec.drafted if spec else 0],
            "spec_accepted_tokens": [spec.accepted if spec else 0],
            "spec_acceptance_rate": [spec.acceptance_rate if spec else 0.0],
            "spec_acceptance_length": [spec.acceptance_length if spec else 0.0],
            "spec_detail": [json.dumps(spec.detail()).encode() if spec and out.finished else b""],
        }
        tensors = [
            pb_utils.Tensor(f.name, np.array(values[f.name], dtype=_NUMPY[f.dtype]))
            for f in OUTPUTS
            if f.switch is None or f.name in st.outputs
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _send(sender, response, final: bool):
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            sender.send(response, flags=flags)
        except Exception:  # noqa: BLE001 - the client went away; the watcher aborts the request
            pass

    def _send_error(self, sender, message: str, code):
        self._send(sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), final=True)
