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
from typing import Any, cast

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

    The predicate is Python source generated from the schema and compiled once: a function
    of `if ...: return False` lines per schema object (issue 38: closures combined with
    `all()` over generator expressions cost ~500 bytecodes a call for a two-integer
    object, in and out, a fourteenth of `handrail serve`'s). Only names it makes itself
    appear in the source: every value from the schema (a property's name, a bound, an
    enum) is bound in the function's namespace, never written into its text.
    """
    if isinstance(schema, Mapping) and schema.get("$schema") not in _DRAFTS:
        return None
    if schema is True:
        return _always
    if schema is False:
        return _never
    try:
        source = _Source()
        entry = source.function(schema, 0)
        namespace: dict[str, Any] = dict(source.constants)
        exec(compile("\n".join(source.functions), "<compile_check>", "exec"), namespace)
    except (_Uncompiled, SyntaxError, RecursionError, MemoryError):
        return None  # (jsonschema checks every value: slower, the same verdicts)
    return cast(Check, namespace[entry])


def _always(v: Any) -> bool:
    return True


def _never(v: Any) -> bool:
    return False


# A JSON type's test of the value named `{0}`.
_TYPES: dict[str, str] = {
    "object": "type({0}) is dict",
    "array": "type({0}) is list",
    "string": "type({0}) is str",
    "integer": "(type({0}) is int or (type({0}) is float and {0}.is_integer()))",
    "number": "(type({0}) is int or type({0}) is float)",
    "boolean": "type({0}) is bool",
    "null": "{0} is None",
}
# Keywords whose subschemas are checked in a function of their own: the lines of a schema
# object stay a few blocks deep (Python refuses more than 20 nested blocks).
_NESTING = frozenset({"properties", "additionalProperties", "items", "anyOf", "allOf"})
_BOUNDS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
_SIZES = {"minLength": ("str", "<"), "maxLength": ("str", ">"),
          "minItems": ("list", "<"), "maxItems": ("list", ">")}
_MAX_LINES = 4096
"""The most lines a schema's check is generated with (~2,000 typed properties); a larger
schema, which a server can send, is left to jsonschema: compiling costs ~0.15 ms a line."""


class _Source:
    """The functions `compile_check` generates for a schema, and the values they name."""

    def __init__(self) -> None:
        self.functions: list[str] = []
        self.constants: dict[str, Any] = {}
        self._names = 0
        self._lines = 0

    def constant(self, value: Any) -> str:
        name = f"_k{len(self.constants)}"
        self.constants[name] = value
        return name

    def variable(self) -> str:
        self._names += 1
        return f"x{self._names}"

    def function(self, schema: Any, depth: int) -> str:
        """A function of one value for `schema`; its name."""
        index = len(self.functions)
        self.functions.append("")  # (its place: nested ones come after it)
        lines = self.lines(schema, "x0", depth, 1)
        self._lines += len(lines) + 2
        if self._lines > _MAX_LINES:
            raise _Uncompiled
        self.functions[index] = "\n".join([f"def _f{index}(x0):", *lines, "    return True"])
        return f"_f{index}"

    def check(self, schema: Any, x: str, depth: int, indent: int) -> list[str]:
        """`schema`'s lines for the value `x`: inline when flat, else a call of its own."""
        if type(schema) is dict and _NESTING & schema.keys():
            if depth + 1 > _MAX_DEPTH:
                raise _Uncompiled
            return [f"{'    ' * indent}if not {self.function(schema, depth + 1)}({x}): "
                    "return False"]
        return self.lines(schema, x, depth + 1, indent)

    def lines(self, schema: Any, x: str, depth: int, indent: int) -> list[str]:
        """Lines that return False when `x` fails `schema` (and fall through when it passes)."""
        pad = "    " * indent
        if schema is True:
            return []
        if schema is False:
            return [f"{pad}return False"]
        if type(schema) is not dict or depth > _MAX_DEPTH:
            raise _Uncompiled
        out: list[str] = []
        for key, value in schema.items():
            if key in _ANNOTATIONS:
                continue
            if key == "type":
                names = [value] if type(value) is str else value
                if type(names) is not list or not names or any(
                        type(n) is not str or n not in _TYPES for n in names):
                    raise _Uncompiled
                test = " or ".join(_TYPES[n].format(x) for n in dict.fromkeys(names))
                out.append(f"{pad}if not ({test}): return False")
            elif key == "properties":
                if type(value) is not dict:
                    raise _Uncompiled
                inner: list[str] = []
                for name, sub in value.items():
                    y = self.variable()
                    body = self.check(sub, y, depth, indent + 2)
                    if body:
                        k = self.constant(name)
                        inner += [f"{pad}    if {k} in {x}:", f"{pad}        {y} = {x}[{k}]",
                                  *body]
                if inner:
                    out += [f"{pad}if type({x}) is dict:", *inner]
            elif key == "required":
                if type(value) is not list or any(type(n) is not str for n in value):
                    raise _Uncompiled
                if value:
                    k = self.constant(frozenset(value))
                    out.append(f"{pad}if type({x}) is dict and not {x}.keys() >= {k}: "
                               "return False")
            elif key == "additionalProperties":
                if "patternProperties" in schema or type(schema.get("properties", {})) \
                        is not dict:
                    raise _Uncompiled
                known = self.constant(frozenset(schema.get("properties") or ()))
                if value is False:
                    out.append(f"{pad}if type({x}) is dict and not {known}.issuperset({x}): "
                               "return False")
                    continue
                key_var, y = self.variable(), self.variable()
                body = self.check(value, y, depth, indent + 3)
                if body:
                    out += [f"{pad}if type({x}) is dict:",
                            f"{pad}    for {key_var}, {y} in {x}.items():",
                            f"{pad}        if {key_var} not in {known}:", *body]
            elif key == "items":
                if "prefixItems" in schema:
                    raise _Uncompiled
                y = self.variable()
                body = self.check(value, y, depth, indent + 2)  # a list (draft 7): refused
                if body:
                    out += [f"{pad}if type({x}) is list:", f"{pad}    for {y} in {x}:", *body]
            elif key == "enum":
                if type(value) is not list or any(type(e) is not str for e in value):
                    raise _Uncompiled
                k = self.constant(frozenset(value))
                out.append(f"{pad}if not (type({x}) is str and {x} in {k}): return False")
            elif key in ("anyOf", "allOf"):
                if type(value) is not list or not value:
                    raise _Uncompiled
                if key == "allOf":
                    for sub in value:
                        out += self.check(sub, x, depth, indent)
                    continue
                branches = []
                for sub in value:
                    if sub is True:
                        branches.append("True")
                    elif sub is False:
                        branches.append("False")
                    else:
                        if type(sub) is not dict or depth + 1 > _MAX_DEPTH:
                            raise _Uncompiled
                        branches.append(f"{self.function(sub, depth + 1)}({x})")
                out.append(f"{pad}if not ({' or '.join(branches)}): return False")
            elif key in _BOUNDS:
                if type(value) not in (int, float) or not math.isfinite(value):
                    raise _Uncompiled
                k = self.constant(value)
                # Only a number is bounded (a string or null passes); a bool is no number.
                out.append(f"{pad}if {_TYPES['number'].format(x)} and not {x} {_BOUNDS[key]} {k}: "
                           "return False")
            elif key in _SIZES:
                if type(value) is not int or value < 0:
                    raise _Uncompiled
                kind, fails = _SIZES[key]
                out.append(f"{pad}if type({x}) is {kind} and len({x}) {fails} "
                           f"{self.constant(value)}: return False")
            else:
                raise _Uncompiled
        return out
