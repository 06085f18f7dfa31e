"""Every "auto" of an EngineConfig resolved once, for this machine and these checkpoints: Settings, the typed
record that loading, the engine and the intake read. A few settings are resolved where they are used, from the
config and what loading made: the tree budget (`tree_nodes`, speculation/trees.py), coupled sampling
(`speculative_sampling`) and grammar overlap (on CUDA) in engine.py, the sliding window in model/runner.py, and
`lora_draft` in loading.py (which logs where it cannot apply).

config.py checks each setting's own words and ranges; `resolve` decides what depends on the machine (CUDA, the
kernels' ISA, VNNI), on the checkpoints (family, dtype) and on the other settings, and refuses a combination
that cannot hold with one ModelLoadError naming the settings. It reads the checkpoints' config.json only: no
weights are loaded.

  device auto                cuda where available, else cpu
  dtype / draft_dtype auto   bfloat16 on CUDA, float32 on CPU
  linear auto                the native CPU forward where it runs (model/choice.py), else PyTorch's
  weights int8               int8 weights with int8 activations per 256 inputs where the CPU has VNNI, else fp32
  weights int4               4-bit weights with int8 activations, a scale per 256 inputs (VNNI where the CPU has it)
  weights auto, a GGUF file  its own forms on the native forward: int4 where its blocks are Q4_K (kept exactly),
                             int8 elsewhere (model/gguf_checkpoint.py)
  draft_quantization auto    the target's copy where the native forward runs a float target and no
                             draft_checkpoint is named: int4 from 1B matmul weights up (INT4_COPY_PARAMS), else
                             int8; a draft_checkpoint in int4 where the native forward runs (docs/performance.md,
                             real draft models), and beside it the target's copy where that loads (drafter
                             `copy`: auto requests draft with whichever model pays more); else none
  drafter auto               draft_model where a draft model is loaded, else ngram
  draft_vocab auto           32768 entries where the vocabulary is larger than 65536 and the draft runs on the
                             native forward, else all
  prefix_cache auto          on where reused KV is bitwise what a prefill writes (the native forward)
  reasoning_end auto         "</think>" where the tokenizer has it and the chat template opens <think> (resolved
                             with the tokenizer: reasoning_end_of)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import DTYPES, EngineConfig
from ..drafting import names, registry
from ..errors import ModelLoadError
from ..model import families
from ..model.choice import ForwardChoice, choose, served_form
from ..model.gguf_checkpoint import STORED
from ..model.source import GGUF, open_source
from ..speculation import draft_vocab


@dataclass(frozen=True)
class DraftChoice:
    source: str  # "target" (a copy of the target's model) | "checkpoint" (draft_checkpoint's)
    dtype: torch.dtype  # the dtype its model is loaded in
    quantized: str  # "none" | "native" (int8 or int4 weights on the native forward) | "torch" (dynamic int8)
    forward: ForwardChoice
    shares_cache: bool  # reads and writes the target's KV cache (the target's native int8 copy)
    vocab: int = 0  # the vocabulary entries its head computes (draft_vocab); 0: all of them


@dataclass(frozen=True)
class Settings:
    device: torch.device
    dtype: torch.dtype  # the target's weights as loaded
    target: ForwardChoice
    draft: DraftChoice | None  # None: no draft model
    drafter: str  # a request's drafter when it names none (drafting/registry.py)
    prefix_cache: bool
    copy: DraftChoice | None = None  # the target's copy beside a draft_checkpoint (drafter `copy`); None: none

    @property
    def models(self) -> dict[str, DraftChoice]:
        """The model drafters to load, by drafter name (model_drafters)."""
        return model_drafters(self.draft, self.copy)


def model_drafters(draft: DraftChoice | None, copy: DraftChoice | None) -> dict[str, DraftChoice]:
    """The drafters whose models loading makes (registry: declared without `make`), by name: the draft model and
    the target's copy beside it, where they are chosen."""
    return {n: c for n, c in ((names.DRAFT_MODEL, draft), (names.COPY, copy)) if c is not None}


