"""A stand-in for triton_python_backend_utils with the parts model.py uses, to drive the adapter in-process."""

from __future__ import annotations

import json
import threading

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonModelException(Exception):
    pass


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self.output_tensors = {t.name(): t.as_numpy() for t in (output_tensors or [])}
        self.error = error


class ResponseSender:
    """Records what the model sends; `cancel()` plays the client going away."""

    def __init__(self):
        self.responses: list[tuple[InferenceResponse | None, int]] = []
        self.done = threading.Event()
        self._cancelled = False
        self.cancel_checks = 0

    def send(self, response=None, flags=0):
        assert not self.done.is_set(), "a response was sent after the FINAL flag"
        self.responses.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    def is_cancelled(self) -> bool:
        self.cancel_checks += 1  # each is a round trip to the server process in real Triton
        return self._cancelled

    def cancel(self):
        self._cancelled = True


class InferenceRequest:
    def __init__(self, inputs: dict[str, np.ndarray], parameters: dict | None = None, timeout_us: int = 0):
        self.inputs = inputs
        self._parameters = json.dumps(parameters or {})
        self._timeout_us = timeout_us
        self.sender = ResponseSender()

    def get_response_sender(self):
        return self.sender

    def parameters(self) -> str:
        return self._parameters

    def timeout(self) -> int:
        """The client's request timeout in microseconds (0 = none), as Triton passes it."""
        return self._timeout_us


def get_input_tensor_by_name(request: InferenceRequest, name: str):
    arr = request.inputs.get(name)
    return None if arr is None else Tensor(name, arr)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return model_config.get("model_transaction_policy", {}).get("decoupled", False)


class _Metric:
    def __init__(self, family, labels, buckets=None):
        import weakref

        self._family_ref = weakref.ref(family)  # Triton too: a Metric does not keep its family alive
        self.labels, self.buckets = labels, buckets
        self._value = 0.0
        self.observations: list[float] = []

    @property
    def family(self):
        fam = self._family_ref()
        if fam is None:
            raise TritonModelException("Invalid metric operation as the corresponding 'MetricFamily' has been deleted")
        return fam

    def increment(self, value):
        assert self.family.kind == MetricFamily.COUNTER and value >= 0
        self._value += value

    def set(self, value):
        assert self.family.kind == MetricFamily.GAUGE
        self._value = value

    def observe(self, value):
        assert self.family.kind == MetricFamily.HISTOGRAM and self.buckets
        self.observations.append(value)

    def value(self):
        return self._value


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    registry: dict[str, list] = {}  # name -> every Metric created under that name (for the tests to read)

    def __init__(self, name, description, kind):
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels=None, buckets=None):
        m = _Metric(self, labels or {}, buckets)
        MetricFamily.registry.setdefault(self.name, []).append(m)
        return m


def on_port(name: str) -> list:
    """The series of `name` still exported: Triton's Python backend deletes a family's series when the family goes
    (and not before: the family holds every series it made)."""
    return [m for m in MetricFamily.registry.get(name, []) if m._family_ref() is not None]


unloaded: list[str] = []  # the models unload_model() was asked to unload, in order


# Triton's answer to an unload outside explicit model control (modes none and poll), set to act as those modes
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
model_control = {"explicit": True}
refused_unloads: list[str] = []  # the models whose unload was asked for outside explicit model control


def server_argv() -> list[str]:
    """The command line of the fake server, in the model-control mode model_control says (the tests load model.py
    with this in place of its reading of the real server's)."""
    return ["tritonserver", "--model-control-mode=" + ("explicit" if model_control["explicit"] else "none")]


def unload_model(model_name: str) -> None:
    """Triton's unload (explicit model-control mode): recorded here; the tests finalize the model themselves.
    With model_control["explicit"] False, refused as Triton refuses it in the other modes."""
    if not model_control["explicit"]:
        refused_unloads.append(model_name)
        raise TritonModelException(NOT_EXPLICIT)
    unloaded.append(model_name)


class Logger:
    errors: list[str] = []

    @staticmethod
    def log_error(msg):
        Logger.errors.append(msg)

    @staticmethod
    def log_info(msg):
        pass

    @staticmethod
    def log_warn(msg):
        pass
