"""Loading: the target, the tokenizer, the EOS ids and the draft model, as engine/settings.py resolved them.

On the native forward a model is a skeleton whose weights go one tensor at a time from the checkpoint's files
into their served form (model/checkpoint.py); an int8 draft there reads the target's checkpoint into its own
int8 weights (model/int8.py); the target's own native copy reads and writes the target's KV cache
(nothing to read at admission, no second cache); any other draft has a KV cache of its own. Where the native
forward does not run it, an int8 draft is torch's dynamic-quantized copy (model/quantize.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..errors import ModelLoadError
from ..model import footprint, lora
from ..model.checkpoint import ModuleTensors, release_freed_memory
from ..model.quantize import quantize_dynamic_int8
from ..model.runner import ModelRunner
from ..model.source import GGUF, WHOLE, Source, open_source
from ..model.whole import load_model
from ..speculation import draft_vocab
from ..speculation.draft_model import DraftModelDrafter
from ..speculation.drafter import Drafter
from .settings import Settings

log = logging.getLogger(__name__)


def check_same_tokenizer(tokenizer, draft: Source) -> None:
    """Draft tokens are target tokens: the draft checkpoint's vocabulary must be the target's (`tokenizer`)."""
    draft_tok = draft.tokenizer()
    if tokenizer.get_vocab() != draft_tok.get_vocab():
        raise ModelLoadError(
            f"the draft model at {str(draft.path)!r} does not share the target's tokenizer "
            f"(vocabularies differ: {len(draft_tok)} vs {len(tokenizer)} tokens); "
            "a draft must use exactly the target's tokenizer"
        )


def eos_ids(tokenizer, *configs) -> set[int]:
    """The tokenizer's EOS and each config's eos_token_id (an int, a list, or None): the generation config and
    the model config of a checkpoint both may name some."""
    ids = {tokenizer.eos_token_id} - {None}
    for cfg in configs:
        src = getattr(cfg, "eos_token_id", None)
        if src is not None:
            ids.update(src if isinstance(src, (list, tuple)) else [src])
    return ids


def checkpoint_eos_ids(source: Source, tokenizer) -> set[int]:
    """eos_ids of a checkpoint without loading its weights (what the engine stops on)."""
    return eos_ids(tokenizer, source.generation_config(), source.config())


def model_of(
    source: Source, device, dtype, native: bool, skeleton: torch.nn.Module | None = None
) -> tuple[object, ModuleTensors | None]:
    """A checkpoint's model for a runner -> (model, where the native forward reads its weights). On the native
    forward: a skeleton whose weights are read one tensor at a time into their served form (model/checkpoint.py);
    elsewhere, or for a checkpoint without safetensors files or whose tensors do not fit the skeleton as they are
    (other names, shapes or dtypes, a quantized format), transformers' whole model. skeleton: the source's in
    `dtype`, built already (Checkpoints); None: built here."""
    if native and source.kind != WHOLE:
        model = source.skeleton(dtype) if skeleton is None else skeleton
        files = source.tensors(model)
        tensors = ModuleTensors(model, files)
        why = tensors.unfit(model)
        if why is None:
            return model, tensors
        if source.kind == GGUF:  # no other reader: transformers' would de-quantize the whole model, or fail alike
            raise ModelLoadError(
                f"{source.path}: {why} (the file does not hold a {model.config.model_type} model whole)"
            )
        log.info("%s: %s: loading the whole model through transformers", source.path, why)
    return load_model(source, device, dtype), None


@dataclass(frozen=True)
class Checkpoints:
    """What a load reads of its checkpoints before any weight: each opened once (model/source.py) and, on the CPU,
    each one's skeleton in the dtype it is served in (None elsewhere): built once, the memory check counts it and
    the native forward fills it."""

    target: Source
    draft: Source | None  # None: no draft_checkpoint
    target_model: torch.nn.Module | None = None
    draft_model: torch.nn.Module | None = None


def open_checkpoints(config: EngineConfig, settings: Settings) -> Checkpoints:
    """The target's checkpoint and the draft_checkpoint (settings.draft's), opened, with their skeletons on the CPU."""
    target = open_source(config.checkpoint)
    draft = open_source(config.draft_checkpoint) if config.draft_checkpoint else None
    if settings.device.type != "cpu":  # no memory check and no native forward: no skeleton read
        return Checkpoints(target, draft)
    draft_model = draft.skeleton(settings.draft.dtype) if draft is not None else None
    return Checkpoints(target, draft, target.skeleton(settings.dtype), draft_model)


def footprint_of(
    config: EngineConfig, settings: Settings, checkpoints: Checkpoints | None = None
) -> tuple[list[footprint.Part], tuple[str, ...]]:
    """What the load will keep resident on the CPU, from the checkpoints' skeletons and file headers (nothing else
    read), and the settings that would lower it. checkpoints: the load's, opened already."""
    c = checkpoints or open_checkpoints(config, settings)
    slots, positions = config.max_slots, config.max_seq_len

    def runner(label, source: Source, model, forward, weights, dtype, cache: bool, embedding: bool):
        native = forward.kind == "native"
        kv = torch.bfloat16 if forward.kv_dtype == "bfloat16" else (torch.float32 if native else dtype)
        emb = source.embedding_dtype() if native and source.kind != WHOLE else dtype  # kept as stored, or float32
        part = footprint.kv_part(label, model.config, slots, positions, kv) if cache else None
        return footprint.runner_parts(label, model, weights, dtype, part, emb if embedding else None, native)

    t, target = settings.target, c.target_model
    weights = t.weights if t.kind == "native" else "auto"
    parts = runner("target", c.target, target, t, weights, settings.dtype, True, True)
    remedies = ("weights int8",) if t.kind == "native" and weights == "auto" else ()
    for d in (settings.draft, settings.copy):
        if d is None:
            continue
        own = d.source == "target"
        src, model = (c.target, target) if own else (c.draft, c.draft_model)
        shared = own and d.quantized == "native"  # the target's native copy: its embedding is the target's
        form = "int8" if d.quantized == "torch" else d.forward.weights
        parts += runner("draft copy" if own else "draft", src, model, d.forward, form, d.dtype,
                        not d.shares_cache, not shared)  # fmt: skip
        if own:  # the copy alone, or beside a draft model
            remedies += ("draft_quantization none",) if d is settings.draft else ("draft_quantization int4",)
        elif form == "auto":
            remedies += ("draft_quantization int8",)
    return parts, remedies


