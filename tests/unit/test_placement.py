"""Instance placement: Triton's instance kind / device id + the device parameter -> one device, or a clear error."""

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.settings import device_of, dtype_of
from specgram.errors import ModelLoadError
from specgram.serving.placement import resolve_device


@pytest.mark.parametrize(
    "kind, dev_id, configured, expected",
    [
        ("GPU", "1", "auto", "cuda:1"),
        ("GPU", 0, "cuda", "cuda:0"),
        ("GPU", "2", "cuda:2", "cuda:2"),
        ("KIND_GPU", "3", "auto", "cuda:3"),
        ("CPU", "0", "auto", "cpu"),
        ("CPU", "0", "cpu", "cpu"),
        ("MODEL", "0", "auto", "auto"),
        ("MODEL", "0", "cuda:1", "cuda:1"),
        (None, None, "cpu", "cpu"),
    ],
)
def test_resolve_device(kind, dev_id, configured, expected):
    assert resolve_device(kind, dev_id, configured) == expected


@pytest.mark.parametrize(
    "kind, dev_id, configured, needle",
    [
        ("GPU", "0", "cpu", "KIND_GPU places this instance on GPU 0"),
        ("GPU", "1", "cuda:0", "says 'cuda:0'"),
        ("CPU", "0", "cuda", "KIND_CPU runs this instance on CPU"),
    ],
)
def test_conflicting_placement_is_a_load_error(kind, dev_id, configured, needle):
    with pytest.raises(ModelLoadError, match=needle):
        resolve_device(kind, dev_id, configured)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_a_clear_load_error(device):
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        device_of(EngineConfig(checkpoint="unused", device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a machine without CUDA")
def test_auto_is_cpu_float32_without_cuda():
    cfg = EngineConfig(checkpoint="unused", device="auto")
    assert device_of(cfg).type == "cpu" and dtype_of(cfg.dtype, device_of(cfg)) == torch.float32


@pytest.mark.gpu
def test_auto_is_cuda_bfloat16_with_cuda():
    cfg = EngineConfig(checkpoint="unused", device="auto")
    assert device_of(cfg).type == "cuda" and dtype_of(cfg.dtype, device_of(cfg)) == torch.bfloat16
