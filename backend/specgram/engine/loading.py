"""Loading: the target, the tokenizer, the EOS ids and the draft model a configuration names."""
from __future__ import annotations

from pathlib import Path

from ..config import EngineConfig
from ..errors import ModelLoadError
from ..model.runner import ModelRunner
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
                                         static, config.linear)
    tokenizer = load_tokenizer(path)
    draft = None
    if config.draft_checkpoint:
        check_same_tokenizer(tokenizer, load_tokenizer(config.draft_checkpoint), config.draft_checkpoint)
        draft = ModelRunner.from_pretrained(config.draft_checkpoint, config.max_slots, config.max_seq_len, device,
                                            config.torch_dtype("draft_dtype"), static, config.linear)
    if config.draft_quantization == "int8":
        from ..model.quantize import quantize_dynamic_int8
        base = (draft or target).model
        draft = ModelRunner(quantize_dynamic_int8(base), config.max_slots, config.max_seq_len, static)
    drafters: dict[str, Drafter] = {}
    if draft is not None:
        drafters["draft_model"] = DraftModelDrafter(draft, target.vocab_size)
    return target, tokenizer, drafters
