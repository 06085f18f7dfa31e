"""The engine: requests in, committed tokens out, one step at a time on one thread.

engine        Engine: the step (admit -> plan -> forward -> first tokens / mask, accept -> commit)
step          StepPlan and StepResult, what the phases of a step hand each other
verify        the verify phase: masks, accepts and settles the verify rows
intake        a request's validation and tokenization (any thread)
logits        the grammar mask and the min_tokens EOS ban wherever a token is chosen
scheduler     waiting and running requests, KV slots, the per-step prefill budget
output        committing tokens (EOS, grammar end, stop strings, limits) and the streamed text
prefix_cache  reuse of a cached prompt prefix's KV
prompt, detokenize, stopping   text in and out
settings      every "auto" of the config resolved once for this machine and these checkpoints
loading       the target, its tokenizer and the configured draft model from a checkpoint
generate      the in-process driver (no server): run requests to completion
"""
