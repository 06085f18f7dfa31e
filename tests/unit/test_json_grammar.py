"""The JSON grammars (json_grammar.py) on xgrammar's own matcher, character by character: strings as RFC 8259
writes them (no raw control character, escapes allowed, length bounds counting decoded characters) and whitespace
runs bounded, for a schema and for any JSON, in both layouts, through the compile path the engine uses."""

import json

import pytest

from specgram.grammar.compile import GuideType, guide_grammar
from specgram.grammar.json_grammar import MAX_WHITESPACE, repair_strings

# each case: (kind, schema or "", a JSON text with one string slot "{s}" that the guide accepts)
LENGTH = {"type": "string", "minLength": 1, "maxLength": 8}
CASES = [
    ("json", "", '{"k": "{s}"}'),
    ("json", "", '["{s}"]'),
    ("json_schema", json.dumps({"type": "string"}), '"{s}"'),
    ("json_schema", json.dumps(LENGTH), '"{s}"'),  # xgrammar's own rule for it admits raw control characters
    ("json_schema", json.dumps({"type": "array", "items": LENGTH}), '["{s}"]'),
    ("json_schema", json.dumps({"type": "object", "propertyNames": LENGTH}), '{"{s}": 1}'),
    ("json_schema", json.dumps({"anyOf": [LENGTH, {"type": "integer"}]}), '"{s}"'),
    ("json_schema", json.dumps({"type": "object", "additionalProperties": {"type": "string"}}), '{"a": "{s}"}'),
]
CONTROLS = [chr(c) for c in range(0x20)]


@pytest.fixture(scope="module")
def compiler():
    import xgrammar as xgr

    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)


def accepts(compiler, kind, guide, text, any_whitespace=True, strict=False) -> bool:
    """Whether the guide's grammar accepts text, whole (xgrammar's matcher alone, no tokenizer)."""
    import xgrammar as xgr

    grammar = guide_grammar(GuideType(kind), guide, json_strict=strict, json_any_whitespace=any_whitespace)
    m = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
    return m.accept_string(text) and m.is_completed()


@pytest.mark.parametrize("any_whitespace", [True, False])
@pytest.mark.parametrize("kind, guide, shape", CASES)
def test_strings_hold_no_raw_control_character_and_take_its_escape(compiler, kind, guide, shape, any_whitespace):
    def text(s):
        return shape.replace("{s}", s)

    assert accepts(compiler, kind, guide, text("ab"), any_whitespace)
    for c in CONTROLS:
        assert not accepts(compiler, kind, guide, text(f"a{c}b"), any_whitespace), repr(c)
        escaped = json.dumps(f"a{c}b")[1:-1]  # \n, \t, ... or \u00XX
        assert accepts(compiler, kind, guide, text(escaped), any_whitespace), escaped
        assert json.loads(text(escaped)) is not None  # what the grammar took, a strict parser takes
    for escaped in ('\\"', "\\\\", "\\/", "\\u00e9", "\\ud83d\\ude00", "é"):
        assert accepts(compiler, kind, guide, text(f"a{escaped}"), any_whitespace), escaped


def test_length_bounds_count_decoded_characters(compiler):
    """minLength / maxLength as JSON Schema counts them: an escape is one character, a surrogate pair one; a
    lone surrogate is no character at all."""
    schema = json.dumps({"type": "string", "minLength": 2, "maxLength": 3})
    for s, ok in [
        ("ab", True),
        ("abc", True),
        ("a", False),
        ("abcd", False),
        ('\\u00e9\\n\\"', True),  # three escapes: three characters
        ("\\ud83d\\ude00a", True),  # a surrogate pair and a letter: two
        ("\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00", False),  # four
        ("\\ud83da", False),  # a high surrogate without its low one
        ("\\ude00ab", False),  # a low surrogate alone
    ]:
        assert accepts(compiler, "json_schema", schema, f'"{s}"') == ok, s
        if ok:
            assert len(json.loads(f'"{s}"')) in (2, 3)


