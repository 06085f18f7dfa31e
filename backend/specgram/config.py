"""Engine settings as written (config.pbtxt parameters), each checked for its own words and range; what they
mean on this machine and these checkpoints (every "auto", and the combinations) is resolved once, at load, by
engine/settings.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .drafting import plugins, registry
from .errors import ModelLoadError

# the words of the settings the model package reads (it imports them from here)
WEIGHTS = ("auto", "int8", "int4")  # weights: auto = the checkpoint's dtype; model/int8.py's, model/int4.py's form
KV_DTYPES = ("auto", "bfloat16")  # kv_cache_dtype: the activations' dtype, or bfloat16 (native CPU forward)
LINEAR_KINDS = ("auto", "native", "torch")  # linear: the CPU forward's matmuls
PREFIX_MODES = ("auto", "on", "off")  # prefix_cache: auto = on where reuse is bitwise exact (native forward)

# config.pbtxt parameters are strings: these spell a boolean setting
_TRUE, _FALSE = ("1", "true"), ("0", "false")


def truthy(raw) -> bool:
    """Whether a config.pbtxt string (or a JSON value) spells true: 1 or true, any case and spacing."""
    return str(raw).strip().lower() in _TRUE


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class EngineConfig:
    checkpoint: str  # local HF checkpoint folder of a supported family (model/families.py)
    device: str = "cpu"  # "cpu", "cuda", "cuda:N" or "auto" (cuda when available)
    dtype: str = "auto"  # "auto" = bfloat16 on CUDA, float32 on CPU
    max_slots: int = 8  # concurrent sequences = KV cache rows
    max_seq_len: int = 2048  # prompt + output tokens per sequence = KV cache positions per row
    max_draft_len: int = 8  # upper bound for a request's num_draft_tokens
    tree_nodes: int = -1  # trees of drafts (speculation/trees.py): branch drafts a verify row may add to its
    # line, chosen per step by the step-cost planner; -1 or "auto" = up to max_draft_len; 0 or "off" = lines only
    spec_fallback: bool = False  # auto requests decode without drafts at a number of streams where steps that
    # draft realise fewer tokens per second than steps that do not (speculation/fallback.py, measured as it runs;
    # off by default: its probes cost more than it has saved on the workloads measured, docs/performance.md)
    default_max_tokens: int = 128  # used when a request gives no max_tokens
    max_prefill_tokens: int = 512  # prompt tokens prefilled per step; longer prompts are prefilled in chunks
    # over several steps, while the running requests keep decoding
    prefix_cache: str = "auto"  # reuse the KV of a prompt prefix already in the cache (prefix_cache.py):
    # "on", "off", auto = on where reuse is bitwise exact (the native CPU forward)
    drafter_plugins: str = ""  # modules declaring more drafters (drafting/plugins.py: each defines DRAFTERS, a list
    # of registry.DrafterSpec), comma-separated; imported and registered when the config is read
    drafter: str = "auto"  # default drafter (drafting/registry.py); auto = draft_model where one loads, else ngram
    draft_checkpoint: str = ""  # HF checkpoint of a draft model sharing the target's tokenizer ("" = none)
    draft_dtype: str = "auto"  # dtype of the draft model
    draft_quantization: str = "none"  # "int8": the draft is an int8 copy (of draft_checkpoint, or of the target
    # when that is empty): native int8 weights where the native forward runs,
    # PyTorch's dynamic quantization elsewhere; CPU only. "int4": a 4-bit copy
    # (native forward on VNNI only). "auto": the target's
    # int8 copy where the native forward runs the target (no draft_checkpoint,
    # weights not int8 already), else none
    draft_vocab: int = -1  # the int8 copy drafts over this many vocabulary entries, the most frequent in
    # draft_vocab_corpus (speculation/draft_vocab.py; the target verifies over all); -1 or "auto" = 32768 where the
    # vocabulary is larger than 65536, else all; 0 or "full" = all
    draft_vocab_corpus: str = ""  # a text file or folder like the traffic served, which ranks the vocabulary for
    # draft_vocab; "" = the English reference text shipped with Python
    default_num_draft_tokens: int = 0  # k for requests that do not set num_draft_tokens; -1 or "auto" = the
    # engine chooses k per request per step (adaptive.py)
    default_num_draft_tokens_guided: int = 0  # ... the same for requests with a guide (structured output)
    speculative_sampling: str = "coupled"  # sampled requests: "coupled" = a draft is accepted when it equals the
    # token the seed's noise picks (output independent of k, drafter and
    # batch); "rejection" = classic speculative sampling (sampling.py)
    logprobs_mode: str = "raw"  # logprobs (engine/logprobs.py): "raw" = of the model's logits before any
    # processing; "processed" = of the logits the token was chosen from
    ngram_min: int = 1  # n-gram prompt lookup: shortest suffix to match (docs/performance.md)
    ngram_max: int = 4  # ... longest suffix to match
    suffix_store_mb: int = 64  # the suffix drafter's store of recent outputs (speculation/suffix_store.py), at most
    # this many MiB; 0 = no suffix drafter. Scoped by LoRA adapter and cache_salt (docs/operating.md: tenants)
    suffix_store_entries: int = 10000  # ... and at most this many outputs (least recently used evicted)
    suffix_min_prob: float = 0.1  # a suffix draft goes on while the share of stored continuations that agree
    # with it, multiplied over its depth, stays at least this
    grammar_cache_mb: int = 256  # compiled-grammar cache (xgrammar's LRU), in MiB
    grammar_compile_timeout_s: int = 30  # a guide whose compile runs longer fails its request (time spent
    # compiling in a worker process, not waiting for one)
    grammar_compile_workers: int = 2  # worker processes that compile guides (>= 2: one is kept for new guides)
    grammar_compile_queue: int = 64  # guides waiting for a worker; a request beyond that is refused (UNAVAILABLE)
    json_unsupported_keywords: str = "error"  # a JSON-schema keyword xgrammar would not enforce: "error" fails
    # the request naming it; "ignore" compiles without it (best effort)
    json_strict: bool = True  # json_schema: no properties beyond the schema's unless it allows them
    # JSON guides (a schema, any JSON): whitespace in runs of at most 32 characters; False = the compact layout
    json_any_whitespace: bool = True
    forced_strings: bool = False  # guided drafts also start with the string the grammar forces (key names,
    # '": "', brackets) in xgrammar's tokenization, not only single forced tokens
    linear: str = "auto"  # CPU forward: "native" (our kernels: weights streamed at the memory bound,
    # batch-invariant), "torch" (transformers' modules), auto = native where
    # its kernels build (x86-64 with AVX-512, or AVX2 + FMA, and gcc), torch
    # elsewhere and on CUDA
    weights: str = "auto"  # the target's matmul weights: auto = as loaded (dtype); "int8" = int8 with a
    # scale per output channel on the native CPU forward, activations quantized
    # per row to int16 where the CPU has VNNI (lossy against the checkpoint,
    # exact with itself: batch-invariant, speculation token-identical); "int4"
    # = 4-bit codes in groups of 32 (model/int4.py; VNNI only), as exact with itself
    kv_cache_dtype: str = "auto"  # the target's KV cache: auto = the activations' dtype (float32 on the native
    # CPU forward); "bfloat16" = half the memory and half the bytes attention
    # reads (native CPU forward only; lossy, exact with itself)
    cuda_graphs: bool = False  # decode/verify/draft forwards replay CUDA graphs captured per (batch bucket,
    # k + 1); on CPU the same static path runs uncaptured (slower: for testing)
    # Serving limits (loop.py). A request waits for a KV slot in a queue; past these bounds it is refused at once
    # (UNAVAILABLE) rather than queued for longer than a client would wait.
    max_waiting_requests: int = -1  # requests waiting for a slot; -1 = 4 x max_slots, 0 = no bound
    max_waiting_prompt_tokens: int = 0  # prompt tokens of the waiting requests (0 = no bound); a request is
    # always taken when none are waiting, however long its prompt
    max_queue_delay_ms: int = 0  # a request still without a slot after this long is refused (0 = no limit)
    request_timeout_s: int = 0  # a request running longer ends with finish_reason timeout (0 = no limit);
    # a client's own Triton request timeout can only shorten it
    shutdown_grace_s: int = 5  # on unload, running requests may finish for this long before they are cut
    enable_lora: bool = False  # serve the LoRA adapters of lora_adapters, chosen per request by lora_name
    lora_adapters: str = ""  # a multi_lora.json: {"<name>": "<PEFT adapter folder>"} (the model's version folder's
    # multi_lora.json when served)
    max_lora_rank: int = 64  # the largest adapter rank accepted at load (at most 256)
    max_loras: int = 8  # adapters loaded at most
    lora_draft: bool = True  # the draft model (on the native forward) drafts with the request's adapter too
    lora_metric_prefix: str = ""  # put before each adapter's name in the LoRA info metric (serving/gateway.py): a
    # gateway's endpoint picker matches a request's `model` to those names (OpenAI frontend: "llm_lora_")
    reasoning_end: str = "auto"  # a thinking model's end of reasoning: a guided chat request's guide holds after
    # it (the reasoning before it is free text); auto = "</think>" where the tokenizer has that token and the chat
    # template opens a <think> block, "none" = off, else the marker itself (engine/settings.py)
    max_stop_chars: int = 1000  # the longest stop string and bad word a request may give (each is searched
    # for in the output's text at every commit)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # 0 / 1 are accepted for booleans and stored as bool
            value = getattr(self, f.name)
            if f.type == "bool":
                if value not in (0, 1):
                    raise ModelLoadError(f"engine setting {f.name} must be a boolean, got {value!r}")
                object.__setattr__(self, f.name, bool(value))
        for name in ("max_slots", "max_seq_len", "default_max_tokens", "max_prefill_tokens", "max_stop_chars"):
            if int(getattr(self, name)) < 1:
                raise ModelLoadError(f"engine setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_waiting_prompt_tokens", "max_queue_delay_ms", "request_timeout_s", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ModelLoadError(f"engine setting {name} must be >= 0 (0 = no limit), got {getattr(self, name)}")
        if self.max_waiting_requests < -1:
            raise ModelLoadError(
                f"engine setting max_waiting_requests must be -1 (4 x max_slots), 0 (no bound) or "
                f"a positive count, got {self.max_waiting_requests}"
            )
        if not 0 <= self.max_draft_len <= 64:
            raise ModelLoadError(f"engine setting max_draft_len must be in [0, 64], got {self.max_draft_len}")
        if not -1 <= self.tree_nodes <= 63:
            raise ModelLoadError(
                f"engine setting tree_nodes must be -1 (auto), 0 (off) or 1..63, got {self.tree_nodes}"
            )
        for name in ("dtype", "draft_dtype"):
            if getattr(self, name) not in ("auto", *DTYPES):
                raise ModelLoadError(
                    f"engine setting {name} must be one of auto, {', '.join(DTYPES)}; got {getattr(self, name)!r}"
                )
        plugins.load(plugins.parse(self.drafter_plugins))  # before `drafter`, which may name a plug-in's
        if self.drafter not in ("auto", *registry.DRAFTERS):
            raise ModelLoadError(
                f"engine setting drafter must be auto or one of {', '.join(registry.DRAFTERS)}; got {self.drafter!r}"
            )
        if self.drafter != "auto" and (on := registry.DRAFTERS[self.drafter].enabled_by) and getattr(self, on) <= 0:
            raise ModelLoadError(f"engine setting drafter {self.drafter} needs {registry.DRAFTERS[self.drafter].needs}")
        if self.suffix_store_mb < 0 or self.suffix_store_entries < 0 or not 0 < self.suffix_min_prob <= 1:
            raise ModelLoadError(
                "suffix_store_mb and suffix_store_entries must be >= 0 (0: no suffix store) and suffix_min_prob in "
                f"(0, 1]; got {self.suffix_store_mb}, {self.suffix_store_entries}, {self.suffix_min_prob}"
            )
        if self.draft_quantization not in ("none", "int8", "int4", "auto"):
            raise ModelLoadError(
                f"draft_quantization must be none, int8, int4 or auto, got {self.draft_quantization!r}"
            )
        for name in ("default_num_draft_tokens", "default_num_draft_tokens_guided"):
            if not -1 <= getattr(self, name) <= self.max_draft_len:
                raise ModelLoadError(f"{name} must be -1 (auto) or in [0, max_draft_len]")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ModelLoadError(f"engine setting logprobs_mode must be raw or processed, got {self.logprobs_mode!r}")
        if self.speculative_sampling not in ("coupled", "rejection"):
            raise ModelLoadError(
                f"engine setting speculative_sampling must be coupled or rejection, got {self.speculative_sampling!r}"
            )
        if self.prefix_cache not in PREFIX_MODES:
            raise ModelLoadError(
                f"engine setting prefix_cache must be one of {', '.join(PREFIX_MODES)}, got {self.prefix_cache!r}"
            )
        if self.linear not in LINEAR_KINDS:
            raise ModelLoadError(f"engine setting linear must be one of {', '.join(LINEAR_KINDS)}, got {self.linear!r}")
        if self.weights not in WEIGHTS:
            raise ModelLoadError(f"engine setting weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise ModelLoadError(
                f"engine setting kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        if self.grammar_compile_workers < 2:
            raise ModelLoadError(f"grammar_compile_workers must be >= 2, got {self.grammar_compile_workers}")
        for name in ("grammar_compile_timeout_s", "grammar_compile_queue"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"engine setting {name} must be >= 1, got {getattr(self, name)}")
        if self.json_unsupported_keywords not in ("error", "ignore"):
            raise ModelLoadError(
                f"json_unsupported_keywords must be error or ignore, got {self.json_unsupported_keywords!r}"
            )
        if not 1 <= self.max_lora_rank <= 256 or self.max_loras < 1:
            raise ModelLoadError("max_lora_rank must be in [1, 256] and max_loras >= 1")
        if self.enable_lora and not self.lora_adapters:
            raise ModelLoadError("enable_lora needs lora_adapters (a multi_lora.json of the adapters to serve)")
        if self.draft_vocab < -1:
            raise ModelLoadError(f"draft_vocab must be auto (-1), full (0) or a count, got {self.draft_vocab}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ModelLoadError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        self._check_device()

    @classmethod
    def from_dict(cls, params: dict[str, str]) -> "EngineConfig":
        """Build from string parameters (Triton config `parameters`); unknown keys are an error."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(params) - set(fields)
        if unknown:
            raise ModelLoadError(f"unknown engine parameters {sorted(unknown)}; known: {sorted(fields)}")
        kwargs = {}
        for key, raw in params.items():
            kind = fields[key].type
            if kind == "bool":
                text = str(raw).strip().lower()
                if text not in _TRUE + _FALSE:
                    raise ModelLoadError(f"engine parameter {key} must be 0, 1, true or false; got {raw!r}")
                kwargs[key] = truthy(text)
                continue
            word = str(raw).strip().lower()
            if (key.startswith("default_num_draft_tokens") or key in ("draft_vocab", "tree_nodes")) and word == "auto":
                raw = "-1"
            if (key == "draft_vocab" and word == "full") or (key == "tree_nodes" and word == "off"):
                raw = "0"
            try:
                kwargs[key] = int(raw) if kind == "int" else float(raw) if kind == "float" else str(raw)
            except ValueError:
                what = "an integer" if kind == "int" else "a number"
                raise ModelLoadError(f"engine parameter {key} must be {what}, got {raw!r}") from None
        if "checkpoint" not in kwargs:
            raise ModelLoadError("engine parameter 'checkpoint' (path to a HF checkpoint folder) is required")
        return cls(**kwargs)

    def _check_device(self) -> None:
        """The device setting's words (whether that device is here is resolved at load: engine/settings.py)."""
        if self.device == "auto":
            return
        try:
            dev = torch.device(self.device)
        except RuntimeError:
            raise ModelLoadError(
                f"engine setting device must be cpu, cuda, cuda:N or auto; got {self.device!r}"
            ) from None
        if dev.type not in ("cpu", "cuda"):
            raise ModelLoadError(f"unsupported device type {dev.type!r}: use cpu or cuda")

    @property
    def waiting_requests_bound(self) -> int | None:
        """max_waiting_requests resolved: None = no bound. The default, 4 x max_slots, lets a request queue behind
        about four generations per slot; a client would rather be refused at once (and retry elsewhere) than
        wait longer than that."""
        if self.max_waiting_requests == -1:
            return 4 * self.max_slots
        return self.max_waiting_requests or None
