"""Drafters propose up to k tokens per request; the target verifies them, so no drafter changes the output.

    draft_model  a second, cheaper model (another ModelRunner with its own KV cache)
    ngram        prompt lookup: continue the latest earlier occurrence of the current suffix (free)
Grammar-forced tokens (positions where the grammar allows one token) enter in front of any drafter's
proposal once grammars land: Engine._draft is the slot.
"""
from .base import Drafter, PickFn, Proposal
from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter

__all__ = ["Drafter", "PickFn", "Proposal", "DraftModelDrafter", "NgramDrafter"]
