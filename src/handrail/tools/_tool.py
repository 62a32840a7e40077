"""Declaring tools: the `@tool` decorator and the `Tool` base class.

The schema comes from the Python type, never from a second document: a function's signature
(or a `Tool` subclass's fields) is the input schema, its return annotation the output schema,
its docstring the description.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Generic, ParamSpec, TypeVar

import anyio.to_thread
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError
from pydantic.fields import FieldInfo

from handrail.errors import (
    Disposition,
    InvalidArguments,
    InvalidOutput,
    Issue,
    ToolError,
    ToolFailed,
    UserError,
)
from handrail.tools._actions import Action
from handrail.tools._content import ToolResult, text_result
from handrail.tools._context import CallContext
from handrail.tools._decorator import tool
from handrail.tools._handler import ToolImpl, issues_from_validation_error
from handrail.tools._names import DEFAULT_SERVER, ToolId
from handrail.tools._paths import (
    argument_actions,
    bind_arguments,
    check_markers,
    has_marked_arguments,
    warn_unguarded,
)
from handrail.tools._schema import ToolSchemaGenerator, parse_docstring
from handrail.tools._spec import ToolSpec

__all__ = ["FunctionTool", "Tool", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

_NO_OUTPUT_TYPES: tuple[Any, ...] = (None, type(None), Any, inspect.Signature.empty)


def _issue(message: str) -> Issue:
    return Issue(path="$", message=message)


class _Output:
    """Turns a body's return value into a checked `ToolResult`."""

    __slots__ = ("adapter", "is_str", "mode", "scalar", "schema", "tool")

    def __init__(self, tool: str, annotation: Any, where: str) -> None:
        self.tool = tool
        self.adapter: TypeAdapter[Any] | None = None
        self.schema: dict[str, Any] | None = None
        self.is_str = annotation is str
        # For an exact builtin scalar, type(value) is the whole check and the value is its
        # own JSON form: skip pydantic on the hot path.
        self.scalar: type | None = annotation if annotation in (int, float, bool, str) else None
        if annotation is ToolResult:
            self.mode = "result"
        elif annotation in _NO_OUTPUT_TYPES:
            self.mode = "raw"
        else:
            self.mode = "typed"
            try:
                self.adapter = TypeAdapter(annotation)
                self.schema = self.adapter.json_schema(
                    mode="serialization", schema_generator=ToolSchemaGenerator
                )
            except (PydanticSchemaGenerationError, PydanticUserError) as exc:
                raise UserError(
                    f"tool '{tool}': the return type of {where} ({annotation!r}) has no JSON "
                    "Schema; return a pydantic-compatible type, or annotate it -> hr.ToolResult"
                ) from exc

    def convert(self, value: Any) -> ToolResult:
        if type(value) is self.scalar:  # the hot path: `-> int` returning an int
            if type(value) is str:
                return text_result(value, value)
            if type(value) is int:
                # An int's JSON is its decimal digits, as `str` writes them (no serialiser
                # and no bytes to decode, every call: issue 38); past the interpreter's
                # digit limit `str` refuses, the serialiser does not.
                try:
                    return text_result(str(value), value)
                except ValueError:
                    return text_result(pydantic_core.to_json(value).decode(), value)
            if type(value) is float and not math.isfinite(value):
                raise InvalidOutput(self.tool, [_issue(f"{value} is not a JSON number")])
            return text_result(pydantic_core.to_json(value).decode(), value)
        if isinstance(value, ToolResult):
            result: ToolResult = value
            if self.adapter is not None and not result.is_error:
                # An explicit structured=None is checked too: null must fit the schema.
                structured = self._dump(self._check(result.structured))
                if structured is not result.structured:
                    result = ToolResult(result.content, structured, False, result.metadata)
            return result
        if self.mode == "typed":
            structured = self._dump(self._check(value))
            if self.is_str:
                return text_result(structured, structured)
            return text_result(pydantic_core.to_json(structured).decode(), structured)
        if self.mode == "result":
            raise InvalidOutput(
                self.tool,
                [_issue(f"expected an hr.ToolResult, got {type(value).__name__}")],
            )
        if isinstance(value, str):
            return text_result(value, None)
        try:
            text = pydantic_core.to_json(value).decode()
        except pydantic_core.PydanticSerializationError as exc:
            raise InvalidOutput(self.tool, [_issue(f"not JSON-serialisable: {exc}")]) from exc
        return text_result(text, None)

    def _check(self, value: Any) -> Any:
        assert self.adapter is not None
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            raise InvalidOutput(self.tool, issues_from_validation_error(exc)) from exc

    def _dump(self, checked: Any) -> Any:
        assert self.adapter is not None
        try:
            return self.adapter.dump_python(checked, mode="json")
        except pydantic_core.PydanticSerializationError as exc:
            raise InvalidOutput(self.tool, [_issue(f"not JSON-serialisable: {exc}")]) from exc


