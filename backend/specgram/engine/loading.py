"""Loading: the target, the tokenizer, the EOS ids and the draft model a configuration names.

draft_quantization int8: the draft is an int8 copy of draft_checkpoint's model, or of the target's when there is
none. Where the native CPU forward runs that model it is an int8 copy on the native
kernels (model/int8.py: a scale per output channel; it shares the loaded model with the target rather than
copying it): int8 weights and activations quantized per row to int16 (weights "int8-dynamic") where the CPU has
VNNI, else int8 weights with fp32 activations ("int8"); elsewhere it is torch's dynamic-quantized copy
(model/quantize.py). The target's own native copy reads and writes the target's KV cache (nothing to read at
admission, no second cache); any other draft has a KV cache of its own.
draft_quantization auto: the target's int8 copy where the native forward runs the target, else no draft model.
weights int8 (the target's): the same native int8 forms, int16 activations where the CPU has VNNI, else fp32 ones.
"""
from __future__ import annotations

from pathlib import Path

from ..config import EngineConfig
from ..errors import ModelLoadError
from ..model import kernels
from ..model.int8 import DYNAMIC
from ..model.runner import ModelRunner, choose_forward, load_model
from ..speculation.draft_model import DraftModelDrafter
from ..speculation.drafter import Drafter


def load_tokenizer(path: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise ModelLoadError(f"could not load the tokenizer from {path!r}: {e}") from e


def check_same_tokenizer(target_tok, draft_tok, draft_path: str) -> None:
    """Draft tokens are target tokens: the two vocabularies must be identical."""
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ModelLoadError(f"the draft model at {draft_path!r} does not share the target's tokenizer "
                             f"(vocabularies differ: {len(draft_tok)} vs {len(target_tok)} tokens); "
                             "a draft must use exactly the target's tokenizer")


def eos_ids(tokenizer, *configs) -> set[int]:
    """The tokenizer's EOS and each config's eos_token_id (an int, a list, or None): the generation config and
    the model config of a checkpoint both may name some."""
    ids = {tokenizer.eos_token_id} - {None}
    for cfg in configs:
        src = getattr(cfg, "eos_token_id", None)
        if src is not None:
            ids.update(src if isinstance(src, (list, tuple)) else [src])
    return ids


def checkpoint_eos_ids(path: str, tokenizer) -> set[int]:
    """eos_ids of a checkpoint folder without loading its weights (what the engine stops on)."""
    from transformers import AutoConfig, GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(path)
    except OSError:                                  # no generation_config.json
        gen = None
    return eos_ids(tokenizer, gen, AutoConfig.from_pretrained(path))


def load(config: EngineConfig) -> tuple[ModelRunner, object, dict[str, Drafter]]:
    """-> (target runner, tokenizer, the configured model drafters by name)."""
    path = str(Path(config.checkpoint))
    device = config.torch_device()
    static = config.max_draft_len + 1 if config.cuda_graphs else 0   # widest graphed forward: a verify
    target = ModelRunner.from_pretrained(path, config.max_slots, config.max_seq_len, device, config.torch_dtype(),
                                         static, config.linear, target_weights(config), config.kv_cache_dtype)
    tokenizer = load_tokenizer(path)
    draft = None
    base = target.model                              # the model the draft is (a copy of)
    if config.draft_checkpoint:
        check_same_tokenizer(tokenizer, load_tokenizer(config.draft_checkpoint), config.draft_checkpoint)
        base = load_model(config.draft_checkpoint, device, config.torch_dtype("draft_dtype"))
        if config.draft_quantization != "int8":
            draft = ModelRunner(base, config.max_slots, config.max_seq_len, static, config.linear)
    if draft_quantization(config, target) == "int8":
        draft = int8_draft(base, config, static, target)
    drafters: dict[str, Drafter] = {}
    if draft is not None:
        drafters["draft_model"] = DraftModelDrafter(draft, target.vocab_size)
    elif config.drafter == "draft_model":
        raise ModelLoadError("drafter 'draft_model': draft_quantization auto found no draft model to load here "
                             "(the native CPU forward does not run the target); set draft_checkpoint")
    return target, tokenizer, drafters


def draft_quantization(config: EngineConfig, target: ModelRunner) -> str:
    """config.draft_quantization with auto resolved: int8 where the native forward runs an fp32 / bf16 target
    and no draft checkpoint is named, else none."""
    if config.draft_quantization != "auto":
        return config.draft_quantization
    native = target.native is not None and target.weights == "auto"
    return "int8" if native and not config.draft_checkpoint else "none"


def int8_form(lib) -> str:
    """The native runner weights that int8 means on kernel library `lib`: int8 weights with activations quantized
    per row to int16 where the CPU has VNNI (as accurate as fp32 activations, and no conversion of each weight in
    the product: model/int8.py), else with fp32 activations."""
    return DYNAMIC if lib is not None and kernels.has_vnni(lib) else "int8"


def target_weights(config: EngineConfig) -> str:
    """The target runner's weights for config.weights (int8: int8_form; the config validated that the native
    forward runs)."""
    return int8_form(kernels.load()) if config.weights == "int8" else config.weights


def int8_draft(model, config: EngineConfig, static: int, target: ModelRunner | None = None) -> ModelRunner:
    """An int8 copy of `model` as a draft runner: where the native forward runs it, int8 weights with int16
    activations on a CPU with VNNI (as close to the target as int8 weights alone and cheaper: int8 activations
    would be cheaper still at M = 8 but agree with it less, int8.py), else int8 weights; elsewhere torch's
    dynamic quantization (which the PyTorch forward runs).
    The native copy of the target's own model shares the target's KV cache: it attends to the target's K and V
    of every committed token (closer drafts than its own int8 ones), reads no prompt at admission and feeds only
    the last committed token a step (docs/performance.md, "The copy shares the target's KV cache"). A copy of
    another checkpoint keeps a bfloat16 cache of its own (at 8 streams attention reads as many bytes as the
    int8 weights; a draft may be lossy, the target verifies)."""
    kind, lib = choose_forward(model, config.linear, static)
    if kind == "native":
        if target is not None and target.native is not None and model is target.model:
            return ModelRunner(model, config.max_slots, config.max_seq_len, static, config.linear,
                               weights=int8_form(lib), cache=target.cache)
        return ModelRunner(model, config.max_slots, config.max_seq_len, static, config.linear,
                           weights=int8_form(lib), kv_dtype="bfloat16")
    from ..model.quantize import quantize_dynamic_int8
    return ModelRunner(quantize_dynamic_int8(model), config.max_slots, config.max_seq_len, static)
