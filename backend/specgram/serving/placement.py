"""Where a model instance runs: the serving layer's instance kind and device id + the configured device.

Pure string logic (no Triton import): the Triton adapter passes args["model_instance_kind"] ("CPU", "GPU" or
"MODEL") and args["model_instance_device_id"]; other front ends pass None.

    kind   configured device     -> device
    GPU    auto | cuda           -> cuda:<device_id>    (Triton chose the GPU: instance_group KIND_GPU)
    GPU    cuda:<device_id>      -> cuda:<device_id>
    GPU    cpu | cuda:<other>    -> error (the two settings disagree)
    CPU    auto | cpu            -> cpu
    CPU    cuda...               -> error
    MODEL / None  anything       -> unchanged (the `device` parameter decides; auto = cuda when available)
"""

from __future__ import annotations

from ..errors import ModelLoadError


def resolve_device(instance_kind: str | None, device_id: int | str | None, configured: str) -> str:
    kind = (instance_kind or "MODEL").upper().removeprefix("KIND_")
    configured = configured or "auto"
    if kind == "GPU":
        want = f"cuda:{int(device_id or 0)}"
        if configured in ("auto", "cuda", want):
            return want
        raise ModelLoadError(
            f"instance_group KIND_GPU places this instance on GPU {int(device_id or 0)}, but the "
            f"device parameter says {configured!r}: set device to auto (or use KIND_MODEL to let "
            "the device parameter decide)"
        )
    if kind == "CPU":
        if configured in ("auto", "cpu"):
            return "cpu"
        raise ModelLoadError(
            f"instance_group KIND_CPU runs this instance on CPU, but the device parameter says "
            f"{configured!r}: use KIND_GPU or KIND_MODEL for a GPU"
        )
    return configured
