"""What the manifest needs to know about a set of tools: each spec, and whether it is typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from handrail.errors import UserError
from handrail.tools import ToolImpl, Toolset, ToolSpec, unguarded_path_arguments

__all__ = ["Implemented", "SpecSource", "is_typed", "tools_of"]


@runtime_checkable
class SpecSource(Protocol):
    """Anything that can list the specs of its tools (a `Toolbox` does)."""

    def specs(self) -> list[ToolSpec]:
        """What a model may be offered."""
        ...


def is_typed(impl: ToolImpl) -> bool:
    """Whether the tool's input schema comes from a Python type (`@hr.tool`, `hr.Tool`).

    A typed tool must not have `arguments` repeated in its grant; an untyped one (subprocess,
    MCP, injected) may state them there.
    """
    # The class says so: `@hr.tool` functions and `hr.Tool` subclasses are marked typed,
    # MCP tools untyped; any other impl is untyped. Read from the class, never the
    # instance, and without importing the typed tool core (which loads pydantic) to ask.
    marker = getattr(type(impl), "typed", None)
    return marker if isinstance(marker, bool) else False


@dataclass(frozen=True, slots=True)
class Implemented:
    """One tool the code offers, as the manifest sees it."""

    spec: ToolSpec
    """Its declaration."""
    typed: bool
    """Whether its input schema comes from a Python type."""
    origin: str
    """Where it was defined, for messages."""
    unguarded: tuple[str, ...] = ()
    """Arguments named like a path, URL or command that the policy cannot see."""


def tools_of(toolset: Toolset | SpecSource) -> list[Implemented]:
    """Each tool of `toolset`, in its order.

    A source that only lists specs (no impls) is taken as untyped throughout: nothing says the
    schemas come from Python types.
    """
    if isinstance(toolset, Toolset):
        return [Implemented(impl.spec, is_typed(impl), impl.origin,
                            tuple(unguarded_path_arguments(impl)))
                for impl in toolset.impls()]
    if isinstance(toolset, SpecSource):
        return [Implemented(spec, False, f"spec {spec.id}") for spec in toolset.specs()]
    raise UserError(
        f"expected a Toolbox (or anything with .impls() or .specs()), not "
        f"{type(toolset).__name__}"
    )
