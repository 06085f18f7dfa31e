"""Grammar: guides compiled with xgrammar, and the masks every drafted and verified position gets.

compile          guide kinds and one xgrammar compile
pool             compiles in worker processes (a runaway compile is killed, its memory returned)
worker           one compile worker process and its job
wakeup           the pipe that wakes the pool's dispatcher
compiler         GrammarCompiler: checks, cache, and the route of a compile (cache, pool, engine process)
guide            Guide: a request's matcher with tentative accepts and rollback; bitmask row helpers
masks            StepMasks: the bitmask rows of one step, applied to draft and target logits
schema_keywords  JSON-schema keywords xgrammar would not enforce
"""
