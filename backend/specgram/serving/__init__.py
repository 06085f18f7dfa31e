"""Serving: what stands between a client and the engine, without Triton itself.

contract   the client contract (inputs, outputs, options), one table that config.pbtxt, the adapter, the parser,
           the client and the docs follow
protocol   client tensors and request parameters -> a validated request
loop       the engine thread (EngineLoop): submit/abort from any thread, serving limits, shutdown
admission  the waiting bound, queue and run deadlines
placement  which device a model instance runs on
metrics    the Prometheus families a server exports (given Triton's metric API by the adapter)
"""
