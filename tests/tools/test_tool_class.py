"""class X(hr.Tool, server=..., name=...): the argument type IS the tool."""

import threading
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import Field

import handrail as hr
from handrail.tools import as_impl

pytestmark = pytest.mark.anyio


class Transfer(hr.Tool, server="ledger", name="transfer"):
    """Move money between two accounts.

    Args:
        source: The account to debit.
    """

    source: str
    target: str
    """The account to credit."""
    amount: int = Field(gt=0, description="How much, in cents.")

    def actions(self) -> list[hr.Action]:
        return [hr.Action(hr.Act.CALL, f"ledger/transfer/{self.target}")]

    async def run(self, ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.json({"moved": self.amount, "call": ctx.call_id})


def test_class_tool_spec() -> None:
    spec = as_impl(Transfer).spec
    assert str(spec.id) == "ledger/transfer"
    assert spec.id.model_name == "ledger--transfer"
    assert spec.description == "Move money between two accounts."
    assert spec.mutates is True
    assert spec.output_schema is None
    assert spec.input_schema == {
        "type": "object",
        "properties": {
            "source": {"type": "string", "description": "The account to debit."},
            "target": {"type": "string", "description": "The account to credit."},
            "amount": {"type": "integer", "exclusiveMinimum": 0,
                       "description": "How much, in cents."},
        },
        "required": ["source", "target", "amount"],
        "additionalProperties": False,
    }


async def test_class_tool_runs_with_validated_self() -> None:
    box = hr.Toolbox([Transfer])
    result = await box.call("ledger/transfer", {"source": "a", "target": "b", "amount": 5},
                            call_id="c-9")
    assert result.structured == {"moved": 5, "call": "c-9"}
    with pytest.raises(hr.InvalidArguments) as info:
        await box.call("ledger/transfer", {"source": "a", "target": "b", "amount": 0})
    assert [i.path for i in info.value.issues] == ["$.amount"]


def test_class_tool_actions_and_dump() -> None:
    impl = as_impl(Transfer)
    validated = impl.validate({"source": "a", "target": "b", "amount": 5})
    assert impl.actions(validated) == [hr.Action(hr.Act.CALL, "ledger/transfer/b")]
    assert impl.dump_arguments(validated) == {"source": "a", "target": "b", "amount": 5}


def test_class_tool_arguments_are_frozen() -> None:
    validated = as_impl(Transfer).validate({"source": "a", "target": "b", "amount": 5})
    with pytest.raises(Exception, match="frozen"):
        validated.amount = 6


async def test_class_defaults_and_typed_output() -> None:
    # A plain-string `url` the policy cannot see is reported when the class is defined.
    with pytest.warns(hr.UnguardedArgumentWarning, match="'url'"):
        class HTTPGetter(hr.Tool, mutates=False, idempotent=True, timeout=3):
            url: str

            async def run(self, ctx: hr.CallContext) -> int:
                return len(self.url)

    impl = as_impl(HTTPGetter)
    assert impl.spec.id == hr.ToolId("local", "http_getter")
    assert impl.spec.id.model_name == "http_getter"
    assert impl.spec.description == ""
    assert impl.spec.mutates is False and impl.spec.idempotent is True
    assert impl.spec.timeout == 3
    assert impl.spec.output_schema == {"type": "integer"}
    call_action = hr.Action(hr.Act.CALL, "local/http_getter")
    assert impl.actions(impl.validate({"url": "x"})) == [call_action]
    result = await hr.Toolbox([HTTPGetter]).call("http_getter", {"url": "abc"})
    assert result.structured == 3


async def test_sync_run_runs_in_a_worker_thread() -> None:
    threads = []

    class Sync(hr.Tool):
        def run(self, ctx: hr.CallContext) -> str:  # type: ignore[override]
            threads.append(threading.get_ident())
            return "ok"

    assert (await hr.Toolbox([Sync]).call("sync", {})).structured == "ok"
    assert threads and threads[0] != threading.get_ident()


def test_abstract_intermediate_classes_are_not_tools() -> None:
    class Base(hr.Tool):
        common: str = "x"

    assert "__handrail_tool__" not in Base.__dict__

    class Concrete(Base, server="s"):
        async def run(self, ctx: hr.CallContext) -> None:
            return None

    assert str(as_impl(Concrete).spec.id) == "s/concrete"
    assert "common" in as_impl(Concrete).spec.input_schema["properties"]
    with pytest.raises(hr.UserError, match="is not a tool"):
        as_impl(Base)


def test_keywords_without_run_are_refused() -> None:
    with pytest.raises(hr.UserError, match="no run"):

        class Half(hr.Tool, server="s"):
            x: int


def test_unknown_class_keywords_are_refused() -> None:
    with pytest.raises(hr.UserError, match=r"unknown hr\.Tool keyword"):

        class Bad(hr.Tool, sever="typo"):  # type: ignore[call-arg]
            async def run(self, ctx: hr.CallContext) -> None: ...


def test_bad_names_are_refused() -> None:
    with pytest.raises(hr.UserError, match="invalid tool name"):

        class Spaced(hr.Tool, name="has space"):
            async def run(self, ctx: hr.CallContext) -> None: ...


def test_interactions_keyword() -> None:
    class Asks(hr.Tool, interactions={"question", "form"}):
        async def run(self, ctx: hr.CallContext) -> None: ...

    assert as_impl(Asks).spec.interactions == {"question", "form"}
    with pytest.raises(hr.UserError, match="not async"):

        class SyncAsks(hr.Tool, interactions={"question"}):
            def run(self, ctx: hr.CallContext) -> None: ...  # type: ignore[override]


class Opaque:
    pass


def test_unschemable_field_is_named() -> None:
    with pytest.raises(hr.UserError, match="field 'callback' of Hooked"):

        class Hooked(hr.Tool):
            callback: Callable[[int], int]

            async def run(self, ctx: hr.CallContext) -> None: ...

    with pytest.raises(hr.UserError, match="field 'thing' of Holder"):

        class Holder(hr.Tool):
            thing: Opaque

            async def run(self, ctx: hr.CallContext) -> None: ...


def test_unschemable_run_return_is_refused() -> None:
    with pytest.raises(hr.UserError, match="return type"):

        class Ret(hr.Tool):
            async def run(self, ctx: hr.CallContext) -> Opaque:
                return Opaque()


async def test_class_body_errors() -> None:
    class Fails(hr.Tool):
        async def run(self, ctx: hr.CallContext) -> Any:
            raise RuntimeError("no")

    class NotSentInside(hr.Tool):
        async def run(self, ctx: hr.CallContext) -> Any:
            raise hr.UnknownTool("nested call")

    box = hr.Toolbox([Fails, NotSentInside])
    with pytest.raises(hr.ToolFailed) as info:
        await box.call("fails", {})
    assert info.value.disposition is hr.Disposition.LANDED
    with pytest.raises(hr.ToolFailed) as info:
        await box.call("not_sent_inside", {})
    assert info.value.disposition is hr.Disposition.LANDED
