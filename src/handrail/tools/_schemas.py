"""JSON Schema validators that never fetch: every schema a tool, a server or a form supplies.

jsonschema's default registry retrieves a `$ref` to a network URI with `urlopen` (blocking the
event loop, and reaching whatever host the schema names: past the policy, which decides every
other host handrail reaches). A schema here is someone else's text (a tool's, an MCP server's,
a form a tool asks a person to fill): only same-document refs and the drafts' metaschemas
resolve; any other `$ref` is an issue of the value checked, never a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handrail.errors import Issue

__all__ = ["local_validator", "schema_issues"]


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


def schema_issues(validator: Any, value: Any) -> list[Issue]:
    """The schema's issues with `value`; a `$ref` that does not resolve locally is one."""
    from referencing.exceptions import Unresolvable

    try:
        return [Issue(path=e.json_path, message=e.message)
                for e in sorted(validator.iter_errors(value), key=lambda e: e.json_path)]
    except Unresolvable as exc:
        return [Issue(path="$", message=f"the schema refers to {str(exc)[:300]}, which is not "
                                        "in the schema: a remote $ref is never fetched")]