THINK_END = "</think>"


def reasoning_end_of(setting: str, tokenizer) -> str:
    """config.reasoning_end on this checkpoint's tokenizer: the marker that ends a thinking model's reasoning, or
    "" (none)."""
    if setting in ("none", ""):
        return ""
    if setting != "auto":
        return setting
    template = str(getattr(tokenizer, "chat_template", None) or "")
    return THINK_END if THINK_END in tokenizer.get_vocab() and "<think>" in template else ""


def device_of(config: EngineConfig) -> torch.device:
    """config.device on this machine; ModelLoadError where it names a GPU that is not here."""
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(config.device)  # config.py checked the words
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {config.device!r} was asked for, but CUDA is not available here "
                "(no GPU, or a CPU-only torch build): use device cpu or auto"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {config.device!r} was asked for, but only {torch.cuda.device_count()} "
                "CUDA device(s) are visible"
            )
    return dev


def dtype_of(value: str, device: torch.device) -> torch.dtype:
    """A dtype setting: auto = bfloat16 on CUDA, float32 on CPU."""
    if value == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[value]


def resolve(config: EngineConfig, target_cfg=None, draft_cfg=None) -> Settings:
    """The settings of `config` on this machine. target_cfg / draft_cfg: the checkpoints' HF configs (read from
    their folders when not given)."""
    device = device_of(config)
    dtype = dtype_of(config.dtype, device)
    target_cfg = target_cfg if target_cfg is not None else _hf_config(config.checkpoint)
    static = config.max_draft_len + 1 if config.cuda_graphs else 0  # widest graphed forward: a verify
    target = choose(target_cfg, device, dtype, config.linear, config.weights, config.kv_cache_dtype, static)
    if config.weights != "auto":  # int8, int4 (choose() checked that the machine runs it)
        target = dataclasses.replace(target, weights=served_form(config.weights, target.lib))
    else:
        target = _as_stored(target, config.checkpoint)
    draft = _draft(config, device, dtype, target_cfg, target, draft_cfg, static)
    copy = None
    if draft is not None and draft.source == "checkpoint" and config.draft_quantization == "auto":
        quantization = _copy_quantization(device, target, target_cfg)
        copy = _choice(config, device, dtype, target_cfg, target, None, static, quantization, "target")
    models = model_drafters(draft, copy)
    drafter = config.drafter
    # the drafters this engine will have: every one built by its `make` (it may still turn itself off) and the
    # model drafters whose model loads
    have = {n for n, spec in registry.DRAFTERS.items() if spec.make is not None or n in models}
    if drafter == "auto":
        drafter = registry.default(have)
    elif drafter not in have:
        why = (
            "draft_quantization auto found no draft model to load here (the native CPU forward does not run a "
            "float target)"
            if config.draft_quantization == "auto"
            else "none is configured"
        )
        raise ModelLoadError(
            f"drafter {drafter!r} needs {registry.DRAFTERS[drafter].needs}, and {why}: set draft_checkpoint or "
            "draft_quantization int8"
        )
    reuse = config.prefix_cache == "on" or (config.prefix_cache == "auto" and target.kind == "native")
    return Settings(device, dtype, target, draft, drafter, reuse, copy)


def _as_stored(forward: ForwardChoice, path: str) -> ForwardChoice:
    """A GGUF checkpoint's native forward under weights auto: the file's own forms (STORED); any other forward or
    checkpoint as it is."""
    if forward.kind != "native" or open_source(path).kind != GGUF:
        return forward
    return dataclasses.replace(forward, weights=STORED)


# The target's own copy drafts in int4 from this many matmul weights up, in int8 below. Through tritonserver, one
# stream (docs/performance.md, "The target's copy: int8 or int4"): at 1.5B the int4 copy reads 0.15 of a target step's
# bytes against int8's 0.25 and came out ahead on chat and guided JSON despite fewer accepted drafts; at 135M a step
# is not bound by its bytes and the int8 copy's better drafts won on chat (2.38-2.51x no speculation against
# 2.09-2.17x).
INT4_COPY_PARAMS = 1_000_000_000


