"""The ToolImpl contract (tool_contract.py) run against the tool kinds of the tool core:
`@hr.tool` functions (async and sync), `hr.Tool` classes and `SchemaTool`."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

import anyio
import pytest
from tool_contract import OUTPUT_SCHEMA, Out, Subject, ToolImplContract, ToolKind

import handrail as hr
from handrail.errors import Disposition
from handrail.tools import SchemaTool, as_impl

pytestmark = pytest.mark.anyio

ECHO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "What to echo."}},
    "required": ["text"],
}


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


class FunctionKind(ToolKind):
    """`@hr.tool` on an async function."""

    name = "@tool async function"
    not_sent_from_body = Disposition.LANDED

    def echo(self) -> Subject:
        runs = _Count()

        @hr.tool(server="contract", name="echo")
        async def echo(text: str) -> str:
            """Echo the text.

            Args:
                text: What to echo.
            """
            runs.n += 1
            return text

        return Subject(impl=as_impl(echo), good={"text": "hi there"}, bad=[{"text": 3}],
                       expect_text="hi there", runs=runs)

    def returns_error(self) -> Subject:
        @hr.tool(server="contract", name="sorry")
        async def sorry(text: str) -> hr.ToolResult:
            """Fail visibly.

            Args:
                text: Ignored.
            """
            return hr.ToolResult.error(f"cannot do {text}")

        return Subject(impl=as_impl(sorry), good={"text": "x"})

    def raising(self, exc: BaseException) -> Subject:
        @hr.tool(server="contract", name="boom")
        async def boom(text: str) -> str:
            """Raise.

            Args:
                text: Ignored.
            """
            raise exc

        return Subject(impl=as_impl(boom), good={"text": "x"})

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject:
        @hr.tool(server="contract", name="wait", timeout=timeout)
        async def wait(text: str) -> str:
            """Wait forever.

            Args:
                text: Ignored.
            """
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cleaned.append(True)
            return text

        return Subject(impl=as_impl(wait), good={"text": "x"})

    def with_output(self, value: Any) -> Subject:
        @hr.tool(server="contract", name="count")
        async def count(text: str) -> Out:
            """Count.

            Args:
                text: Ignored.
            """
            return value  # type: ignore[no-any-return]

        return Subject(impl=as_impl(count), good={"text": "x"})


class SyncFunctionKind(FunctionKind):
    """`@hr.tool` on a plain function (it runs in a worker thread)."""

    name = "@tool sync function"
    cannot: ClassVar[Mapping[str, str]] = {
        "blocking": "a sync body cannot be interrupted: it is abandoned in its thread "
                    "(tests/tools/test_tool_decorator.py)",
    }

    def echo(self) -> Subject:
        runs = _Count()

        @hr.tool(server="contract", name="echo")
        def echo(text: str) -> str:
            """Echo the text.

            Args:
                text: What to echo.
            """
            runs.n += 1
            return text

        return Subject(impl=as_impl(echo), good={"text": "hi there"}, bad=[{"text": 3}],
                       expect_text="hi there", runs=runs)

    def raising(self, exc: BaseException) -> Subject:
        @hr.tool(server="contract", name="boom")
        def boom(text: str) -> str:
            """Raise.

            Args:
                text: Ignored.
            """
            raise exc

        return Subject(impl=as_impl(boom), good={"text": "x"})

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> None:
        return None

    def with_output(self, value: Any) -> Subject:
        @hr.tool(server="contract", name="count")
        def count(text: str) -> Out:
            """Count.

            Args:
                text: Ignored.
            """
            return value  # type: ignore[no-any-return]

        return Subject(impl=as_impl(count), good={"text": "x"})


class ClassKind(ToolKind):
    """An `hr.Tool` subclass."""

    name = "hr.Tool class"
    not_sent_from_body = Disposition.LANDED

    def echo(self) -> Subject:
        runs = _Count()

        class Echo(hr.Tool, server="contract", name="echo"):
            """Echo the text."""

            text: str
            """What to echo."""

            def actions(self) -> list[hr.Action]:
                return [hr.Action(hr.Act.CALL, f"contract/echo/{len(self.text)}")]

            async def run(self, ctx: hr.CallContext) -> str:
                runs.n += 1
                return self.text

        return Subject(impl=as_impl(Echo), good={"text": "hi there"}, bad=[{"text": 3}],
                       actions=[hr.Action(hr.Act.CALL, "contract/echo/8")],
                       expect_text="hi there", runs=runs)

    def returns_error(self) -> Subject:
        class Sorry(hr.Tool, server="contract", name="sorry"):
            """Fail visibly."""

            text: str

            async def run(self, ctx: hr.CallContext) -> hr.ToolResult:
                return hr.ToolResult.error(f"cannot do {self.text}")

        return Subject(impl=as_impl(Sorry), good={"text": "x"})

    def raising(self, exc: BaseException) -> Subject:
        class Boom(hr.Tool, server="contract", name="boom"):
            """Raise."""

            text: str

            async def run(self, ctx: hr.CallContext) -> str:
                raise exc

        return Subject(impl=as_impl(Boom), good={"text": "x"})

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject:
        class Wait(hr.Tool, server="contract", name="wait", timeout=timeout):
            """Wait forever."""

            text: str

            async def run(self, ctx: hr.CallContext) -> str:
                started.set()
                try:
                    await anyio.sleep_forever()
                finally:
                    cleaned.append(True)
                return self.text

        return Subject(impl=as_impl(Wait), good={"text": "x"})

    def with_output(self, value: Any) -> Subject:
        class Count(hr.Tool, server="contract", name="count"):
            """Count."""

            text: str

            async def run(self, ctx: hr.CallContext) -> Out:
                return value  # type: ignore[no-any-return]

        return Subject(impl=as_impl(Count), good={"text": "x"})


class SchemaKind(ToolKind):
    """`SchemaTool`: a `ToolSpec` (plain JSON Schema) and an async function, the shape MCP,
    subprocess and host tools take."""

    name = "SchemaTool"
    not_sent_from_body = Disposition.NOT_SENT  # a transport that never sent says so

    def _tool(self, name: str, run: Any, *, output: Any = None,
              timeout: float | None = None) -> SchemaTool:
        spec = hr.ToolSpec(f"contract/{name}", "A contract tool.", ECHO_SCHEMA,
                           output_schema=output, timeout=timeout)
        return SchemaTool(spec, run)

    def echo(self) -> Subject:
        runs = _Count()

        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            runs.n += 1
            return hr.ToolResult.text(args["text"])

        return Subject(impl=self._tool("echo", run), good={"text": "hi there"},
                       bad=[{"text": 3}, '{"text": NaN}'], expect_text="hi there", runs=runs)

    def returns_error(self) -> Subject:
        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            return hr.ToolResult.error(f"cannot do {args['text']}")

        return Subject(impl=self._tool("sorry", run), good={"text": "x"})

    def raising(self, exc: BaseException) -> Subject:
        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            raise exc

        return Subject(impl=self._tool("boom", run), good={"text": "x"})

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject:
        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cleaned.append(True)
            return hr.ToolResult.text("never")

        return Subject(impl=self._tool("wait", run, timeout=timeout), good={"text": "x"})

    def with_output(self, value: Any) -> Subject:
        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            return value if isinstance(value, hr.ToolResult) else hr.ToolResult.json(value)

        return Subject(impl=self._tool("count", run, output=OUTPUT_SCHEMA), good={"text": "x"})


class TestFunctionTools(ToolImplContract):
    @pytest.fixture
    def kind(self) -> ToolKind:
        return FunctionKind()


class TestSyncFunctionTools(ToolImplContract):
    @pytest.fixture
    def kind(self) -> ToolKind:
        return SyncFunctionKind()


class TestToolClasses(ToolImplContract):
    @pytest.fixture
    def kind(self) -> ToolKind:
        return ClassKind()


class TestSchemaTools(ToolImplContract):
    @pytest.fixture
    def kind(self) -> ToolKind:
        return SchemaKind()


# ------------------------------------------ the suite catches broken implementations
#
# Each kind below breaks one clause of the contract; the suite's check for that clause must
# fail on it (so a new kind that breaks it is caught the same way).


class _SwallowsCancellation(SchemaKind):
    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject:
        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            started.set()
            try:
                await anyio.sleep_forever()
            except BaseException:  # the bug: an outside cancellation becomes a result
                pass
            finally:
                cleaned.append(True)
            return hr.ToolResult.text("carried on")

        return Subject(impl=self._tool("wait", run, timeout=timeout), good={"text": "x"})


class _AcceptsAnything(SchemaKind):
    def echo(self) -> Subject:
        subject = super().echo()

        class Lax(SchemaTool):
            def validate(self, arguments: Any) -> dict[str, Any]:
                return dict(arguments) if isinstance(arguments, dict) else {"text": "?"}

        subject.impl = Lax(subject.impl.spec, subject.impl._run)  # type: ignore[attr-defined]
        return subject


class _SkipsTheOutputCheck(SchemaKind):
    def with_output(self, value: Any) -> Subject:
        async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            return value if isinstance(value, hr.ToolResult) else hr.ToolResult.json(value)

        # The bug: the output schema is declared to the model but never given to the tool.
        spec = hr.ToolSpec("contract/count", "A contract tool.", ECHO_SCHEMA)
        tool = SchemaTool(spec, run)
        tool.spec = spec.replace(output_schema=OUTPUT_SCHEMA)
        return Subject(impl=tool, good={"text": "x"})


class _ActsWhileDeclaring(FunctionKind):
    def echo(self) -> Subject:
        subject = super().echo()
        impl = subject.impl
        body = impl.execute

        def actions(validated: Any) -> list[hr.Action]:
            body(validated, None).close()  # the bug: declaring runs (part of) the body
            subject.runs.n += 1  # type: ignore[union-attr]
            return [impl.default_action()]

        impl.actions = actions  # type: ignore[method-assign]
        return subject


@pytest.mark.parametrize(("kind", "check", "args"), [
    (_SwallowsCancellation(), "test_a_cancellation_mid_call_propagates_after_cleanup",
     ("direct",)),
    (_SwallowsCancellation(), "test_a_cancellation_mid_call_propagates_after_cleanup",
     ("handler",)),
    (_AcceptsAnything(), "test_bad_arguments_are_refused_not_sent_and_never_run", ("direct",)),
    (_SkipsTheOutputCheck(), "test_output_is_checked_against_the_output_schema", ("direct",)),
    (_ActsWhileDeclaring(), "test_actions_are_declared_from_the_arguments_alone", ()),
])
async def test_the_contract_fails_a_broken_kind(kind: ToolKind, check: str,
                                                args: tuple[Any, ...]) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        outcome = getattr(ToolImplContract(), check)(kind, *args)
        if inspect.isawaitable(outcome):
            await outcome