# allow_inf_nan=False: arguments are JSON, and JSON has no NaN or Infinity.
_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=False, allow_inf_nan=False)


def _is_context(annotation: Any) -> bool:
    return annotation is CallContext or (
        typing.get_origin(annotation) is typing.Annotated
        and typing.get_args(annotation)[0] is CallContext
    )


def _described(annotation: Any, default: Any) -> bool:
    """Whether the author already gave a parameter a description with Field(description=)."""
    infos = [default] if isinstance(default, FieldInfo) else []
    if typing.get_origin(annotation) is typing.Annotated:
        infos += [m for m in annotation.__metadata__ if isinstance(m, FieldInfo)]
    return any(info.description is not None for info in infos)


def _check_schemable(tool_id: ToolId | str, where: str, annotation: Any) -> None:
    try:
        TypeAdapter(annotation).json_schema()
    except (PydanticSchemaGenerationError, PydanticUserError) as exc:
        owner = tool_id if isinstance(tool_id, str) else f"tool '{tool_id}'"
        raise UserError(
            f"{owner}: {where} has type {annotation!r}, which has no JSON Schema; "
            "use a pydantic-compatible type (str, int, a BaseModel, a TypedDict...)"
        ) from exc


def _not_sent_from_body(spec: ToolSpec, exc: ToolError) -> ToolFailed:
    """A NOT_SENT error from inside a Python body that already started is not believed.

    It describes some inner operation (a nested `box.call`...), not this call, whose body ran:
    passing "not sent" on would let the caller retry the call automatically.
    """
    return ToolFailed(f"tool '{spec.id}' raised {type(exc).__name__}: {exc}")


