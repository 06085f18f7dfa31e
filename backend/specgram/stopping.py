"""Stop strings over streamed text: find them across step boundaries, and never stream a partial one."""
from __future__ import annotations


def find_stop(text: str, stops: list[str], search_from: int) -> int:
    """Index where the earliest stop string starts in text[search_from - longest + 1:], or -1."""
    if not stops:
        return -1
    start = max(0, search_from - max(map(len, stops)) + 1)
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
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
