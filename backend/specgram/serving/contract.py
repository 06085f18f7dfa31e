"""The client contract of the Triton model `llm`, declared once: every input and output, its Triton data type,
dims, how a value is checked, its default and what it means.

Everything else derives from these tables: the adapter's tensor reader and response builder
(model_repository/llm/1/model.py), the request parser (protocol.py), the client's tensor dtypes
(client/stream_client.py) and the contract tables of docs/api.md (scripts/contract_table.py). A unit test checks
that model_repository/llm/config.pbtxt declares exactly these inputs and outputs.

Pure Python (no torch, no Triton): the client imports it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..drafting import registry
from .values import (
    to_bool,
    to_draft_len,
    to_float,
    to_int,
    to_int_list,
    to_limit,
    to_logit_bias,
    to_logprobs,
    to_messages,
    to_seed,
    to_str,
    to_str_list,
    to_structured,
    to_template_kwargs,
)

# ---- the tables -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str  # Triton config data type without "TYPE_" (STRING, BOOL, INT32, UINT64, FP32)
    dims: tuple[int, ...]  # (1,) = one element; (-1,) = any number
    doc: str | Callable[[], str]  # what it means, for the docs/api.md table; a function where it lists what is
    # declared elsewhere (the drafters, their source tags): read when the text is, so a later declaration shows
    default: str = ""  # what an absent value means, for the docs/api.md table ("" = nothing to say)
    optional: bool = True
    convert: Callable[[str, Any], Any] | None = None  # the check applied to a client's value (inputs only)
    option: bool = True  # also accepted inside sampling_parameters and as a request parameter
    param: str | None = None  # the SamplingParams attribute it sets (None: the parser uses it itself)
    switch: str | None = None  # outputs: the BOOL input that asks for it (None: on every response)

    @property
    def client_dtype(self) -> str:
        """The data type tritonclient's InferInput takes (STRING is BYTES on the wire)."""
        return "BYTES" if self.dtype == "STRING" else self.dtype

    @property
    def text(self) -> str:
        """What it means, as of now."""
        return self.doc() if callable(self.doc) else self.doc

    @property
    def scalar(self) -> bool:
        return self.dims == (1,)


