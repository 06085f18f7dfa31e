"""Token choice: which token a request takes at a position, and which drafts the target accepts.

sampling     greedy and sampled picks, greedy, coupled and rejection-sampling verification (pure tensor functions,
             then the glue to per-request parameters)
noise        the sampling noise keyed by (seed, position): a sampled token is a function of the seed, its position
             and the processed distribution there alone
min_tokens   the tokens that would end an output banned below its min_tokens, wherever a token is chosen
"""
