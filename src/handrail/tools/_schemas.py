"""JSON Schema validators that never fetch: every schema a tool, a server or a form supplies.

jsonschema's default registry retrieves a `$ref` to a network URI with `urlopen` (blocking the
event loop, and reaching whatever host the schema names: past the policy, which decides every
other host handrail reaches). A schema here is someone else's text (a tool's, an MCP server's,
a form a tool asks a person to fill): only same-document refs and the drafts' metaschemas
resolve; any other `$ref` is an issue of the value checked, never a request.

`compile_check` turns the plain schemas most tools have (an object of typed properties, as
pydantic and the MCP SDK write them) into one Python predicate that answers "valid" in a few
microseconds, where jsonschema's walk costs 30-80 (benchmarks/README.md, MCP). It is a fast
path, not a second validator: it says True only when jsonschema would find no error, and
anything it does not model exactly (`$ref`, `oneOf`, `pattern`, a draft-4 boolean bound, an
unknown keyword) makes the whole schema uncompiled. A value it does not pass goes to
jsonschema, which writes the issues — so the messages a model reads are jsonschema's, always.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from handrail.errors import Issue

__all__ = ["compile_check", "local_validator", "schema_issues"]


def local_validator(schema: Mapping[str, Any], *, check: bool = False) -> Any:
    """A validator for `schema` (its own draft, 2020-12 by default) that retrieves nothing.

    `check`: raise `jsonschema.SchemaError` first when `schema` is not a valid schema.
    """
    import jsonschema
    import referencing

    schema = dict(schema)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if check:
        cls.check_schema(schema)
    return cls(schema, registry=referencing.Registry())


def schema_issues(validator: Any, value: Any,
                  fast: Callable[[Any], bool] | None = None) -> list[Issue]:
    """The schema's issues with `value`; a `$ref` that does not resolve locally is one.

    `fast`: the schema's `compile_check`, if it has one: a value it passes has no issues.
    """
    if fast is not None and fast(value):
        return []
    from referencing.exceptions import Unresolvable

    try:
        return [Issue(path=e.json_path, message=e.message)
                for e in sorted(validator.iter_errors(value), key=lambda e: e.json_path)]
    except Unresolvable as exc:
        return [Issue(path="$", message=f"the schema refers to {str(exc)[:300]}, which is not "
                                        "in the schema: a remote $ref is never fetched")]


Check = Callable[[Any], bool]
Keyword = Callable[[dict[str, Any], Any, int], list[Check]]

# Keywords that only annotate (jsonschema asserts none of them: no validator here is given a
# format checker, so `format` is an annotation too, as the 2020-12 default vocabulary says).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly", "format", "$schema"})
# The drafts whose meaning of the keywords below is the same (draft 4 differs: its
# exclusiveMinimum is a boolean, refused below by type).
_DRAFTS = frozenset({None, "https://json-schema.org/draft/2020-12/schema",
                     "https://json-schema.org/draft/2019-09/schema",
                     "http://json-schema.org/draft-07/schema#",
                     "http://json-schema.org/draft-07/schema",
                     "http://json-schema.org/draft-06/schema#"})
_MAX_DEPTH = 32


class _Uncompiled(Exception):
    """The schema has something the fast path does not model exactly."""


def compile_check(schema: Any) -> Check | None:
    """A predicate True only for values `schema` accepts (jsonschema's verdict), or None.

    None when the schema uses anything outside the plain subset: `type` (one or several),
    `properties`, `required`, `additionalProperties`, `items` (one schema), `enum` of
    strings, `anyOf`, `allOf`, numeric bounds, length and item-count bounds, and annotations.
    A False from the predicate means "ask jsonschema", not "invalid": it is conservative
    where Python types and JSON types do not line up (a tuple, a Decimal).
    """
    if isinstance(schema, Mapping) and schema.get("$schema") not in _DRAFTS:
        return None
    try:
        return _compile(schema, 0)
    except _Uncompiled:
        return None


def _is_integer(v: Any) -> bool:
    t = type(v)
    return t is int or (t is float and v.is_integer())


def _is_number(v: Any) -> bool:
    t = type(v)
    return t is int or t is float


_TYPES: dict[str, Check] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def _compile(schema: Any, depth: int) -> Check:
    if schema is True:
        return _always
    if schema is False:
        return _never
    if type(schema) is not dict or depth > _MAX_DEPTH:
        raise _Uncompiled
    checks: list[Check] = []
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        keyword = _KEYWORDS.get(key)
        if keyword is None:
            raise _Uncompiled
        checks.extend(keyword(schema, value, depth))
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return _all_of(checks)


def _always(v: Any) -> bool:
    return True


def _never(v: Any) -> bool:
    return False


def _all_of(checks: list[Check]) -> Check:
    def check(v: Any) -> bool:
        return all(c(v) for c in checks)
    return check


def _any_of(checks: list[Check]) -> Check:
    def check(v: Any) -> bool:
        return any(c(v) for c in checks)
    return check


def _type(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    names = [value] if type(value) is str else value
    if type(names) is not list or not names or any(n not in _TYPES for n in names):
        raise _Uncompiled
    preds = [_TYPES[n] for n in names]
    return [preds[0] if len(preds) == 1 else _any_of(preds)]


def _properties(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    if type(value) is not dict:
        raise _Uncompiled
    props = [(name, _compile(sub, depth + 1)) for name, sub in value.items()]

    def check(v: Any) -> bool:
        return type(v) is not dict or all(c(v[name]) for name, c in props if name in v)
    return [check]


def _required(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    if type(value) is not list or any(type(n) is not str for n in value):
        raise _Uncompiled
    names = list(value)

    def check(v: Any) -> bool:
        return type(v) is not dict or all(n in v for n in names)
    return [check]


def _additional(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    if "patternProperties" in schema or type(schema.get("properties", {})) is not dict:
        raise _Uncompiled
    known = frozenset(schema.get("properties") or ())
    extra = _compile(value, depth + 1)

    def check(v: Any) -> bool:
        return type(v) is not dict or all(extra(item) for name, item in v.items()
                                          if name not in known)
    return [check]


def _items(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    if "prefixItems" in schema:
        raise _Uncompiled
    each = _compile(value, depth + 1)  # a list (draft 7's tuple form) is not a dict: refused

    def check(v: Any) -> bool:
        return type(v) is not list or all(map(each, v))
    return [check]


def _enum(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    if type(value) is not list or any(type(x) is not str for x in value):
        raise _Uncompiled
    allowed = frozenset(value)

    def check(v: Any) -> bool:
        return type(v) is str and v in allowed
    return [check]


def _branches(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    if type(value) is not list or not value:
        raise _Uncompiled
    return [_compile(sub, depth + 1) for sub in value]


def _any_keyword(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
    return [_any_of(_branches(schema, value, depth))]


def _bound(kind: str) -> Keyword:
    # Only a number is bounded (a string or null passes a bound); a bool is not a number.
    def keyword(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise _Uncompiled
        bound = value

        def check(v: Any) -> bool:
            if not _is_number(v):
                return True
            if kind == "minimum":
                return bool(v >= bound)
            if kind == "maximum":
                return bool(v <= bound)
            if kind == "exclusiveMinimum":
                return bool(v > bound)
            return bool(v < bound)
        return [check]
    return keyword


def _size(kind: type[str] | type[list[Any]], least: bool) -> Keyword:
    # minLength/maxLength count code points (len of a str); min/maxItems the list's length.
    def keyword(schema: dict[str, Any], value: Any, depth: int) -> list[Check]:
        if type(value) is not int or value < 0:
            raise _Uncompiled
        n = value

        def check(v: Any) -> bool:
            if type(v) is not kind:
                return True
            return len(v) >= n if least else len(v) <= n
        return [check]
    return keyword


_KEYWORDS: dict[str, Keyword] = {
    "type": _type,
    "properties": _properties,
    "required": _required,
    "additionalProperties": _additional,
    "items": _items,
    "enum": _enum,
    "anyOf": _any_keyword,
    "allOf": _branches,
    "minimum": _bound("minimum"),
    "maximum": _bound("maximum"),
    "exclusiveMinimum": _bound("exclusiveMinimum"),
    "exclusiveMaximum": _bound("exclusiveMaximum"),
    "minLength": _size(str, True),
    "maxLength": _size(str, False),
    "minItems": _size(list, True),
    "maxItems": _size(list, False),
}