# the tables, one field a row (not reflowed by the formatter)
# fmt: off
INPUTS: tuple[Field, ...] = (
    Field("text_input", "STRING", (1,), "the prompt (may be empty when `messages` is given)",
          optional=False, option=False),
    Field("stream", "BOOL", (1,), "stream deltas (false: one response with the full text)", "false",
          convert=to_bool),
    Field("max_tokens", "INT32", (1,), "tokens to generate", "config `default_max_tokens`",
          convert=to_limit, param="max_tokens"),
    Field("min_tokens", "INT32", (1,),
          "0..`max_tokens`: the first min_tokens tokens are never EOS and never end a stop string (a grammar that "
          "can only end still ends the output)", "0", convert=to_int, param="min_tokens"),
    Field("temperature", "FP32", (1,), "0 = greedy", "0", convert=to_float, param="temperature"),
    Field("top_p", "FP32", (1,), "nucleus, in (0, 1]", "1", convert=to_float, param="top_p"),
    Field("top_k", "INT32", (1,), "0 or -1 = off", "0", convert=to_int, param="top_k"),
    Field("seed", "UINT64", (1,), "per-request seed: sampled output is a function of the prompt, the settings and "
          "the seed, the same for every draft length, drafter and batch (config `speculative_sampling` coupled)",
          "unseeded; a negative seed (OpenAI's are signed) counts as its 64 bits read unsigned", convert=to_seed,
          param="seed"),
    Field("stop", "STRING", (-1,), "stop strings (cut from the output, never streamed partially)", "none",
          convert=to_str_list, param="stop"),
    Field("ignore_eos", "BOOL", (1,), "keep going past EOS (fixed-length load runs)", "false",
          convert=to_bool, param="ignore_eos"),
    Field("num_draft_tokens", "INT32", (1,),
          "speculative draft length k, 0..`max_draft_len`; 0 = no speculation; -1 (or \"auto\" in "
          "`sampling_parameters`) = the engine chooses k per step from the request's acceptance and the step cost",
          "config `default_num_draft_tokens` (`default_num_draft_tokens_guided` with a guide)",
          convert=to_draft_len, param="num_draft_tokens"),
    Field("drafter", "STRING", (1,), registry.describe,
          "config `drafter` (served: `draft_model` where the copy loads, else `ngram`)", convert=to_str,
          param="drafter"),
    Field("tree_drafts", "BOOL", (1,),
          "false: verify lines of drafts only; true: the engine may add branch drafts (trees; config `tree_nodes`). "
          "Output is the same either way", "true", convert=to_bool, param="tree_drafts"),
    Field("lora_name", "STRING", (1,),
          "a LoRA adapter of the model's `multi_lora.json` (config `enable_lora`); an unknown name is an error",
          "the base model", convert=to_str, param="lora_name"),
    Field("cache_salt", "STRING", (1,),
          "vLLM's name: requests share cached prompts (the prefix cache) and each other's outputs (suffix drafts) "
          "only with the same salt, 1 to 256 characters (a tenant's secret keeps another from timing its traffic)",
          "none: the one unsalted scope", convert=to_str, param="cache_salt"),
    Field("guided_decoding_guide_type", "STRING", (1,),
          "`json` (any JSON; guide may be empty), `json_schema`, `regex`, `ebnf` (xgrammar EBNF/GBNF), "
          "`structural_tag` (xgrammar's JSON format), `choice` (the guide is a JSON list of strings: exactly one of "
          "them)", "unguided", convert=to_str, param="guide_type"),
    Field("guided_decoding_guide", "STRING", (1,), "the schema / regex / grammar / tag, as a string", "",
          convert=to_str, param="guide"),
    Field("presence_penalty", "FP32", (1,), "in [-2, 2]: subtracted from the logit of every token already in the "
          "output", "0", convert=to_float, param="presence_penalty"),
    Field("frequency_penalty", "FP32", (1,), "in [-2, 2]: subtracted once per occurrence in the output", "0",
          convert=to_float, param="frequency_penalty"),
    Field("repetition_penalty", "FP32", (1,), "in (0, 10]: logits of tokens in the prompt or the output divided by "
          "it where positive, multiplied where negative", "1", convert=to_float, param="repetition_penalty"),
    Field("logit_bias", "STRING", (1,), 'JSON object `{"<token id>": bias}`, bias in [-100, 100]', "none",
          convert=to_logit_bias, param="logit_bias"),
    Field("stop_token_ids", "INT32", (-1,), "tokens that end the output like EOS (kept in `output_ids`, not in the "
          "text)", "none", convert=to_int_list, param="stop_token_ids"),
    Field("bad_words", "STRING", (-1,), "words never generated (each as tokenized alone and after a space)", "none",
          convert=to_str_list, param="bad_words"),
    Field("allowed_token_ids", "INT32", (-1,), "only these tokens are generated", "every token",
          convert=to_int_list, param="allowed_token_ids"),
    Field("exclude_input_in_output", "BOOL", (1,), "false: the prompt text is prepended to the output",
          "true when streaming, else false", convert=to_bool),
    Field("sampling_parameters", "STRING", (1,),
          "JSON object with any of the optional keys of this table (as vllm_backend / genai-perf "
          "`--backend vllm` send it)", option=False),
    Field("apply_chat_template", "BOOL", (1,), "wrap `text_input` as a user message in the model's chat template",
          "false", convert=to_bool),
    Field("messages", "STRING", (1,), 'JSON list of `{"role", "content"}` rendered with the chat template', "",
          convert=to_messages),
    Field("chat_template_kwargs", "STRING", (1,), "JSON object of extra chat-template variables (vLLM's key), e.g. "
          '`{"enable_thinking": false}` for a thinking model; chat prompts only', "none", convert=to_template_kwargs),
    Field("max_reasoning_chars", "INT32", (1,), "a thinking model's guided chat request: its reasoning (free "
          "text before config `reasoning_end`) takes at most this many characters, then the end is forced", "no bound",
          convert=to_int, param="max_reasoning_chars"),
    # vllm_backend's switches for its additional outputs (Triton's OpenAI frontend sends them): each output is sent
    # only when its switch is true, as vllm_backend does
    Field("return_finish_reason", "BOOL", (1,), "send `finish_reason`", "false", convert=to_bool, option=False),
    Field("return_num_input_tokens", "BOOL", (1,), "send `num_input_tokens`", "false", convert=to_bool,
          option=False),
    Field("return_num_output_tokens", "BOOL", (1,), "send `num_output_tokens`", "false", convert=to_bool,
          option=False),
    Field("return_logprobs", "BOOL", (1,), "send `logprobs` (the top-n count is `sampling_parameters.logprobs`)",
          "false", convert=to_bool, option=False),
    Field("return_cumulative_logprob", "BOOL", (1,), "send `cumulative_logprob`", "false", convert=to_bool,
          option=False),
)

