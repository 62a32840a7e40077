"""`ToolSpec`: a tool declared in plain JSON Schema (what a model may be offered)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from handrail.errors import UserError
from handrail.tools._names import ToolId
from handrail.tools._taint import check_pointers

__all__ = ["InteractionKind", "ToolSpec"]

InteractionKind = Literal["question", "form"]
_KINDS: frozenset[str] = frozenset({"question", "form"})
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool's declaration: identity, model-facing description, schemas and traits.

    Python tools derive theirs from their types; MCP, subprocess and injected tools declare one
    directly: `ToolSpec("ledger/transfer", "Move money.", {"type": "object", ...})`.
    """

    id: ToolId
    """Where the tool lives; a `"server/name"` string is accepted and parsed."""
    description: str
    """What the model is told the tool does."""
    input_schema: Mapping[str, Any]
    """JSON Schema of the arguments; always an object schema."""
    output_schema: Mapping[str, Any] | None = None
    """JSON Schema of `ToolResult.structured` on success, when the tool declares one."""
    annotations: Mapping[str, Any] = field(default_factory=dict)
    """Free-form hints (MCP tool annotations such as `readOnlyHint`)."""
    mutates: bool = True
    """Whether a call may change the world; True unless the author says otherwise."""
    idempotent: bool = False
    """Whether repeating a call is harmless, so an in-doubt call may be retried automatically."""
    interactions: frozenset[str] = frozenset()
    """The interaction kinds the tool may use: `"question"` (`ctx.ask`), `"form"` (`ctx.elicit`)."""
    timeout: float | None = None
    """Per-call deadline in seconds; None for no deadline."""
    protected: tuple[str, ...] = ()
    """JSON Pointers of the arguments that must not come from untrusted output without a
    person (`/to`, `/amount`, `/path`); see docs/taint.md."""
    trusted_output: bool = False
    """Whether this tool's output is trusted data (a manifest grant may override it); by
    default every tool result is untrusted."""
    sanitizes: tuple[str, ...] = ()
    """JSON Pointers into the structured output whose values the tool has validated: they
    become trusted for the rest of the run (recorded with the call)."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, ToolId):
            object.__setattr__(self, "id", ToolId.of(self.id))
        if not isinstance(self.description, str):
            raise UserError(f"tool '{self.id}': description must be a string")
        if not isinstance(self.input_schema, Mapping):
            raise UserError(f"tool '{self.id}': input_schema must be a JSON Schema object")
        schema_type = self.input_schema.get("type", "object")
        if schema_type != "object":
            raise UserError(
                f"tool '{self.id}': input_schema must describe a JSON object (type 'object'), "
                f"got type {schema_type!r}"
            )
        if self.output_schema is not None and not isinstance(self.output_schema, Mapping):
            raise UserError(f"tool '{self.id}': output_schema must be a JSON Schema or None")
        if isinstance(self.interactions, str):
            raise UserError(
                f"tool '{self.id}': interactions takes a set of kinds, e.g. "
                f"{{{self.interactions!r}}}, not a string"
            )
        kinds = frozenset(self.interactions)
        unknown = kinds - _KINDS
        if unknown:
            raise UserError(
                f"tool '{self.id}': unknown interaction kind(s) {sorted(unknown)}; "
                "use 'question' and/or 'form'"
            )
        object.__setattr__(self, "interactions", kinds)
        tool = str(self.id)
        object.__setattr__(self, "protected", check_pointers(tool, "protected", self.protected))
        object.__setattr__(self, "sanitizes", check_pointers(tool, "sanitizes", self.sanitizes))
        if not isinstance(self.trusted_output, bool):
            raise UserError(f"tool '{self.id}': trusted_output must be True or False")
        if self.timeout is not None and not self.timeout > 0:
            raise UserError(f"tool '{self.id}': timeout must be a positive number of seconds")

    def replace(self, **changes: Any) -> ToolSpec:
        """A copy with some fields changed (e.g. the manifest's description)."""
        return dataclasses.replace(self, **changes)