def test_repair_leaves_grammars_without_length_bounded_strings_as_they_are(compiler):
    import xgrammar as xgr

    plain = xgr.Grammar.from_json_schema(json.dumps({"type": "string"}))
    assert repair_strings(plain) is plain
    bounded = xgr.Grammar.from_json_schema(json.dumps(LENGTH))
    assert str(repair_strings(bounded)) != str(bounded)


def ws(n: int) -> str:
    """A whitespace run of n characters, of every kind JSON allows."""
    return ("\n" + " " * 3 + "\t" + "\r")[: min(n, 6)] + " " * max(0, n - 6)


OBJECT = json.dumps(
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}},
        "required": ["a", "b"],
    }
)
# every gap between two tokens of the text, as "{w}"
SPACED = {
    ("json_schema", OBJECT): '{{w}"a"{w}:{w}1{w},{w}"b"{w}:{w}[{w}"x"{w},{w}"y"{w}]{w}}',
    ("json", ""): '{{w}"a"{w}:{w}[{w}1{w},{w}{{w}}{w},{w}[{w}]{w}]{w},{w}"b"{w}:{w}null{w}}',
}


@pytest.mark.parametrize("kind, guide", list(SPACED))
def test_whitespace_runs_are_bounded(compiler, kind, guide):
    shape = SPACED[(kind, guide)]
    gaps = shape.count("{w}")
    assert accepts(compiler, kind, guide, shape.replace("{w}", ""))
    assert accepts(compiler, kind, guide, shape.replace("{w}", ws(MAX_WHITESPACE)))
    for i in range(gaps):  # each gap alone one character over the bound
        parts = shape.split("{w}")
        text = "".join(p + (ws(MAX_WHITESPACE + 1) if j == i else "") for j, p in enumerate(parts[:-1])) + parts[-1]
        assert not accepts(compiler, kind, guide, text), (i, text)


@pytest.mark.parametrize("kind, guide", list(SPACED))
def test_compact_layout_has_only_its_separators(compiler, kind, guide):
    value = json.loads(SPACED[(kind, guide)].replace("{w}", ""))
    compact = json.dumps(value)  # ", " and ": ": xgrammar's separators without free whitespace
    assert accepts(compiler, kind, guide, compact, any_whitespace=False)
    assert not accepts(compiler, kind, guide, json.dumps(value, separators=(",", ":")), any_whitespace=False)
    assert not accepts(compiler, kind, guide, json.dumps(value, indent=2), any_whitespace=False)
    assert accepts(compiler, kind, guide, json.dumps(value, indent=2))  # free whitespace takes the indented one


def test_any_json_is_an_object_or_an_array(compiler):
    for text in ('{"a": [1, -2.5e3, true, false, null, "x"]}', "[]", "{}", '[{"": {}}]'):
        assert accepts(compiler, "json", "", text), text
    for text in ('"x"', "1", "null", "{a: 1}", "[1,]", '{"a" 1}', "[01]"):
        assert not accepts(compiler, "json", "", text), text


def test_the_json_guide_takes_the_requests_layout(make_engine):
    """Any JSON in the server's layout comes compiled at load; a request's json_any_whitespace override gets its
    own compile (as a schema's does), and json_strict, which any JSON does not read, changes nothing."""
    import xgrammar as xgr

    engine = make_engine()

    def accepts_via_engine(options, text):
        m = xgr.GrammarMatcher(engine.grammar.submit(GuideType.JSON, "", options).future.result())
        return m.accept_string(text)

    compact = (("json_any_whitespace", False),)
    assert engine.grammar.submit(GuideType.JSON, "", ()).future.result() is engine.grammar.any_json
    assert engine.grammar.submit(GuideType.JSON, "", (("json_strict", False),)).future.result() is (
        engine.grammar.any_json
    )
    assert accepts_via_engine((), '{ "a":  1')
    assert accepts_via_engine((), "{" + " " * MAX_WHITESPACE) and not accepts_via_engine(
        (), "{" + " " * (MAX_WHITESPACE + 1)
    )
    assert accepts_via_engine(compact, '{"a": 1') and not accepts_via_engine(compact, "{ ")
