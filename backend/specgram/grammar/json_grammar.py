"""JSON grammars whose every output a strict JSON parser accepts (RFC 8259), with whitespace that cannot run away.

Two guarantees, for every JSON guide (a schema, and any JSON):
- strings: no unescaped control character (U+0000-U+001F), which RFC 8259 forbids and `json.loads` refuses.
  xgrammar 0.2.9's string rule is right except for a string with minLength or maxLength: that one repeats a bare
  character class, `[^"\\\r\n]{min,max}`, which admits the other control characters raw and has no escape at
  all (so `\"`, `\n`, `\u00e9` cannot be written there). No xgrammar option changes that rule, so
  `repair_strings` rewrites it in the grammar's EBNF: each repetition is one JSON character, an unescaped one
  or one escape, so that minLength / maxLength still count the decoded string's characters (a surrogate pair,
  one character spelled as two escapes, is one repetition; a lone surrogate matches nothing).
- whitespace: with free whitespace (json_any_whitespace, the default), each run between two tokens of the
  JSON text holds at most MAX_WHITESPACE characters (xgrammar's max_whitespace_cnt); unbounded, a model that
  likes whitespace, a random or a hot one, can fill max_tokens with it and never finish. The compact layout
  (json_any_whitespace false) has none beyond its separators' single spaces (", " and ": ").

Any JSON (guide type json) is xgrammar's JSON-schema grammar for "an object or an array", which is the language
of its builtin JSON grammar (a JSON text whose top level is an object or an array) but takes the same
whitespace options; the builtin one has none.
"""

from __future__ import annotations

import re

# "\n" and then indentation to depth 7 at 4 spaces, 15 at 2: the layouts models write, with room to spare; a
# run that may go on where a model's logits favour whitespace costs at most this many characters per gap
MAX_WHITESPACE = 32

# what the grammar of any JSON is the schema of (strict mode off: any keys, any values)
ANY_JSON_SCHEMA = '{"type": ["object", "array"]}'

# xgrammar's rule for one character of a string with minLength / maxLength, as it prints it (one rule per such
# string: `name ::= (([^\"\\\r\n]))`)
_LENGTH_CHAR_RULE = re.compile(r'^(?P<name>\S+) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.MULTILINE)

# One JSON string character: unescaped (not '"', not '\', not U+0000-U+001F) or one escape. A \uXXXX escape is
# one character unless it is a surrogate: a high one followed by a low one is one character, alone it is none.
_JSON_CHAR_RULES = """
{char} ::= [^"\\\\\\x00-\\x1f] | "\\\\" {escape}
{escape} ::= [\\"\\\\/bfnrt] | "u" {bmp} | "u" [dD] [89abAB] {hex} {hex} "\\\\u" [dD] [c-fC-F] {hex} {hex}
{bmp} ::= [0-9a-cA-Ce-fE-F] {hex} {hex} {hex} | [dD] [0-7] {hex} {hex}
{hex} ::= [0-9a-fA-F]
"""


def schema_grammar(schema: str, strict: bool, any_whitespace: bool):
    """A JSON schema's xgrammar Grammar (not compiled), strings repaired and whitespace bounded."""
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(
        schema,
        any_whitespace=any_whitespace,
        strict_mode=strict,
        max_whitespace_cnt=MAX_WHITESPACE if any_whitespace else None,
    )
    return repair_strings(grammar)


def any_json_grammar(any_whitespace: bool):
    """Any JSON object or array, as an xgrammar Grammar (not compiled), whitespace bounded."""
    return schema_grammar(ANY_JSON_SCHEMA, strict=False, any_whitespace=any_whitespace)


def repair_strings(grammar):
    """grammar with every length-bounded string's character rule made one JSON character (see the module's
    docstring); the grammar itself where it has none."""
    import xgrammar as xgr

    text = str(grammar)
    if not _LENGTH_CHAR_RULE.search(text):
        return grammar
    names = _fresh_names(text, ("char", "escape", "bmp", "hex"))
    text = _LENGTH_CHAR_RULE.sub(lambda m: f"{m['name']} ::= {names['char']}", text)
    return xgr.Grammar.from_ebnf(text + _JSON_CHAR_RULES.format(**names), root_rule_name="root")


def _fresh_names(text: str, roles: tuple[str, ...]) -> dict[str, str]:
    """role -> a rule name that text does not define (xgrammar names rules after a schema's properties)."""
    defined = set(re.findall(r"^(\S+) ::=", text, re.MULTILINE))
    names = {}
    for role in roles:
        name, n = f"json_string_{role}", 0
        while name in defined:
            n += 1
            name = f"json_string_{role}_{n}"
        names[role] = name
    return names
