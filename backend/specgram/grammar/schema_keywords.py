"""JSON-schema keywords that xgrammar (0.2.9) accepts but does not enforce, found before compiling.

xgrammar compiles such a schema without an error and the masks then allow instances that violate it: the
client asked for a constraint that silently does not hold. `unenforced_keyword` finds the first one (the
engine's `json_unsupported_keywords` setting decides whether that fails the request). Each rule below was
established by compiling a schema with the keyword and checking whether xgrammar's grammar accepts a violating
instance; tests/unit/test_schema_keywords.py repeats every case against the installed xgrammar, so a change
in xgrammar shows up as a failing case rather than as a wrong list.

What xgrammar does, and so what is reported:
- never enforced: not, if/then/else, contains/minContains/maxContains, dependentRequired, dependentSchemas,
  dependencies, uniqueItems (true); unevaluatedProperties false outside strict mode;
- multipleOf: enforced only for type integer with an integral value and with both or neither of a lower and an
  upper bound;
- a schema with $ref, anyOf, oneOf or allOf is that keyword alone: xgrammar drops the other validation keywords
  beside it (`type` is kept in effect when every branch pins a type itself, and beside $ref); allOf with more
  than one schema constrains nothing at all;
- a schema without `type` that is not recognisably an object (properties, additionalProperties,
  unevaluatedProperties) or an array (items, prefixItems, unevaluatedItems) accepts any value: its other
  validation keywords (pattern, minLength, minimum, required, ...) are dropped;
- strings: pattern wins over minLength/maxLength, and so does a format xgrammar knows (FORMATS);
- patternProperties beside properties outside strict mode.
Not reported (enforced, or annotations by the JSON Schema specification): format (an annotation in JSON Schema
2020-12; xgrammar enforces the FORMATS below and ignores others), contentEncoding/contentMediaType, title,
description, default, examples; oneOf whose branches xgrammar cannot prove disjoint is enforced as anyOf (at
least one branch holds); const/enum fix the value, so keywords beside them are not reported.
"""

from __future__ import annotations