# keys accepted inside sampling_parameters (and as request parameters) only, as vLLM spells them
SAMPLING_KEYS: tuple[Field, ...] = (
    Field("logprobs", "INT32", (1,), "0..20: with `return_logprobs`, each token's logprob and the n most likely "
          "tokens' (0: the chosen token's alone; false: none)", "none", convert=to_logprobs, param="logprobs"),
    Field("structured_outputs", "STRING", (1,), "vLLM's structured outputs: an object with one of `json` (a "
          "schema), `regex`, `choice` (a list of strings), `grammar` (EBNF), `json_object` (true), `structural_tag`; "
          "sets the guide", "unguided", convert=to_structured),
    Field("guided_decoding", "STRING", (1,), "the older name of `structured_outputs`", "unguided",
          convert=to_structured),
)

OUTPUTS: tuple[Field, ...] = (
    Field("text_output", "STRING", (-1,), "text delta when streaming, else the whole text", optional=False),
    Field("output_ids", "INT32", (-1,), "this response's tokens (a response may carry several)", optional=False),
    Field("finish_reason", "STRING", (1,),
          "`None` until the final response, then `stop` (EOS, a stop string or stop token, or the grammar completed), "
          "`length` or `timeout` (config `request_timeout_s` or the request's own Triton timeout passed; the text so "
          "far)", switch="return_finish_reason", optional=False),
    Field("num_input_tokens", "UINT32", (1,), "prompt tokens", switch="return_num_input_tokens", optional=False),
    Field("num_output_tokens", "UINT32", (1,), "tokens in this response (a stream's sum is the output's length)",
          switch="return_num_output_tokens", optional=False),
    Field("logprobs", "STRING", (1,),
          'JSON: per token of this response `{"<token id>": {"logprob", "rank", "decoded_token"}}` for the chosen '
          "token and the `sampling_parameters.logprobs` most likely ones (docs/api.md, Logprobs); `null` when "
          "`sampling_parameters` has no `logprobs`", switch="return_logprobs", optional=False),
    Field("cumulative_logprob", "FP32", (1,), "sum of the chosen tokens' logprobs so far",
          switch="return_cumulative_logprob", optional=False),
    Field("num_cached_tokens", "INT32", (1,), "prompt tokens whose keys and values were reused from the cache "
          "(config `prefix_cache`) instead of prefilled", optional=False),
    Field("spec_drafted_tokens", "INT32", (1,), "draft tokens proposed to the target", optional=False),
    Field("spec_accepted_tokens", "INT32", (1,), "draft tokens the target accepted", optional=False),
    Field("spec_acceptance_rate", "FP32", (1,), "accepted ÷ drafted", optional=False),
    Field("spec_acceptance_length", "FP32", (1,),
          "tokens committed per speculative step (1 + accepted drafts; TensorRT-LLM's \"acceptance length\")",
          optional=False),
    Field("spec_detail", "STRING", (1,),
          lambda: 'final response: JSON `{"sources": {source: {"drafted", "accepted"}}, "k_hist": [...]}`, drafts by '
          f"source ({', '.join(f'`{s}`' for s in registry.sources())}: `forced` by the grammar, the others "
          "the drafters' tags) and k_hist[k] = steps that verified k drafts; empty before", optional=False),
)
# fmt: on

INPUT = {f.name: f for f in INPUTS}
OUTPUT = {f.name: f for f in OUTPUTS}
# what may come inside sampling_parameters or as a request parameter: the option inputs and the sampling keys
OPTIONS = {f.name: f for f in (*INPUTS, *SAMPLING_KEYS) if f.option}


def markdown_table(fields: tuple[Field, ...], with_default: bool = True) -> str:
    """The markdown form of a table: one row per field."""

    def code(text: str) -> str:
        return f"`{text}`" if text else ""

    head = "| name | type | dims | meaning |" + (" default |" if with_default else " sent |")
    rule = "|---|---|---|---|---|"
    rows = [head, rule]
    for f in fields:
        dims = "[" + ", ".join(str(d) for d in f.dims) + "]"
        row = f"| {code(f.name)} | {f.dtype} | {dims} | {f.text} |"
        if with_default:
            row += " required |" if not f.optional else f" {f.default or '–'} |"
        else:
            row += f" with {code(f.switch)} true |" if f.switch else " always |"
        rows.append(row)
    return "\n".join(rows)


def markdown() -> str:
    """docs/api.md's contract section body (between its contract markers)."""
    return "\n".join(
        [
            "Inputs:",
            "",
            markdown_table(INPUTS),
            "",
            "Keys of `sampling_parameters` only (not input tensors):",
            "",
            markdown_table(SAMPLING_KEYS),
            "",
            "Outputs (the speculative statistics are the request's totals, meaningful on the final one):",
            "",
            markdown_table(OUTPUTS, with_default=False),
        ]
    )
