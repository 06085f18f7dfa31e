"""The built-in drafters' names and the source tags of their drafts: the words the registry declares, the drafters
tag their proposals with, and loading files the draft models under. A plug-in declares its own (registry.py)."""

from __future__ import annotations

# drafters (the `drafter` a request or the config names)
NGRAM = "ngram"
SUFFIX = "suffix"
DRAFT_MODEL = "draft_model"
COPY = "copy"  # the target's own copy beside a draft_checkpoint
GRAMMAR = "grammar"

# source tags (spec_detail's sources, the metrics' `source` label)
FORCED = "forced"  # a token the grammar forces: it leads every drafter's proposal
PROMPT = "prompt"  # n-gram lookup in the request's prompt
OUTPUT = "output"  # ... in its output so far
GUIDE = "guide"  # ... in its guide's text
SUFFIX_STORE = "suffix"  # the store of other requests' answers
DRAFT_MODEL_SOURCE = DRAFT_MODEL  # a model drafter's drafts are tagged with its name
COPY_SOURCE = COPY
ALT = "alt"  # a tree's branch: a drafter's runner-up token (speculation/trees.py)
BRANCH = "branch"  # ... another lookup continuation
