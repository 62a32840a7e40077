"""The `ToolImpl` contract: what every kind of tool must do, whatever it is built from.

`ToolImpl` (with `Toolset` to offer a group of them) is the one seam every tool source enters
through: `@hr.tool` functions, `hr.Tool` classes, `SchemaTool`, the built-in workspace tools,
and later host-injected, subprocess and MCP tools. The gate and `ToolHandler` see nothing
else, so a new kind is correct exactly when it passes this suite (docs/architecture.md, "The
tool seam").

To run it against a kind, describe the kind with a `ToolKind` and subclass `ToolImplContract`:

```python
class TestMyKind(ToolImplContract):
    @pytest.fixture
    def kind(self, tmp_path: Path) -> ToolKind:
        return MyKind(tmp_path)
```

A `ToolKind` builds small tools of its own kind on request (an echo, one that returns an error
result, one that raises a given exception, one that blocks until cancelled, one with an output
schema). A kind that cannot express one of them returns None and says why in `cannot`; that
case is skipped with the reason (a built-in tool cannot be made to raise on command).

Every behaviour is checked through the two ways the tool layer drives a call: `ToolHandler`
(the resumable state machine) and the direct path the gate and `Toolbox.call` take for a tool
that cannot ask and has no deadline (`validate`, `execute`, `raise_body_error`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import anyio
import pytest
from pydantic import BaseModel

from handrail.errors import (
    Disposition,
    InvalidArguments,
    InvalidOutput,
    ToolError,
    ToolFailed,
    ToolTimeout,
    TransportError,
)
from handrail.tools import (
    Action,
    CallContext,
    Finished,
    HandlerState,
    Invoke,
    ToolHandler,
    ToolImpl,
    ToolResult,
    Toolset,
    ToolSpec,
    check_argument_payload,
    raise_body_error,
)

Via = Literal["handler", "direct"]
VIAS: tuple[Via, ...] = ("handler", "direct")


class Out(BaseModel):
    """The output every kind's `with_output` tool declares: `{"n": <integer>}`."""

    n: int


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
}
"""`Out` as plain JSON Schema, for kinds that declare schemas rather than types."""


@dataclass(kw_only=True)
class Subject:
    """One tool built by a kind, with what the contract may expect of it."""

    impl: ToolImpl
    """The tool."""
    good: dict[str, Any]
    """Arguments it accepts."""
    bad: Sequence[Any] = ()
    """Arguments of this tool's own it must refuse (the suite adds generic ones)."""
    actions: list[Action] | None = None
    """What `actions(validate(good))` must be; None: the default `CALL server/name`."""
    expect_text: str | None = None
    """Text the success result must contain."""
    context: Mapping[str, Any] = field(default_factory=dict)
    """What the call's `CallContext` needs (`workspace=`...)."""
    runs: Callable[[], int] | None = None
    """How many times the body has run, when the kind can count it."""


class ToolKind:
    """How one kind of tool builds the tools the contract drives.

    Every factory returns None when the kind cannot express that tool; `cannot` says why.
    """

    name: str = "?"
    cannot: ClassVar[Mapping[str, str]] = {}
    """factory name -> why this kind has no such tool (shown as the skip reason)."""
    not_sent_from_body: Disposition = Disposition.NOT_SENT
    """What a NOT_SENT ToolError raised by the body becomes. A transport that never sent
    keeps NOT_SENT; a Python body already ran, so its NOT_SENT is not believed (LANDED)."""

    def echo(self) -> Subject:
        """A tool whose one required string argument comes back in its (successful) result."""
        raise NotImplementedError

    def returns_error(self) -> Subject | None:
        """A tool that completes with an error result (a model-visible failure)."""
        return None

    def raising(self, exc: BaseException) -> Subject | None:
        """A tool whose body raises `exc`."""
        return None

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject | None:
        """A tool whose body sets `started`, waits forever, and appends True to `cleaned` in
        its cleanup (`finally`); `timeout` is its declared deadline."""
        return None

    def with_output(self, value: Any) -> Subject | None:
        """A tool declaring `Out` / `OUTPUT_SCHEMA` as its output and returning `value`."""
        return None


def need(kind: ToolKind, factory: str, subject: Subject | None) -> Subject:
    if subject is None:
        pytest.skip(f"{kind.name}: {kind.cannot.get(factory, 'no such tool')}")
    return subject


