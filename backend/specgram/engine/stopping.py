"""Stop strings over streamed text: find them across step boundaries, and never stream a partial one."""

from __future__ import annotations


def find_stop(text: str, stops: list[str], search_from: int) -> int:
    """Index where the earliest stop string that ends in text[search_from:] (the new text) starts, or -1.
    An occurrence ending before search_from is never found: it was not a stop when it completed (it came
    before min_tokens) and does not become one later."""
    hits = [i for i in (text.find(s, max(0, search_from - len(s) + 1)) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def holdback(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string: that much of the text
    must wait, because the next tokens may complete the stop string (which is never sent)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