class FunctionTool(ToolImpl, Generic[P, R]):
    """A tool made from a function by `@hr.tool`; still callable as the plain function."""

    typed = True
    """Its input schema comes from a Python type (what the manifest reads: a grant must not
    repeat its arguments)."""

    def __init__(
        self,
        fn: Callable[P, R],
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
    ) -> None:
        if not callable(fn):
            raise UserError(f"@hr.tool decorates a function, not {type(fn).__name__}")
        self.fn = fn
        self._call: Callable[..., Any] = fn
        qualname = str(getattr(fn, "__qualname__", repr(fn)))
        self.origin = f"function {getattr(fn, '__module__', '?')}.{qualname}"
        tool_id = ToolId(
            DEFAULT_SERVER if server is None else server,
            str(getattr(fn, "__name__", "")) if name is None else name,
        )
        doc_description, arg_docs = parse_docstring(inspect.getdoc(fn))
        # A callable object is introspected through its (bound) __call__.
        target: Any = fn if inspect.isroutine(fn) else getattr(fn, "__call__", fn)  # noqa: B004
        self._is_async = inspect.iscoroutinefunction(target)
        interactions = _kinds(tool_id, interactions)
        if interactions and not self._is_async:
            raise UserError(
                f"tool '{tool_id}' declares interactions but {qualname} is not async: only an "
                "async tool can await ctx.ask/ctx.elicit"
            )
        try:
            hints = typing.get_type_hints(target, include_extras=True)
        except (NameError, TypeError) as exc:
            raise UserError(f"tool '{tool_id}': cannot resolve the annotations of {qualname}: "
                            f"{exc}") from exc
        self._ctx_param: str | None = None
        fields: dict[str, Any] = {}
        self._names: list[tuple[str, str]] = []
        params = list(inspect.signature(target).parameters.values())
        taken = {p.name for p in params}
        for param in params:
            where = f"parameter '{param.name}' of {qualname}"
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise UserError(f"tool '{tool_id}': {where} is *args/**kwargs; a tool's "
                                "arguments must be named")
            if param.kind is param.POSITIONAL_ONLY:
                raise UserError(f"tool '{tool_id}': {where} is positional-only; tools are "
                                "called with named arguments")
            if param.name not in hints:
                raise UserError(f"tool '{tool_id}': {where} has no type annotation; the schema "
                                "comes from the type, so annotate it")
            annotation = hints[param.name]
            if _is_context(annotation):
                if self._ctx_param is not None:
                    raise UserError(f"tool '{tool_id}': {where} is a second hr.CallContext "
                                    f"(the first is '{self._ctx_param}')")
                self._ctx_param = param.name
                continue
            _check_schemable(tool_id, where, annotation)
            check_markers(f"tool '{tool_id}'", annotation, where)
            field_name = param.name
            if hasattr(BaseModel, field_name) or field_name.startswith("model_"):
                # The name would shadow a BaseModel attribute: store it under another name
                # and keep the parameter's name as the alias the model sees.
                field_name = f"arg_{field_name}"
                while field_name in taken or hasattr(BaseModel, field_name):
                    field_name += "_"
                taken.add(field_name)
            meta: dict[str, Any] = {}
            if field_name != param.name:
                meta["alias"] = param.name
            if param.name in arg_docs and not _described(annotation, param.default):
                meta["description"] = arg_docs[param.name]
            if meta:
                annotation = Annotated[annotation, Field(**meta)]
            default = ... if param.default is param.empty else param.default
            fields[field_name] = (annotation, default)
            self._names.append((param.name, field_name))
        self._plain = all(p == f for p, f in self._names)
        self.needs_context = self._ctx_param is not None
        try:
            self._model: type[BaseModel] = create_model(
                f"{tool_id.name}_arguments", __config__=_CONFIG, **fields
            )
            input_schema = self._model.model_json_schema(schema_generator=ToolSchemaGenerator)
        except (PydanticSchemaGenerationError, PydanticUserError) as exc:
            raise UserError(f"tool '{tool_id}': cannot build its input schema: {exc}") from exc
        self._output = _Output(str(tool_id), hints.get("return", inspect.Signature.empty),
                               f"{qualname}")
        self._actions = actions
        self.argument_model = self._model
        self.declares_actions = actions is not None
        self.marked = has_marked_arguments(self._model)
        self.spec = ToolSpec(
            tool_id,
            description if description is not None else doc_description,
            input_schema,
            output_schema=self._output.schema,
            mutates=mutates,
            idempotent=idempotent,
            interactions=interactions,
            timeout=timeout,
            protected=_pointers(protected),
            trusted_output=trusted_output,
            sanitizes=_pointers(sanitizes),
        )
        functools.update_wrapper(self, fn)
        warn_unguarded(self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the underlying function directly (no validation, no policy)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.spec.id}>"

    def validate(self, arguments: Mapping[str, Any] | str | bytes) -> BaseModel:
        """Validate raw arguments into the tool's argument model."""
        # The model's core validator directly: `model_validate` adds a Python-level layer.
        validator = self._model.__pydantic_validator__
        try:
            if type(arguments) is dict or not isinstance(arguments, str | bytes | bytearray):
                return validator.validate_python(arguments)  # type: ignore[no-any-return]
            return validator.validate_json(arguments)  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise InvalidArguments(str(self.spec.id), issues_from_validation_error(exc)) from None

    def _kwargs(self, validated: BaseModel) -> dict[str, Any]:
        if self._plain:
            return validated.__dict__
        return {p: getattr(validated, f) for p, f in self._names}

    def actions(self, validated: BaseModel) -> list[Action]:
        """What the call touches: the `actions=` function's answer, or `CALL server/name`.

        Plus what the `hr.ReadPath`/`WritePath`/`ExecArgv`/`Url` arguments name.
        """
        if self._actions is None:
            declared = [self.default_action()]
        else:
            declared = list(self._actions(**self._kwargs(validated)))
        return merge_actions(declared, argument_actions(validated)) if self.marked else declared

    def bind(self, validated: BaseModel, workspace: Any, decided: Any = None) -> BaseModel:
        """The arguments with each checked path replaced by its canonical path (see _paths)."""
        return bind_arguments(validated, workspace, decided) if self.marked else validated

    def dump_arguments(self, validated: BaseModel) -> dict[str, Any]:
        """The validated arguments as JSON, under the names the model uses."""
        # The serializer directly: model_dump's wrapper costs as much again on the hot path.
        dumped: dict[str, Any] = validated.__pydantic_serializer__.to_python(
            validated, mode="json", by_alias=True)
        return dumped

    async def execute(self, validated: BaseModel, ctx: CallContext | None) -> ToolResult:
        """Call the function and check what it returns."""
        kwargs = validated.__dict__ if self._plain else self._kwargs(validated)
        if self._ctx_param is not None:
            kwargs = {**kwargs, self._ctx_param: ctx}
        try:
            if self._is_async:
                value = await self._call(**kwargs)
            else:
                # Abandoned on cancellation: a thread cannot be interrupted, and a deadline or
                # a cancel must not wait for it. The call is then IN_DOUBT, which is the truth.
                value = await anyio.to_thread.run_sync(
                    functools.partial(self._call, **kwargs), abandon_on_cancel=True
                )
        except ToolError as exc:
            if exc.disposition is Disposition.NOT_SENT:
                raise _not_sent_from_body(self.spec, exc) from exc
            raise
        return self._output.convert(value)