# formats xgrammar turns into a regex (others are left unchecked, as JSON Schema allows for an annotation)
FORMATS = frozenset(
    {
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
# JSON Schema's validation keywords (2020-12, plus draft-7's dependencies and additionalItems); anything else is
# an annotation or unknown, which JSON Schema itself ignores
VALIDATION = frozenset(
    {
        "type",
        "enum",
        "const",
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "items",
        "prefixItems",
        "additionalItems",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
        "maxItems",
        "minItems",
        "uniqueItems",
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "required",
        "maxProperties",
        "minProperties",
        "dependentRequired",
        "dependencies",
    }
)
NEVER = ("not", "if", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas", "dependencies")
# the first of these present is the whole schema for xgrammar
HEADS = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
OBJECT_HINTS = ("properties", "additionalProperties", "unevaluatedProperties")
ARRAY_HINTS = ("items", "prefixItems", "unevaluatedItems")
# where subschemas sit: one schema, a list of schemas, a map of name -> schema
ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")

Finding = tuple[str, str, str]  # (keyword, JSON pointer of the schema holding it, why it is not enforced)


def unenforced_keyword(schema, strict: bool) -> Finding | None:
    """The first keyword in `schema` (parsed JSON) that xgrammar would not enforce, or None."""
    return _walk(schema, "", strict)


def describe(finding: Finding) -> str:
    keyword, pointer, why = finding
    return f"JSON-schema keyword {keyword!r} at #{pointer} {why}"


def _walk(s, ptr: str, strict: bool) -> Finding | None:
    if not isinstance(s, dict):
        return None
    found = _here(s, ptr, strict)
    if found:
        return found
    for key in ONE:
        if isinstance(s.get(key), dict):
            sub = {"type": "string", **s[key]} if key == "propertyNames" else s[key]  # names are strings
            found = found or _walk(sub, f"{ptr}/{key}", strict)
    for key in LISTS:
        if isinstance(s.get(key), list):
            for i, sub in enumerate(s[key]):
                found = found or _walk(sub, f"{ptr}/{key}/{i}", strict)
    for key in MAPS:
        if isinstance(s.get(key), dict):
            for name, sub in s[key].items():
                found = found or _walk(sub, f"{ptr}/{key}/{_escape(name)}", strict)
    return found


def _here(s: dict, ptr: str, strict: bool) -> Finding | None:
    """The rules for one schema object, its subschemas aside."""
    for key in NEVER:
        if key in s:
            return key, ptr, "is not enforced by the grammar engine"
    if s.get("uniqueItems") is True:
        return "uniqueItems", ptr, "is not enforced by the grammar engine"
    if s.get("unevaluatedProperties") is False and not strict:
        return "unevaluatedProperties", ptr, "false is enforced only with the server's json_strict setting"
    head = next((k for k in HEADS if k in s), None)
    if head is not None:
        return _beside_head(s, ptr, head)
    t = s.get("type")
    if t is not None and not (isinstance(t, str) or isinstance(t, list) and all(isinstance(x, str) for x in t)):
        return None  # a malformed type: the compile refuses the schema, with xgrammar's reason
    types = _types(s)
    if not types and not any(k in s for k in OBJECT_HINTS + ARRAY_HINTS):
        dropped = next((k for k in s if k in VALIDATION), None)
        return dropped and (dropped, ptr, "is not enforced in a schema without 'type' (any value is accepted)")
    return _numbers(s, ptr, types) or _strings(s, ptr, types) or _objects(s, ptr, strict)


def _beside_head(s: dict, ptr: str, head: str) -> Finding | None:
    if head == "allOf" and isinstance(s["allOf"], list) and len(s["allOf"]) > 1:
        return "allOf", ptr, "with more than one schema is not enforced by the grammar engine"
    if head in ("const", "enum"):
        return None  # the value is one of those given
    for key in s:
        if key == head or key not in VALIDATION:
            continue
        if key == "type" and (head == "$ref" or isinstance(s[head], list) and all(map(_pins_type, s[head]))):
            continue
        return key, ptr, f"is not enforced next to {head!r} (the grammar engine uses {head!r} alone)"
    return None


def _pins_type(branch) -> bool:
    return isinstance(branch, dict) and (
        bool(_types(branch)) or any(k in branch for k in HEADS) or any(k in branch for k in OBJECT_HINTS + ARRAY_HINTS)
    )


def _numbers(s: dict, ptr: str, types: list) -> Finding | None:
    if "multipleOf" not in s or not {"integer", "number"} & set(types):
        return None
    value = s["multipleOf"]
    lower = "minimum" in s or "exclusiveMinimum" in s
    upper = "maximum" in s or "exclusiveMaximum" in s
    whole = isinstance(value, int) or isinstance(value, float) and value.is_integer()
    if "number" in types or not whole:
        return "multipleOf", ptr, "is enforced only for type integer with a whole-number value"
    if lower != upper:
        return "multipleOf", ptr, "is not enforced together with only one of a lower and an upper bound"
    return None


def _strings(s: dict, ptr: str, types: list) -> Finding | None:
    if "string" not in types:
        return None
    fmt = s.get("format")
    winner = "pattern" if "pattern" in s else "format" if isinstance(fmt, str) and fmt in FORMATS else None
    if winner:
        for key in ("minLength", "maxLength"):
            if key in s:
                return key, ptr, f"is not enforced next to {winner!r}"
    return None


def _objects(s: dict, ptr: str, strict: bool) -> Finding | None:
    if "patternProperties" in s and "properties" in s and not strict:
        return ("patternProperties", ptr, "beside 'properties' is enforced only with the server's json_strict setting")
    return None


def _types(s: dict) -> list:
    t = s.get("type")
    return [t] if isinstance(t, str) else [x for x in t if isinstance(x, str)] if isinstance(t, list) else []


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")
