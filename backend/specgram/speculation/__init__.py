"""Speculation: who proposes drafts, how many, and which the target accepts.

drafter      the Drafter interface, Proposal, and the grammar-only drafter (tokens a grammar forces)
ngram        prompt lookup: continue the latest earlier occurrence of the current suffix (free)
draft_model  a second, cheaper model (another ModelRunner; the target's int8 copy shares its KV cache)
planner      a step's drafts: drafting, the grammar's seal, the draft-length cuts, bookkeeping
adaptive     the draft length per request per step (acceptance estimates, step costs)
costs        the step-cost model and the pay-or-not questions asked of it
Which drafts the target accepts is token choice (the sample package). No drafter changes the output: the target
verifies every draft. Grammar-forced tokens also enter in front of every other drafter's proposal.
"""
