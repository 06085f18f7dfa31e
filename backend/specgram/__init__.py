"""specgram: a continuous-batching LLM engine built for draft/target speculative decoding under grammars.

The engine never imports Triton; model_repository/llm/1/model.py is a thin adapter over it.
"""
from .config import EngineConfig
from .errors import EngineError, InvalidRequest, ModelLoadError
from .request import RequestOutput, SamplingParams

__all__ = ["EngineConfig", "EngineError", "InvalidRequest", "ModelLoadError", "RequestOutput", "SamplingParams"]