def _draft(
    config: EngineConfig, device, dtype, target_cfg, target: ForwardChoice, draft_cfg, static: int
) -> DraftChoice | None:
    quantization = config.draft_quantization
    if quantization == "auto":
        if config.draft_checkpoint:  # a draft model: in int4 where the native forward runs
            quantization = "int4" if target.kind == "native" and device.type == "cpu" else "none"
        else:
            quantization = _copy_quantization(device, target, target_cfg)
    if quantization == "none" and not config.draft_checkpoint:
        return None
    if quantization in ("int8", "int4") and device.type != "cpu":
        raise ModelLoadError(f"draft_quantization {quantization} runs on CPU only (use a smaller draft model on GPU)")
    source = "checkpoint" if config.draft_checkpoint else "target"
    return _choice(config, device, dtype, target_cfg, target, draft_cfg, static, quantization, source)


def _copy_quantization(device, target: ForwardChoice, target_cfg) -> str:
    """draft_quantization auto for the target's copy: where the native forward runs a float target, int4 for a
    target of INT4_COPY_PARAMS matmul weights or more, else int8; "none" (no copy) elsewhere."""
    if target.kind != "native" or target.weights != "auto" or device.type != "cpu":
        return "none"
    return "int4" if families.matmul_params(target_cfg) >= INT4_COPY_PARAMS else "int8"


def _choice(
    config: EngineConfig, device, dtype, target_cfg, target, draft_cfg, static: int, quantization: str, source: str
) -> DraftChoice | None:
    """The draft model of `source` ("target": the target's copy; "checkpoint": draft_checkpoint's) in
    `quantization` (none, int8, int4); None for a copy in none (no copy)."""
    if quantization == "none" and source == "target":
        return None
    if source == "checkpoint":
        cfg = draft_cfg if draft_cfg is not None else _hf_config(config.draft_checkpoint)
        base = dtype_of(config.draft_dtype, device)
    else:
        cfg, base = target_cfg, dtype
    forward = choose(cfg, device, base, config.linear, static_width=static)
    vocab = _draft_vocab(config, cfg, forward)
    if quantization == "none":
        if source == "checkpoint":
            forward = _as_stored(forward, config.draft_checkpoint)
        return DraftChoice(source, base, "none", forward, False, vocab)
    if forward.kind != "native":  # PyTorch's dynamic-quantized copy, which the torch forward runs
        if quantization == "int4":
            raise ModelLoadError("draft_quantization int4 runs on the native CPU forward only, which does not run here")
        return DraftChoice(source, base, "torch", forward, False)
    # the target's own native copy attends to the target's K and V of every committed token (closer drafts than
    # its own int8 ones: docs/performance.md, "The copy shares the target's KV cache"); a copy of another
    # checkpoint keeps a bfloat16 cache of its own (a draft may be lossy, the target verifies)
    shares = source == "target" and target.kind == "native"
    weights = served_form(quantization, forward.lib, target=False)
    forward = choose(cfg, device, base, config.linear, weights, "auto" if shares else "bfloat16", static)
    return DraftChoice(source, base, "native", forward, shares, vocab)


def _draft_vocab(config: EngineConfig, cfg, forward: ForwardChoice) -> int:
    """The entries a draft's head computes (0: all): a reduced vocabulary runs on the native forward only."""
    size = draft_vocab.size_of(config.draft_vocab, cfg.vocab_size)
    if size >= cfg.vocab_size:
        return 0
    if forward.kind != "native":
        if config.draft_vocab > 0:
            raise ModelLoadError(
                f"draft_vocab {config.draft_vocab} runs on the native CPU forward only, which does not run the draft "
                "here (use draft_vocab auto or full)"
            )
        return 0
    return size


def _hf_config(path: str):
    return open_source(path).config()  # a supported family's, or ModelLoadError saying why
