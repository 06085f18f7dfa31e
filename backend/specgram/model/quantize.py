"""Cheaper copies of a model for use as a speculative draft (CPU): int8 dynamic quantization, for the PyTorch
forward. Where the native CPU kernels run the model, the int8 draft is an int8 weight-only copy on them instead
(int8.py; engine/loading.py chooses); this is the fallback elsewhere.

Dynamic quantization stores each nn.Linear's weight as int8 (per output channel) and quantizes the
activations per call; on x86 CPUs (fbgemm / oneDNN) the int8 GEMMs read 4x fewer weight bytes than fp32.
The embedding stays fp32 (so ModelRunner still sees float32 parameters and keeps an fp32 KV cache);
the tied lm_head becomes an int8 copy of its own (the embedding keeps the fp32 original).
The result is for drafting only: its greedy agreement with the fp32 model is far below 100%.
"""

from __future__ import annotations

import copy

import torch


def quantize_dynamic_int8(model: torch.nn.Module) -> torch.nn.Module:
    """-> an int8 dynamic-quantized copy of `model` (CPU only; `model` is left unchanged).

    Every nn.Linear (q/k/v/o projections, the MLP and lm_head) is replaced by
    torch.ao.nn.quantized.dynamic.Linear, which ModelRunner calls exactly like nn.Linear."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 dynamic quantization runs on CPU only")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(copy.deepcopy(model).float().eval(), {torch.nn.Linear: per_channel_dynamic_qconfig})
