"""The list of JSON-schema keywords xgrammar does not enforce, checked against the installed xgrammar: for each
case, `jsonschema` confirms the instances (one valid, one violating), xgrammar's grammar accepts the valid one,
and it accepts the violating one exactly when schema_keywords reports a keyword. A case that fails means the list
and xgrammar disagree (e.g. after an xgrammar upgrade), in either direction."""

import json

import jsonschema
import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from specgram.grammar.schema_keywords import describe, unenforced_keyword

OBJ_AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}


def _b_needs_a(id: str, keywords: dict, reported: str) -> tuple:
    """A case over an object of a and b whose `keywords` require b once a is present: {"a": 1} violates."""
    return (id, {"type": "object", "properties": OBJ_AB, **keywords}, {"a": 1, "b": 2}, {"a": 1}, True, reported)


def _each_mode(id: str, schema: dict, valid, violating, reported: str | None, reported_strict: str | None) -> list:
    """The case not strict, then strict. Strict mode forbids the properties a schema does not name, which enforces
    some keywords that are not enforced otherwise."""
    return [
        (f"{id}, not strict", schema, valid, violating, False, reported),
        (f"{id}, strict", schema, valid, violating, True, reported_strict),
    ]


# (id, schema, valid instance, violating instance, strict, the keyword reported or None)
CASES = [
    # never enforced
    ("not", {"not": {"type": "integer"}}, "x", 1, True, "not"),
    _b_needs_a("if-then", {"if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
    ("contains", {"type": "array", "items": {}, "contains": {"type": "integer"}}, [1], ["a"], True, "contains"),
    (
        "uniqueItems",
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        [1, 2],
        [1, 1],
        True,
        "uniqueItems",
    ),
    _b_needs_a("dependentRequired", {"dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    _b_needs_a("dependentSchemas", {"dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas"),
    _b_needs_a("dependencies", {"dependencies": {"a": ["b"]}}, "dependencies"),
    *_each_mode(
        "unevaluatedProperties",
        {"type": "object", "properties": OBJ_AB, "unevaluatedProperties": False},
        {"a": 1},
        {"a": 1, "c": 3},
        "unevaluatedProperties",
        None,
    ),
    # numbers
    ("multipleOf integer", {"type": "integer", "multipleOf": 3}, 6, 7, True, None),
    (
        "multipleOf integer, both bounds",
        {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5},
        10,
        11,
        True,
        None,
    ),
    (
        "multipleOf integer, lower bound only",
        {"type": "integer", "minimum": 0, "multipleOf": 5},
        10,
        11,
        True,
        "multipleOf",
    ),
    (
        "multipleOf integer, upper bound only",
        {"type": "integer", "exclusiveMaximum": 100, "multipleOf": 5},
        10,
        11,
        True,
        "multipleOf",
    ),
    ("multipleOf number", {"type": "number", "multipleOf": 0.5}, 1.5, 1.3, True, "multipleOf"),
    ("minimum integer", {"type": "integer", "minimum": 5}, 5, 4, True, None),
    ("exclusiveMaximum number", {"type": "number", "exclusiveMaximum": 5.5}, 5.0, 5.5, True, None),
    ("minimum, type list", {"type": ["integer", "null"], "minimum": 3}, 3, 2, True, None),
    # strings
    ("maxLength", {"type": "string", "maxLength": 2}, "ab", "abc", True, None),
    ("pattern", {"type": "string", "pattern": "^a+$"}, "aa", "ab", True, None),
    (
        "minLength beside pattern",
        {"type": "string", "pattern": "^[a-z]*$", "minLength": 2},
        "ab",
        "a",
        True,
        "minLength",
    ),
    (
        "maxLength beside a known format",
        {"type": "string", "format": "email", "maxLength": 7},
        "a@b.com",
        "ab@cd.com",
        True,
        "maxLength",
    ),
    (
        "maxLength beside an unknown format",
        {"type": "string", "format": "color", "maxLength": 2},
        "ab",
        "abc",
        True,
        None,
    ),
    (
        "format uri-template is known",
        {"type": "string", "format": "uri-template", "maxLength": 3},
        "a",
        "abcd",
        True,
        "maxLength",
    ),
    # arrays and objects
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 2], [1], True, None),
    ("minItems, array without type", {"items": {"type": "integer"}, "minItems": 2}, [1, 2], [1], True, None),
    (
        "maxProperties",
        {"type": "object", "properties": OBJ_AB, "maxProperties": 1},
        {"a": 1},
        {"a": 1, "b": 2},
        True,
        None,
    ),
    ("required, object without type", {"properties": OBJ_AB, "required": ["a"]}, {"a": 1}, {"b": 1}, True, None),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 2}}, {"ab": 1}, {"abc": 1}, True, None),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^x.*$": {"type": "integer"}}},
        {"xa": 1},
        {"xa": "s"},
        False,
        None,
    ),
    *_each_mode(
        "patternProperties beside properties",
        {"type": "object", "properties": OBJ_AB, "patternProperties": {"^x.*$": {"type": "string"}}},
        {"a": 1, "xb": "s"},
        {"a": 1, "xb": 1},
        "patternProperties",
        None,
    ),
    # no type
    ("pattern without type", {"pattern": "^a+$"}, "aa", "b", True, "pattern"),
    ("minimum without type", {"minimum": 3}, 3, 2, True, "minimum"),
    ("required alone", {"required": ["a"]}, {"a": 1}, {}, True, "required"),
    # composition
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, 1, "x", True, None),
    (
        "anyOf, type beside typed branches",
        {
            "type": "object",
            "anyOf": [
                {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ],
        },
        {"a": 1},
        {"c": 1},
        True,
        None,
    ),
    (
        "required beside anyOf",
        {"type": "object", "properties": OBJ_AB, "required": ["a"], "anyOf": [{"type": "object"}]},
        {"a": 1},
        {},
        False,
        "properties",
    ),
    (
        "type beside an untyped branch",
        {"type": "integer", "anyOf": [{"minimum": 3}, {"maximum": 0}]},
        4,
        "x",
        True,
        "type",
    ),
    ("oneOf, disjoint", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, 1, "x", True, None),
    (
        "minimum beside $ref",
        {"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "minimum": 3},
        3,
        2,
        True,
        "minimum",
    ),
    ("$ref", {"$defs": {"i": {"type": "integer", "minimum": 3}}, "$ref": "#/$defs/i"}, 3, 2, True, None),
    ("allOf, one schema", {"allOf": [{"type": "integer", "minimum": 3}]}, 3, 2, True, None),
    (
        "allOf, two schemas",
        {"allOf": [{"type": "integer", "minimum": 3}, {"type": "integer", "maximum": 10}]},
        5,
        "x",
        True,
        "allOf",
    ),
    (
        "properties beside allOf",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "allOf": [{"type": "object"}]},
        {"a": 1},
        {},
        False,
        "properties",
    ),
    # found inside: the pointer names where
    (
        "nested uniqueItems",
        {
            "type": "object",
            "required": ["tags"],
            "properties": {"tags": {"type": "array", "items": {}, "uniqueItems": True}},
        },
        {"tags": [1]},
        {"tags": [1, 1]},
        True,
        "uniqueItems",
    ),
]


