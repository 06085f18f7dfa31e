"""Drafters propose up to k tokens per request; the target verifies them, so no drafter changes the output.

    draft_model  a second, cheaper model (another ModelRunner with its own KV cache)
    ngram        prompt lookup: continue the latest earlier occurrence of the current suffix (free)
    grammar      only the tokens a request's grammar forces (exactly one legal token): free, exact
Grammar-forced tokens also enter in front of every other drafter's proposal (the `prefixes` argument).
"""
from .base import Drafter, GrammarOnlyDrafter, PickFn, Proposal
from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter

__all__ = ["Drafter", "GrammarOnlyDrafter", "PickFn", "Proposal", "DraftModelDrafter", "NgramDrafter"]
