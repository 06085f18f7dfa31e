"""The engine: requests in, committed tokens out, one step at a time on one thread.

engine        Engine: request validation, the step (plan -> forward -> mask/accept -> commit)
scheduler     waiting and running requests, KV slots, the per-step prefill budget
output        committing tokens (EOS, grammar end, stop strings, limits) and the streamed text
prefix_cache  reuse of a cached prompt prefix's KV
prompt, detokenize, stopping   text in and out
loading       the target, its tokenizer and the configured draft model from a checkpoint
generate      the in-process driver (no server): run requests to completion
"""