def accepts(schema, instance, strict) -> bool:
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=strict)
    return _is_grammar_accept_string(grammar, json.dumps(instance))


@pytest.mark.parametrize("schema, valid, violating, strict, keyword", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reported_exactly_when_xgrammar_lets_a_violation_through(schema, valid, violating, strict, keyword):
    validator = (jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator)(schema)
    assert validator.is_valid(valid) and not validator.is_valid(violating)  # the case itself is right
    found = unenforced_keyword(schema, strict)
    assert (found and found[0]) == keyword, found
    assert accepts(schema, valid, strict)
    assert accepts(schema, violating, strict) == (keyword is not None)


def test_the_message_names_the_keyword_and_its_place():
    schema = {"type": "object", "properties": {"a/b": {"type": "array", "items": {}, "uniqueItems": True}}}
    text = describe(unenforced_keyword(schema, True))
    assert "'uniqueItems'" in text and "#/properties/a~1b" in text


def test_annotations_and_unknown_keywords_are_not_reported():
    schema = {
        "type": "object",
        "title": "t",
        "description": "d",
        "x-order": 3,
        "$comment": "c",
        "properties": {
            "when": {"type": "string", "format": "date-time", "examples": ["2020-01-01T00:00:00Z"]},
            "not": {"type": "string", "default": "x"},
        },
    }  # a property named "not"
    assert unenforced_keyword(schema, True) is None