def merge_actions(declared: list[Action], derived: list[Action]) -> list[Action]:
    """`declared`, then each derived action not already declared (same act and target)."""
    seen = {(a.act, a.target) for a in declared}
    return declared + [a for a in derived if (a.act, a.target) not in seen]


def _pointers(pointers: Iterable[str]) -> tuple[str, ...]:
    # A string is passed through whole: ToolSpec refuses it with a message naming the tool.
    return pointers if isinstance(pointers, str) else tuple(pointers)  # type: ignore[return-value]


def _kinds(tool_id: ToolId, interactions: Iterable[str]) -> frozenset[str]:
    if isinstance(interactions, str):
        raise UserError(f"tool '{tool_id}': interactions takes a set of kinds, e.g. "
                        f"{{{interactions!r}}}, not a string")
    return frozenset(interactions)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])|(?<=[A-Z])([A-Z])(?=[a-z])", r"_\1\2", name).lower()


class Tool(BaseModel):
    """A tool whose arguments ARE the class: subclass, add fields, define `run`.

    ```python
    class Transfer(hr.Tool, server="ledger", name="transfer"):
        \"\"\"Move money between two accounts.\"\"\"
        source: str
        target: str
        amount: int = Field(gt=0)

        def actions(self) -> list[hr.Action]:
            return [hr.Action(hr.Act.CALL, f"ledger/transfer/{self.target}")]

        async def run(self, ctx: hr.CallContext) -> hr.ToolResult:
            return hr.ToolResult.json({"ok": True})
    ```

    Class keywords: `server`, `name` (default: the class name in snake_case), `description`
    (default: the class docstring), `mutates` (default True), `idempotent`, `timeout`,
    `interactions`, `protected`, `trusted_output`, `sanitizes` (see docs/taint.md). Field
    descriptions come from `Field(description=...)`, a docstring under the field, or the
    class docstring's `Args:`/`Attributes:` section.
    """

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False
    )
    __handrail_tool__: ClassVar[ToolImpl]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Our class keywords are consumed in __pydantic_init_subclass__, after pydantic has
        # built the fields; object.__init_subclass__ must not see them. Field types are checked
        # here, before pydantic builds the class, so an un-schemable one is named in the error.
        super().__init_subclass__()
        own = inspect.get_annotations(cls)
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except (NameError, TypeError):
            return  # a forward reference pydantic resolves later; it reports its own errors
        label = f"class {cls.__name__}"
        for field in own:
            annotation = hints.get(field)
            if field.startswith("_") or typing.get_origin(annotation) is ClassVar:
                continue
            if annotation is not None and annotation is not ClassVar:
                _check_schemable(label, f"field '{field}' of {cls.__name__}", annotation)
                check_markers(label, annotation, f"field '{field}' of {cls.__name__}")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Register the subclass as a tool once pydantic has built it."""
        super().__pydantic_init_subclass__()
        known = {"server", "name", "description", "mutates", "idempotent", "timeout",
                 "interactions", "protected", "trusted_output", "sanitizes"}
        unknown = set(kwargs) - known
        if unknown:
            raise UserError(f"class {cls.__name__}: unknown hr.Tool keyword(s) {sorted(unknown)}; "
                            f"known: {sorted(known)}")
        if cls.run is Tool.run:
            if kwargs:
                raise UserError(f"class {cls.__name__} declares tool keywords but no run()")
            return  # an abstract intermediate class
        cls.__handrail_tool__ = _ClassTool(cls, **kwargs)
        warn_unguarded(cls.__handrail_tool__)

    def actions(self) -> list[Action]:
        """What this call touches; by default `CALL server/name`."""
        return [type(self).__handrail_tool__.default_action()]

    async def run(self, ctx: CallContext) -> Any:
        """The tool's body; receives the validated arguments as `self`."""
        raise NotImplementedError


