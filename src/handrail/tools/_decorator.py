"""The `@tool` decorator, importable without pydantic.

`FunctionTool` (in `_tool`) builds the argument model and the schemas with pydantic; this module
imports it when a tool is defined, so `from handrail import tool` costs nothing more (issue 11).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar, overload

if TYPE_CHECKING:
    from handrail.tools._actions import Action
    from handrail.tools._tool import FunctionTool

__all__ = ["tool"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def tool(fn: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def tool(
    *,
    server: str | None = None,
    name: str | None = None,
    description: str | None = None,
    mutates: bool = True,
    idempotent: bool = False,
    timeout: float | None = None,
    interactions: Iterable[str] = (),
    actions: Callable[..., Sequence[Action]] | None = None,
    protected: Iterable[str] = (),
    trusted_output: bool = False,
    sanitizes: Iterable[str] = (),
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    server: str | None = None,
    name: str | None = None,
    description: str | None = None,
    mutates: bool = True,
    idempotent: bool = False,
    timeout: float | None = None,
    interactions: Iterable[str] = (),
    actions: Callable[..., Sequence[Action]] | None = None,
    protected: Iterable[str] = (),
    trusted_output: bool = False,
    sanitizes: Iterable[str] = (),
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Declare a tool from a sync or async function.

    ```python
    @hr.tool(server="ledger", mutates=False)
    async def read(account: str) -> int:
        \"\"\"Read a ledger account's balance (`account`: the account's id).\"\"\"
        return balances[account]
    ```

    Args:
        fn: The function (when used without parentheses).
        server: The server (namespace) of the tool; default `local`.
        name: The tool's name; default the function's name.
        description: What the model is told; default the docstring's text before its sections.
        mutates: Whether a call may change the world; default True (the cautious direction).
        idempotent: Whether repeating a call is harmless.
        timeout: Per-call deadline in seconds.
        interactions: Interaction kinds the tool may use: `"question"`, `"form"`.
        actions: A function of the arguments returning the `Action`s a call touches; default
            `CALL server/name`.
        protected: JSON Pointers of the arguments that must not come from untrusted tool
            output without a person (`["/to", "/amount"]`); see docs/taint.md.
        trusted_output: Whether this tool's output is trusted data (default False: every
            tool result is untrusted).
        sanitizes: JSON Pointers into the structured output whose values the tool has
            validated; they become trusted for the rest of the run.
    """
    def wrap(f: Callable[P, R]) -> FunctionTool[P, R]:
        # Defining a typed tool is what loads pydantic; importing `tool` does not (issue 11).
        from handrail.tools._tool import FunctionTool

        return FunctionTool(
            f, server=server, name=name, description=description, mutates=mutates,
            idempotent=idempotent, timeout=timeout, interactions=interactions, actions=actions,
            protected=protected, trusted_output=trusted_output, sanitizes=sanitizes,
        )

    if fn is not None:
        return wrap(fn)
    return wrap
