"""`Toolbox`: the registry that dispatches by tool id, once, here; and the `Toolset` protocol."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from handrail.errors import (
    CallCancelled,
    HandlerStateError,
    InvalidArguments,
    InvalidOutput,
    Issue,
    UnknownTool,
    UserError,
)
from handrail.tools._content import ToolResult
from handrail.tools._context import CallContext
from handrail.tools._handler import (
    DEFAULT_MAX_ARGUMENT_BYTES,
    ToolHandler,
    ToolImpl,
    check_argument_payload,
    raise_body_error,
)
from handrail.tools._names import DEFAULT_SERVER, ToolId
from handrail.tools._schemas import compile_check, schema_issues
from handrail.tools._spec import ToolSpec
from handrail.tools._steps import Cancel, Finished, Invoke

__all__ = ["SchemaTool", "Toolbox", "Toolset", "as_impl"]


@runtime_checkable
class Toolset(Protocol):
    """Anything that offers tools: a Toolbox, an MCP server's tools, injected host tools.

    A toolset whose tools can change while it is in use (an MCP server that announces
    `tools/list_changed`) also has `version` (an int that grows when `impls()` changed),
    `async refresh()` (bring `impls()` up to date) and `withdrawn()` (tool id -> why a tool
    is no longer offered); a `Toolbox` holding it re-reads it in `refreshed()`.
    """

    def impls(self) -> Iterable[ToolImpl]:
        """Every tool this set offers."""
        ...


_UNKNOWN_FIELD = "unknown field; remove it (the tool accepts only the fields in its schema)"
# Top-level keywords that let properties other than `properties` in: with any of them the
# schema itself decides what is unknown.
_OPEN_KEYWORDS = frozenset({
    "additionalProperties", "unevaluatedProperties", "patternProperties", "allOf", "anyOf",
    "oneOf", "$ref", "$dynamicRef", "if", "then", "else", "dependentSchemas", "dependencies",
    "not",
})


class SchemaTool(ToolImpl):
    """A tool declared by a `ToolSpec` (plain JSON Schema) and run by an async function.

    The building block for tools with no Python type: injected host tools, subprocess tools.
    Arguments are validated against `spec.input_schema` (its `$schema` draft, 2020-12 by
    default) and, on success, `structured` against `spec.output_schema`.

    Unknown fields are refused by default, as for Python tools: when the schema lists its
    `properties` and says nothing else about other ones (no `additionalProperties`,
    `patternProperties`, composition...), a field outside `properties` is an error. Pass
    `allow_unknown_fields=True` to follow plain JSON Schema semantics instead.

    `run` may raise a `ToolError` with its own disposition (a transport that never sent the
    request raises a NOT_SENT one); anything else it raises is `ToolFailed` (LANDED).
    """

    def __init__(
        self,
        spec: ToolSpec,
        run: Callable[[dict[str, Any], CallContext], Awaitable[ToolResult]],
        *,
        origin: str | None = None,
        allow_unknown_fields: bool = False,
    ) -> None:
        import jsonschema  # lazily: Python tools never need it
        import referencing

        self.spec = spec
        self.origin = origin or f"spec {spec.id}"
        self._run = run
        input_schema = dict(spec.input_schema)
        output_schema = dict(spec.output_schema) if spec.output_schema is not None else None
        default = jsonschema.Draft202012Validator
        # No retrieval: jsonschema's default registry fetches a `$ref` to a network URI with
        # urlopen (blocking, and anywhere a server's schema points: past the policy). A
        # schema is a tool's (an MCP server's): only same-document refs and the drafts'
        # metaschemas resolve; another is an issue of the call, never a request.
        local = referencing.Registry()
        try:
            input_cls = jsonschema.validators.validator_for(input_schema, default=default)
            input_cls.check_schema(input_schema)
            self._input = input_cls(input_schema, registry=local)
            self._output = None
            self._output_fast: Callable[[Any], bool] | None = None
            if output_schema is not None:
                output_cls = jsonschema.validators.validator_for(output_schema, default=default)
                output_cls.check_schema(output_schema)
                self._output = output_cls(output_schema, registry=local)
                self._output_fast = compile_check(output_schema)
        except jsonschema.SchemaError as exc:
            raise UserError(f"tool '{spec.id}': invalid JSON Schema: {exc.message}") from exc
        # The fast path for plain schemas (most tools'); jsonschema still writes every issue.
        self._input_fast = compile_check(input_schema)
        self._known: frozenset[str] | None = None
        properties = input_schema.get("properties")
        if (not allow_unknown_fields and isinstance(properties, Mapping)
                and not _OPEN_KEYWORDS & input_schema.keys()):
            self._known = frozenset(properties)

    def validate(self, arguments: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
        """Validate raw arguments against the input schema; returns them as a dict."""
        tool = str(self.spec.id)
        if isinstance(arguments, str | bytes | bytearray):
            import pydantic_core  # not with the module: the core imports without it (issue 11)

            try:
                # Strict JSON: no NaN or Infinity (Python's json module would take them).
                arguments = pydantic_core.from_json(arguments, allow_inf_nan=False)
            except ValueError as exc:
                raise InvalidArguments(
                    tool, [Issue(path="$", message=f"not valid JSON: {exc}")]
                ) from None
        if not isinstance(arguments, Mapping):
            raise InvalidArguments(
                tool,
                [Issue(path="$", message="arguments must be a JSON object, got "
                       f"{_json_type(arguments)}")],
            )
        data = dict(arguments)
        issues = schema_issues(self._input, data, self._input_fast)
        if self._known is not None:
            issues += [
                Issue(path=f"$.{key}" if isinstance(key, str) else f"$[{key!r}]",
                      message=_UNKNOWN_FIELD)
                for key in data if key not in self._known
            ]
        if issues:
            raise InvalidArguments(tool, issues)
        return data

    def dump_arguments(self, validated: dict[str, Any]) -> dict[str, Any]:
        """The validated arguments (already JSON)."""
        return validated

    async def execute(self, validated: dict[str, Any], ctx: CallContext | None) -> ToolResult:
        """Run the function and check its result against the output schema."""
        assert ctx is not None
        result = await self._run(validated, ctx)
        tool = str(self.spec.id)
        if not isinstance(result, ToolResult):
            raise InvalidOutput(
                tool, [Issue(path="$", message=f"expected an hr.ToolResult, got "
                             f"{type(result).__name__}")]
            )
        if self._output is not None and not result.is_error:
            # An absent structured is None, checked as an explicit null.
            issues = schema_issues(self._output, result.structured, self._output_fast)
            if issues:
                raise InvalidOutput(tool, issues)
        return result


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", int: "a number", float: "a number",
             bool: "a boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def as_impl(obj: object) -> ToolImpl:
    """The `ToolImpl` behind a decorated function, a `Tool` subclass, or an impl itself."""
    if isinstance(obj, ToolImpl):
        return obj
    impl = getattr(obj, "__handrail_tool__", None)
    if isinstance(impl, ToolImpl):
        return impl
    raise UserError(
        f"{obj!r} is not a tool: decorate a function with @hr.tool, subclass hr.Tool (with a "
        "run method), or pass a Toolset"
    )


_call_ids = itertools.count(1)

MAX_MODEL_NAME = 64
"""The longest tool name OpenAI and Anthropic accept (`^[a-zA-Z0-9_-]{1,64}$`)."""


class Toolbox:
    """The registry of tools an agent may be offered; dispatches by id.

    ```python
    box = hr.Toolbox([read, Transfer])
    result = await box.call("ledger/read", {"account": "a"})
    ```

    Takes decorated functions, `Tool` subclasses, `ToolImpl`s and other Toolsets (whose tools
    are merged). Two tools with one id raise `UserError` naming both.

    Args:
        tools: What to register.
        max_argument_bytes: Arguments larger than this (as JSON) are refused; default 1 MiB.
    """

    def __init__(
        self,
        tools: Iterable[object] = (),
        *,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
    ) -> None:
        if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
            raise UserError("Toolbox takes a list of tools")
        if (not isinstance(max_argument_bytes, int) or isinstance(max_argument_bytes, bool)
                or max_argument_bytes <= 0):
            raise UserError("max_argument_bytes must be a positive integer")
        self.max_argument_bytes = max_argument_bytes
        self._impls: dict[str, ToolImpl] = {}
        # Every spelling `call` and `get` accept, "server/name" and, on the default server,
        # the bare name: one dict lookup on the hot path.
        self._lookup: dict[str, ToolImpl] = {}
        self._by_model_name: dict[str, ToolImpl] = {}
        # What was registered, in order: tools, and the toolsets whose tools can change
        # (kept whole, so `refreshed` can read them again), with the version last read.
        self._items: list[ToolImpl | tuple[Any, int]] = []
        self._withdrawn: dict[str, str] = {}  # model-facing name -> why it is not offered
        self._changing = 0  # how many of `_items` are toolsets whose tools can change
        for item in tools:
            self.add(item)

    def add(self, item: object) -> None:
        """Register one tool, or every tool of a Toolset."""
        if isinstance(item, Toolbox):
            for entry in item._items:
                if isinstance(entry, ToolImpl):
                    self._add(entry)
                else:
                    self.add(entry[0])
            for name, why in item._withdrawn.items():
                self._withdrawn.setdefault(name, why)
            return
        if isinstance(item, Toolset) and not isinstance(item, ToolImpl):
            changing = callable(getattr(item, "refresh", None)) and \
                isinstance(getattr(item, "version", None), int)
            if changing:
                self._items.append((item, item.version))  # type: ignore[attr-defined]
                self._changing += 1
                withdrawn = getattr(item, "withdrawn", None)
                for tool_id, why in (withdrawn() if callable(withdrawn) else {}).items():
                    self.withdraw(tool_id, why)
            for impl in item.impls():
                self._add(impl, keep=not changing)
            return
        self._add(as_impl(item))

    def changing(self) -> list[Any]:
        """The registered toolsets whose tools can change (read again by `refreshed`)."""
        return [entry[0] for entry in self._items if isinstance(entry, tuple)]

    def withdraw(self, tool_id: ToolId | str, reason: str) -> None:
        """Say why `tool_id` is not offered: a call to it is refused with `reason`.

        For a tool that was offered and no longer is (its MCP server removed or redefined
        it, the manifest refused a tool that appeared later); a registered tool of that id
        is taken out.
        """
        ref = ToolId.of(tool_id)
        key = str(ref)
        impl = self._impls.pop(key, None)
        if impl is not None:
            self._lookup.pop(key, None)
            if ref.server == DEFAULT_SERVER:
                self._lookup.pop(ref.name, None)
            self._by_model_name.pop(ref.model_name, None)
            self._items = [e for e in self._items if e is not impl]
        self._withdrawn[ref.model_name] = reason

    def withdrawn(self, model_name: str) -> str | None:
        """Why the tool the model calls `model_name` is no longer offered, or None."""
        return self._withdrawn.get(model_name)

    @property
    def can_change(self) -> bool:
        """Whether a member's tools can change (an `MCPToolset`): else `refreshed` is a no-op."""
        return self._changing > 0

    async def refreshed(
        self, check: Callable[[list[ToolImpl]], Mapping[str, str]] | None = None,
    ) -> tuple[Toolbox, dict[str, Any] | None]:
        """This toolbox with the tools of now of its members that can change.

        Each such member (an `MCPToolset`) is asked to `refresh()`; when none changed, returns
        `(self, None)`. Otherwise a new Toolbox with their tools of now, and what changed:
        `{"added": [...], "removed": [...], "refused": {id: reason}}` (removed: no longer
        offered; refused: newly withdrawn, each with what a call to it is told). The tools
        that appeared are put to `check` (`functools.partial(hr.manifest.refusals,
        manifest=...)`: the manifest check the toolbox passed at construction): each one it
        names (not granted, a schema other than the pinned one...) is refused, not offered,
        and a call to it gets that reason; so is a tool the member withdrew.
        """
        if not self._changing:
            return self, None
        stale = False
        for entry in self._items:
            if not isinstance(entry, ToolImpl):
                member, seen = entry
                await member.refresh()
                stale = stale or member.version != seen
        if not stale:
            return self, None
        box = Toolbox(max_argument_bytes=self.max_argument_bytes)
        box._withdrawn = dict(self._withdrawn)
        refused: dict[str, str] = {}
        for entry in self._items:
            if isinstance(entry, ToolImpl):
                box._add(entry)
                continue
            member = entry[0]
            box._items.append((member, member.version))
            box._changing += 1
            withdrawn = getattr(member, "withdrawn", None)
            for tool_id, why in (withdrawn() if callable(withdrawn) else {}).items():
                if ToolId.of(tool_id).model_name not in box._withdrawn:
                    refused[str(tool_id)] = why
                box.withdraw(tool_id, why)
            for impl in member.impls():
                try:
                    box._add(impl, keep=False)
                except UserError as exc:  # a name taken by another tool: refused, not offered
                    refused[str(impl.spec.id)] = str(exc)
                    box._withdrawn[impl.spec.id.model_name] = str(exc)
        added = [impl for key, impl in box._impls.items() if self._impls.get(key) is not impl]
        if check is not None and added:
            for tool_id, why in check(added).items():
                refused.setdefault(tool_id, why)
                box.withdraw(tool_id, why)
        for key in box._impls:  # offered now: no longer withdrawn
            box._withdrawn.pop(box._impls[key].spec.id.model_name, None)
        removed = sorted(k for k in self._impls if k not in box._impls)
        change = {"added": sorted(str(i.spec.id) for i in added
                                  if str(i.spec.id) in box._impls),
                  "removed": removed,
                  "refused": dict(sorted(refused.items()))}
        return box, change

    def _add(self, impl: ToolImpl, *, keep: bool = True) -> None:
        key = str(impl.spec.id)
        model_name = impl.spec.id.model_name
        if len(model_name) > MAX_MODEL_NAME:
            raise UserError(
                f"tool '{key}' would be offered to models as {model_name!r}, "
                f"{len(model_name)} characters; providers accept at most {MAX_MODEL_NAME} "
                "(OpenAI and Anthropic both): give it a shorter name= or server="
            )
        existing = self._impls.get(key)
        if existing is not None:
            raise UserError(
                f"two tools have the id '{key}': {existing.origin} and {impl.origin}; give one "
                "of them another name= or server="
            )
        self._impls[key] = impl
        if keep:
            self._items.append(impl)
        self._lookup[key] = impl
        if impl.spec.id.server == DEFAULT_SERVER:
            self._lookup[impl.spec.id.name] = impl
        self._by_model_name[impl.spec.id.model_name] = impl

    def impls(self) -> Iterable[ToolImpl]:
        """Every registered tool, in registration order (the Toolset protocol)."""
        return list(self._impls.values())

    def specs(self) -> list[ToolSpec]:
        """What a model may be offered, in registration order."""
        return [impl.spec for impl in self._impls.values()]

    def get(self, tool_id: ToolId | str) -> ToolImpl:
        """The tool with this id.

        Raises:
            UnknownTool: no tool has that id.
        """
        impl = self._lookup.get(str(tool_id)) if isinstance(tool_id, str | ToolId) else None
        if impl is None:
            raise UnknownTool(
                f"no tool '{tool_id}' is offered; known tools: "
                f"{', '.join(sorted(self._impls)) or '(none)'}"
            )
        return impl

    def by_model_name(self, model_name: str) -> ToolImpl | None:
        """The tool whose model-facing name is exactly `model_name`, or None."""
        return self._by_model_name.get(model_name)

    def __contains__(self, tool_id: object) -> bool:
        if not isinstance(tool_id, ToolId | str):
            return False
        try:
            self.get(tool_id)
        except UnknownTool:
            return False
        return True

    def __len__(self) -> int:
        return len(self._impls)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self.specs())

    def handler(self, tool_id: ToolId | str, **context: Any) -> ToolHandler:
        """A new `ToolHandler` for one call of `tool_id`.

        Keyword arguments (`run_id`, `agent`, `workspace`, `deps`) reach the tool's
        `CallContext`.
        """
        return ToolHandler(self.get(tool_id), max_argument_bytes=self.max_argument_bytes,
                           **context)

    async def call(
        self,
        tool_id: ToolId | str,
        arguments: Mapping[str, Any] | str | bytes,
        *,
        call_id: str | None = None,
    ) -> ToolResult:
        """Validate and run one call of a tool that asks nothing; returns its result.

        No policy applies here: this is the tool core. Agents call tools through the gate.

        Raises:
            UnknownTool: no tool has that id.
            InvalidArguments: the arguments fail the schema; the body did not run.
            ToolError: the call failed (see its `disposition`).
            HandlerStateError: the tool asked a question; use `handler()` to answer it.
        """
        impl = self._lookup.get(tool_id) if type(tool_id) is str else None
        if impl is None:
            impl = self.get(tool_id)
        spec = impl.spec
        if not spec.interactions and spec.timeout is None:
            # ToolHandler.run_once, inlined: this is the hot path and a coroutine layer less
            # is a tenth of its cost.
            validated = impl.validate(
                check_argument_payload(spec.id._str, arguments, self.max_argument_bytes)
            )
            if getattr(impl, "marked", False):  # path arguments need a workspace: refused here
                validated = impl.bind(validated, None)
            ctx = None
            if impl.needs_context:
                ctx = CallContext(call_id=call_id or f"call-{next(_call_ids)}", tool_id=spec.id)
            try:
                return await impl.execute(validated, ctx)
            except BaseException as exc:
                raise_body_error(spec, exc)
        if call_id is None:
            call_id = f"call-{next(_call_ids)}"
        handler = ToolHandler(impl, max_argument_bytes=self.max_argument_bytes)
        out = await handler.step(Invoke(call_id, arguments))
        if type(out) is Finished:
            return out.result
        await _cancel_quietly(handler)
        raise HandlerStateError(
            f"tool '{tool_id}' asked a question during box.call(); drive it with "
            "box.handler(...).step(...) to answer"
        )


async def _cancel_quietly(handler: ToolHandler) -> None:
    try:
        await handler.step(Cancel("box.call() cannot answer questions"))
    except CallCancelled:
        pass
