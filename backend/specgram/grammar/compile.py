"""Guide kinds and one xgrammar compile (run alike in the engine process and in the compile workers)."""

from __future__ import annotations

import json
import re

from ..errors import InvalidRequest
from ..wire import WireEnum
from .json_grammar import any_json_grammar, schema_grammar


class GuideType(WireEnum):
    """The guide kinds the engine compiles (the values of `guided_decoding_guide_type`, aliases aside)."""

    JSON = "json"  # any JSON value; the guide may be empty
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF = "ebnf"  # xgrammar EBNF / GBNF
    STRUCTURAL_TAG = "structural_tag"  # xgrammar's structural tag (JSON)
    CHOICE = "choice"  # one of a JSON list of strings, exactly (vLLM's guided choice)


# what a client may send -> the kind (aliases as other servers spell them)
GUIDE_TYPES = {
    **{t.value: t for t in GuideType},
    "json_object": GuideType.JSON,
    "grammar": GuideType.EBNF,
    "gbnf": GuideType.EBNF,
}
UNSUPPORTED_KEYWORDS = ("error", "ignore")  # what json_unsupported_keywords may say


def normalize_guide_type(guide_type: str) -> GuideType:
    kind = GUIDE_TYPES.get(guide_type.lower())
    if kind is None:
        raise InvalidRequest(
            f"unknown guided_decoding_guide_type {guide_type!r}; use one of {sorted(t.value for t in GuideType)}"
        )
    return kind


def choices_of(guide: str) -> list[str]:
    """A choice guide (a JSON list of non-empty strings) -> the strings; raises InvalidRequest."""
    try:
        choices = json.loads(guide)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long to convert
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequest('a choice guide must be a JSON list of non-empty strings, e.g. ["yes", "no"]')
    return choices


def choice_grammar(choices: list[str]) -> str:
    """The EBNF grammar whose language is exactly `choices` (JSON string escapes are xgrammar EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


REASONING_OPTIONS = ("reasoning_end", "reasoning_max_chars")  # compile options of any kind
# the compile options each JSON kind reads (json_strict: a schema's objects; any JSON's take any keys)
JSON_OPTIONS = {"json_schema": ("json_strict", "json_any_whitespace"), "json": ("json_any_whitespace",)}


def reasoning_prefix(end: str, max_chars: int | None):
    """The grammar of a thinking model's reasoning: any text without `end` (at most max_chars characters; None:
    no bound), then `end` itself. A character bound, not a token one: xgrammar's token budget is not restored when
    the matcher rolls back rejected drafts, so it would make the output depend on speculation; its character
    count is."""
    import xgrammar as xgr

    free = {"type": "any_text", "excludes": [end], **({} if max_chars is None else {"max_chars": max_chars})}
    fmt = {"type": "sequence", "elements": [free, {"type": "const_string", "value": end}]}
    return xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt}))


def guide_grammar(kind: GuideType, guide: str, json_strict: bool, json_any_whitespace: bool):
    """The guide as an xgrammar Grammar (not compiled). The JSON kinds: strings as RFC 8259 writes them and
    whitespace bounded (json_grammar.py)."""
    import xgrammar as xgr

    if kind == GuideType.JSON:
        return any_json_grammar(json_any_whitespace)
    if kind == GuideType.JSON_SCHEMA:
        return schema_grammar(guide, json_strict, json_any_whitespace)
    if kind == GuideType.REGEX:
        return xgr.Grammar.from_regex(guide)
    if kind == GuideType.EBNF:
        return xgr.Grammar.from_ebnf(guide)
    if kind == GuideType.CHOICE:
        return xgr.Grammar.from_ebnf(choice_grammar(choices_of(guide)))
    return xgr.Grammar.from_structural_tag(guide)


def compile_guide(
    compiler,
    kind: GuideType,
    guide: str,
    json_strict: bool,
    json_any_whitespace: bool,
    reasoning_end: str = "",
    reasoning_max_chars: int | None = None,
):
    """One compile with an xgrammar GrammarCompiler (in the engine process and in the workers alike). With
    reasoning_end: the guide holds after a thinking model's reasoning (reasoning_prefix), which is free text.
    Raises InvalidRequest with xgrammar's reason."""
    try:
        grammar = guide_grammar(kind, guide, json_strict, json_any_whitespace)
        if reasoning_end:
            import xgrammar as xgr

            grammar = xgr.Grammar.concat(reasoning_prefix(reasoning_end, reasoning_max_chars), grammar)
        return compiler.compile_grammar(grammar)
    except Exception as e:  # xgrammar raises RuntimeError/ValueError/its own types with a useful message
        raise InvalidRequest(f"cannot compile the {kind} guide: {xgrammar_reason(e)[:500]}") from None


# xgrammar's messages start with its log line's prefix: "[17:32:59] /project/cpp/json_schema_converter.cc:5082: "
_LOG_PREFIX = re.compile(r"^\s*(\[\d\d:\d\d:\d\d\]\s*)?\S+\.(cc|h|cpp):\d+:\s*")


def xgrammar_reason(e: Exception) -> str:
    """An xgrammar exception's message without its log prefix (time stamp, C++ source file and line)."""
    return _LOG_PREFIX.sub("", str(e).strip())
