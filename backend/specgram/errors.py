"""Errors the engine raises; each maps to one Triton error code in the adapter."""


class EngineError(Exception):
    """Base class."""


class InvalidRequest(EngineError):
    """The request itself is wrong (bad type, value, prompt, guide). Maps to INVALID_ARG."""


class ModelLoadError(EngineError):
    """The checkpoint or the engine settings cannot be used; raised at load time with an actionable message."""


class Overloaded(EngineError):
    """The server is at a limit right now (e.g. too many guides waiting to compile); retrying later may
    succeed. Maps to UNAVAILABLE."""