async def drive(subject: Subject, arguments: Any, via: Via) -> ToolResult:
    """One call, as the tool layer's callers make it; returns the result or raises."""
    impl = subject.impl
    spec = impl.spec
    if via == "handler" or spec.interactions or spec.timeout is not None:
        handler = ToolHandler(impl, **subject.context)
        out = await handler.step(Invoke("call-1", arguments))
        assert isinstance(out, Finished), f"{spec.id} asked a question: {out!r}"
        assert handler.state is HandlerState.FINISHED
        return out.result
    validated = impl.validate(check_argument_payload(str(spec.id), arguments, 1 << 20))
    ctx = (CallContext(call_id="call-1", tool_id=spec.id,
                       workspace=subject.context.get("workspace"))
           if impl.needs_context else None)
    try:
        return await impl.execute(validated, ctx)
    except BaseException as exc:
        raise_body_error(spec, exc)


def text_of(result: ToolResult) -> str:
    return result.render_text()


class ToolImplContract:
    """The contract suite; subclass it with a `kind` fixture (see the module docstring)."""

    pytestmark = pytest.mark.anyio  # inherited by every subclass

    @pytest.fixture
    def kind(self) -> ToolKind:
        raise NotImplementedError("define a `kind` fixture returning this kind's ToolKind")

    # ------------------------------------------------------------ declaration

    def test_declares_a_spec_and_is_offered_through_a_toolset(self, kind: ToolKind) -> None:
        subject = kind.echo()
        impl = subject.impl
        assert isinstance(impl, ToolImpl)
        assert isinstance(impl.spec, ToolSpec)
        assert impl.spec.input_schema.get("type") == "object"
        assert isinstance(impl.origin, str) and impl.origin
        assert isinstance(impl.needs_context, bool)

        class One:
            def impls(self) -> list[ToolImpl]:
                return [impl]

        assert isinstance(One(), Toolset)

    # ------------------------------------------------------------ validate

    def test_validate_takes_a_mapping_json_text_and_bytes_alike(self, kind: ToolKind) -> None:
        subject = kind.echo()
        impl = subject.impl
        dumped = impl.dump_arguments(impl.validate(subject.good))
        text = json.dumps(subject.good)
        assert impl.dump_arguments(impl.validate(text)) == dumped
        assert impl.dump_arguments(impl.validate(text.encode())) == dumped
        # The dump is a JSON object that validates to itself: the gate records it, digests it,
        # shows it to an approver and re-validates it after an approval.
        assert isinstance(dumped, dict)
        assert json.loads(json.dumps(dumped)) == dumped
        assert impl.dump_arguments(impl.validate(dumped)) == dumped
        assert subject.runs is None or subject.runs() == 0

    @pytest.mark.parametrize("via", VIAS)
    async def test_bad_arguments_are_refused_not_sent_and_never_run(
            self, kind: ToolKind, via: Via) -> None:
        subject = kind.echo()
        generic = ["[1, 2]", "{not json", {**subject.good, "no_such_field_xyz": 1}, {}]
        for bad in [*generic, *subject.bad]:
            with pytest.raises(InvalidArguments) as info:
                await drive(subject, bad, via)
            assert info.value.disposition is Disposition.NOT_SENT, bad
            assert info.value.issues, f"{bad!r} was refused without saying what is wrong"
            assert str(subject.impl.spec.id) in str(info.value)
        assert subject.runs is None or subject.runs() == 0

    # ------------------------------------------------------------ actions

    def test_actions_are_declared_from_the_arguments_alone(self, kind: ToolKind) -> None:
        subject = kind.echo()
        impl = subject.impl
        validated = impl.validate(subject.good)
        first = impl.actions(validated)
        assert isinstance(first, list) and first, "a call touches at least one thing"
        assert all(isinstance(a, Action) for a in first)
        assert impl.actions(validated) == first  # the same call is judged the same way
        expected = subject.actions if subject.actions is not None else [impl.default_action()]
        assert first == expected
        assert subject.runs is None or subject.runs() == 0  # declaring is not doing

    # ------------------------------------------------------------ execute

    @pytest.mark.parametrize("via", VIAS)
    async def test_a_good_call_returns_its_result(self, kind: ToolKind, via: Via) -> None:
        subject = kind.echo()
        result = await drive(subject, subject.good, via)
        assert isinstance(result, ToolResult)
        assert not result.is_error, text_of(result)
        if subject.expect_text is not None:
            assert subject.expect_text in text_of(result)
        assert subject.runs is None or subject.runs() == 1

    @pytest.mark.parametrize("via", VIAS)
    async def test_an_error_result_is_a_result_not_an_exception(
            self, kind: ToolKind, via: Via) -> None:
        subject = need(kind, "returns_error", kind.returns_error())
        result = await drive(subject, subject.good, via)
        assert result.is_error
        assert text_of(result)

    @pytest.mark.parametrize("via", VIAS)
    async def test_a_body_that_raises_has_landed(self, kind: ToolKind, via: Via) -> None:
        boom = ValueError("boom")
        subject = need(kind, "raising", kind.raising(boom))
        with pytest.raises(ToolFailed) as info:
            await drive(subject, subject.good, via)
        assert info.value.disposition is Disposition.LANDED
        assert str(subject.impl.spec.id) in str(info.value) and "boom" in str(info.value)
        assert info.value.__cause__ is boom

    # ------------------------------------------------------------ dispositions

    @pytest.mark.parametrize("via", VIAS)
    @pytest.mark.parametrize("case", ["not_sent", "in_doubt", "landed"])
    async def test_dispositions_reach_the_caller(self, kind: ToolKind, via: Via,
                                                 case: str) -> None:
        raised: ToolError = {
            "not_sent": ToolError("the request never left", disposition=Disposition.NOT_SENT),
            "in_doubt": TransportError("the link broke after sending"),
            "landed": ToolFailed("it ran and failed"),
        }[case]
        expected = {"not_sent": kind.not_sent_from_body, "in_doubt": Disposition.IN_DOUBT,
                    "landed": Disposition.LANDED}[case]
        subject = need(kind, "raising", kind.raising(raised))
        with pytest.raises(ToolError) as info:
            await drive(subject, subject.good, via)
        assert info.value.disposition is expected

    # ------------------------------------------------------------ cancellation

    @pytest.mark.parametrize("via", VIAS)
    async def test_a_cancellation_mid_call_propagates_after_cleanup(
            self, kind: ToolKind, via: Via) -> None:
        started = anyio.Event()
        cleaned: list[bool] = []
        subject = need(kind, "blocking", kind.blocking(started, cleaned))
        returned: list[object] = []

        async def call() -> None:
            returned.append(await drive(subject, subject.good, via))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await started.wait()
                tg.cancel_scope.cancel()
        assert returned == [], "the cancellation was swallowed: the call returned"
        assert cleaned == [True], "the body's cleanup did not run"

    async def test_a_deadline_mid_call_is_in_doubt(self, kind: ToolKind) -> None:
        started = anyio.Event()
        cleaned: list[bool] = []
        subject = need(kind, "blocking", kind.blocking(started, cleaned, timeout=0.2))
        assert subject.impl.spec.timeout == 0.2
        with anyio.fail_after(30), pytest.raises(ToolTimeout) as info:
            await drive(subject, subject.good, "handler")
        assert started.is_set()
        assert info.value.disposition is Disposition.IN_DOUBT
        assert cleaned == [True]

    # ------------------------------------------------------------ output schema

    @pytest.mark.parametrize("via", VIAS)
    async def test_output_is_checked_against_the_output_schema(
            self, kind: ToolKind, via: Via) -> None:
        fits = need(kind, "with_output", kind.with_output({"n": 1}))
        assert fits.impl.spec.output_schema is not None
        result = await drive(fits, fits.good, via)
        assert result.structured == {"n": 1}
        wrong = need(kind, "with_output", kind.with_output({"n": "not a number"}))
        with pytest.raises(InvalidOutput) as info:
            await drive(wrong, wrong.good, via)
        assert info.value.disposition is Disposition.LANDED
        assert info.value.issues

    @pytest.mark.parametrize("via", VIAS)
    async def test_an_error_result_is_not_held_to_the_output_schema(
            self, kind: ToolKind, via: Via) -> None:
        subject = need(kind, "with_output", kind.with_output(ToolResult.error("no luck")))
        result = await drive(subject, subject.good, via)
        assert result.is_error and "no luck" in text_of(result)
