"""A reduced draft vocabulary: the token ids whose logits the int8 copy computes when drafting.

Why: a small model with a big vocabulary spends most of a draft forward in its head (Gemma 3 270M: 168M of its
268M parameters are the 262k-entry head). Drafting over the most frequent entries only (FR-Spec) makes each draft
forward that much cheaper; the target still verifies over the whole vocabulary, so output is unchanged. A token
outside the subset is never drafted: the draft proposes the best token inside it (often the target's own choice
anyway, by frequency), and a guided draft ends where the grammar allows nothing inside it.

The ranking: token counts over a corpus tokenized at load (draft_vocab_corpus, text like the traffic served; by
default the English reference text shipped with Python, pydoc_data.topics), the tokenizer's special tokens and
the checkpoint's EOS ids always kept, the tokens the corpus never shows after it in id order.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

AUTO_ABOVE = 65536  # draft_vocab auto: reduced for vocabularies larger than this ...
AUTO_SIZE = 32768  # ... to this many entries (FR-Spec's choice for 128k-256k vocabularies)


def builtin_corpus() -> list[str]:
    """The default corpus: Python's own reference text (~470 KB of English prose and code, in every CPython)."""
    from pydoc_data import topics

    return list(topics.topics.values())


def read_corpus(path: str) -> list[str]:
    """The text of a file, or of every file under a folder (UTF-8, undecodable bytes replaced)."""
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    if not files:
        raise ValueError(f"draft_vocab_corpus {path!r} holds no files")
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def ranked(counts: Counter, vocab: int, keep: set[int]) -> list[int]:
    """Every id in [0, vocab): `keep` first, then by count (most first, ties by id), then the uncounted by id."""
    first = sorted(i for i in keep if 0 <= i < vocab)
    seen = set(first)
    by_count = sorted((i for i in counts if 0 <= i < vocab and i not in seen), key=lambda i: (-counts[i], i))
    seen.update(by_count)
    return first + by_count + [i for i in range(vocab) if i not in seen]


def size_of(setting: int, vocab: int) -> int:
    """draft_vocab (-1 auto, 0 the whole vocabulary, else a count) for a vocabulary of `vocab` ids -> the entries
    the draft computes (vocab: the whole one)."""
    if setting == -1:
        return AUTO_SIZE if vocab > AUTO_ABOVE else vocab
    return vocab if setting == 0 else min(setting, vocab)


def head_ids(tokenizer, vocab: int, size: int, corpus: list[str], keep: set[int]) -> torch.Tensor | None:
    """-> the `size` most frequent ids of `corpus` under `tokenizer`, `keep` and the special tokens always among
    them (a size below their count grows to it), sorted (a long tensor: the draft head's rows), or None where
    that is the whole vocabulary of `vocab` ids."""
    keep = {k for k in set(keep) | set(getattr(tokenizer, "all_special_ids", [])) if 0 <= k < vocab}
    size = max(size, len(keep))
    if size >= vocab:
        return None
    counts: Counter = Counter()
    for text in corpus:
        counts.update(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    return torch.tensor(sorted(ranked(counts, vocab, keep)[:size]), dtype=torch.long)