class _ClassTool(ToolImpl):
    typed = True
    """Its input schema comes from the class's fields (see FunctionTool.typed)."""

    def __init__(
        self,
        cls: type[Tool],
        *,
        server: str | None = None,
        name: str | None = None,
        description: str | None = None,
        mutates: bool = True,
        idempotent: bool = False,
        timeout: float | None = None,
        interactions: Iterable[str] = (),
        protected: Iterable[str] = (),
        trusted_output: bool = False,
        sanitizes: Iterable[str] = (),
    ) -> None:
        self.cls = cls
        self.origin = f"class {cls.__module__}.{cls.__qualname__}"
        self.argument_model = cls
        self.declares_actions = cls.actions is not Tool.actions
        self.marked = has_marked_arguments(cls)
        tool_id = ToolId(
            DEFAULT_SERVER if server is None else server,
            _snake(cls.__name__) if name is None else name,
        )
        run = cls.run
        self._is_async = inspect.iscoroutinefunction(run)
        interactions = _kinds(tool_id, interactions)
        if interactions and not self._is_async:
            raise UserError(f"tool '{tool_id}' declares interactions but {cls.__name__}.run is "
                            "not async")
        try:
            ret = typing.get_type_hints(run).get("return", inspect.Signature.empty)
        except (NameError, TypeError) as exc:
            raise UserError(f"tool '{tool_id}': cannot resolve {cls.__name__}.run's return "
                            f"annotation: {exc}") from exc
        self._output = _Output(str(tool_id), ret, f"{cls.__name__}.run")
        doc = cls.__doc__ if cls.__doc__ is not Tool.__doc__ else None
        doc_description, field_docs = parse_docstring(doc)
        try:
            schema = cls.model_json_schema(schema_generator=ToolSchemaGenerator)
        except (PydanticSchemaGenerationError, PydanticUserError) as exc:
            raise UserError(f"tool '{tool_id}': cannot build its input schema: {exc}") from exc
        # pydantic copies the class docstring into the schema; the model already gets it as
        # the tool's description, so sending it twice only costs tokens.
        schema.pop("description", None)
        properties = schema.get("properties", {})
        for field_name, field in cls.model_fields.items():
            key = field.alias or field_name
            if field_name in field_docs and key in properties:
                properties[key].setdefault("description", field_docs[field_name])
        self.spec = ToolSpec(
            tool_id,
            description if description is not None else doc_description,
            schema,
            output_schema=self._output.schema,
            mutates=mutates,
            idempotent=idempotent,
            interactions=interactions,
            timeout=timeout,
            protected=_pointers(protected),
            trusted_output=trusted_output,
            sanitizes=_pointers(sanitizes),
        )

    def validate(self, arguments: Mapping[str, Any] | str | bytes) -> Tool:
        validator = self.cls.__pydantic_validator__
        try:
            if type(arguments) is dict or not isinstance(arguments, str | bytes | bytearray):
                return validator.validate_python(arguments)  # type: ignore[no-any-return]
            return validator.validate_json(arguments)  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise InvalidArguments(str(self.spec.id), issues_from_validation_error(exc)) from None

    def actions(self, validated: Tool) -> list[Action]:
        declared = list(validated.actions())
        return merge_actions(declared, argument_actions(validated)) if self.marked else declared

    def bind(self, validated: Tool, workspace: Any, decided: Any = None) -> Tool:
        if not self.marked:
            return validated
        bound = bind_arguments(validated, workspace, decided)
        assert isinstance(bound, Tool)
        return bound

    def dump_arguments(self, validated: Tool) -> dict[str, Any]:
        dumped: dict[str, Any] = validated.__pydantic_serializer__.to_python(
            validated, mode="json", by_alias=True)
        return dumped

    async def execute(self, validated: Tool, ctx: CallContext | None) -> ToolResult:
        assert ctx is not None
        try:
            if self._is_async:
                value = await validated.run(ctx)
            else:
                # Abandoned on cancellation, like a sync function tool (see FunctionTool).
                value = await anyio.to_thread.run_sync(validated.run, ctx, abandon_on_cancel=True)
        except ToolError as exc:
            if exc.disposition is Disposition.NOT_SENT:
                raise _not_sent_from_body(self.spec, exc) from exc
            raise
        return self._output.convert(value)