def load(config: EngineConfig, settings: Settings) -> tuple[ModelRunner, object, dict[str, Drafter]]:
    """-> (target runner, tokenizer, the configured model drafters by name), as `settings` resolved them. On the
    CPU, a load whose resident bytes would exceed the memory available is refused first (model/footprint.py)."""
    c = open_checkpoints(config, settings)  # each checkpoint opened once: everything below asks them
    if settings.device.type == "cpu":
        parts, remedies = footprint_of(config, settings, c)
        footprint.check(parts, remedies=remedies)
    # the tokenizers first: parsing a GGUF's vocabulary takes more memory than the tokenizer keeps (151k tokens:
    # ~0.6 GB passing), which then never adds to the weights'
    tokenizer = c.target.tokenizer()
    d = settings.draft
    if d is not None and d.source == "checkpoint":
        check_same_tokenizer(tokenizer, c.draft)
    release_freed_memory()
    native = settings.target.kind == "native"
    model, tensors = model_of(c.target, settings.device, settings.dtype, native, c.target_model)
    target = ModelRunner(model, config.max_slots, config.max_seq_len, settings.target, tensors=tensors)
    release_freed_memory()  # the packing's temporaries, before the draft's own
    adapters = load_adapters(config, model) if config.enable_lora else None
    if adapters is not None:
        target.attach_lora(adapters)
    drafters: dict[str, Drafter] = {}
    # the draft model, and the target's copy beside a draft_checkpoint
    for name, choice in settings.models.items():
        runner = _draft_runner(config, settings, choice, tokenizer, target, model, tensors, adapters, c)
        drafters[name] = DraftModelDrafter(runner, target.vocab_size)
        release_freed_memory()
    return target, tokenizer, drafters


def _draft_runner(
    config, settings, d, tokenizer, target: ModelRunner, model, tensors, adapters, c: Checkpoints
) -> ModelRunner:
    """The runner of the draft `d` (settings.py's DraftChoice): a draft_checkpoint's model (c.draft), or the
    target's copy (model, tensors: the target's, which an int8 or int4 copy packs its own weights from)."""
    if d.source == "checkpoint":
        native = d.forward.kind == "native"
        base, base_tensors = model_of(c.draft, settings.device, d.dtype, native, c.draft_model)
    else:
        base, base_tensors = model, tensors
    head = _draft_head(config, tokenizer, base, d.vocab) if d.vocab else None
    if d.quantized == "torch":  # a draft off the native forward: a whole model (settings.py), never a skeleton
        base = quantize_dynamic_int8(base)
    cache = target.cache if d.shares_cache else None
    draft = ModelRunner(
        base, config.max_slots, config.max_seq_len, d.forward, cache=cache, head_ids=head, tensors=base_tensors
    )
    if adapters is not None and config.lora_draft:
        if d.source == "target" and draft.native is not None:
            draft.attach_lora(adapters)  # the target's copy drafts as the adapter's model would
        else:
            log.info(
                "lora_draft: the draft model drafts as its base model (adapters apply to the target's own "
                "copy on the native CPU forward only); the target verifies with each request's adapter"
            )
    return draft


def _draft_head(config: EngineConfig, tokenizer, model, size: int):
    """The draft's reduced vocabulary (speculation/draft_vocab.py): its `size` most frequent ids, and its EOS ids."""
    keep = eos_ids(tokenizer, model.generation_config, model.config)
    try:
        corpus = draft_vocab.read_corpus(config.draft_vocab_corpus) if config.draft_vocab_corpus else None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not read draft_vocab_corpus {config.draft_vocab_corpus!r}: {e}") from e
    return draft_vocab.head_ids(tokenizer, model.config.vocab_size, size, corpus or draft_vocab.builtin_corpus(), keep)


def load_adapters(config: EngineConfig, model) -> lora.Adapters:
    """The LoRA adapters of config.lora_adapters (a multi_lora.json), read for `model`; ModelLoadError naming the
    first that does not fit, or where there are more than max_loras."""
    folders = lora.read_multi_lora(config.lora_adapters)
    if not folders:
        raise ModelLoadError(f"{config.lora_adapters!r} lists no adapters")
    if len(folders) > config.max_loras:
        raise ModelLoadError(f"{config.lora_adapters!r} lists {len(folders)} adapters; max_loras is {config.max_loras}")
    return lora.Adapters([lora.read_adapter(n, p, model, config.max_lora_rank) for n, p in folders.items()])
