"""llama.cpp's own quantizer on a GGUF file: what `llama-quantize IN OUT Q4_K_M` does, through llama-cpp-python's
binding (scripts/compare/setup_llamacpp.sh installs it). Run with that venv's interpreter:

    build/peers/llamacpp/bin/python scripts/compare/llamacpp_quantize.py IN.gguf OUT.gguf [TYPE]

TYPE: a llama_cpp LLAMA_FTYPE_MOSTLY_* name without the prefix (default Q4_K_M). With a random checkpoint
(scripts/random_checkpoint.py) and llama.cpp's converter (F16 out), it makes the quantized file people bring, of a
real model's shapes, without downloading one.
"""

from __future__ import annotations

import ctypes
import sys

import llama_cpp


def main(argv: list[str]) -> int:
    src, dst = argv[0], argv[1]
    kind = argv[2] if len(argv) > 2 else "Q4_K_M"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.nthread = 0  # llama.cpp's default: every core
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    print(f"llama_model_quantize {src} -> {dst} ({kind}): {'ok' if rc == 0 else f'failed ({rc})'}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
