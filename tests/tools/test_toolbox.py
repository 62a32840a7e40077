"""Toolbox: the registry that dispatches by tool id, once."""

from typing import Any

import pytest

import handrail as hr
from handrail.tools import SchemaTool, ToolImpl

pytestmark = pytest.mark.anyio


@hr.tool
async def get_weather(city: str) -> str:
    """Forecast."""
    return f"sunny in {city}"


@hr.tool(server="ledger", name="read", mutates=False)
async def read(account: str) -> int:
    return 7


class Transfer(hr.Tool, server="ledger", name="transfer"):
    amount: int

    async def run(self, ctx: hr.CallContext) -> int:
        return self.amount


def test_specs_list_what_a_model_may_be_offered_in_order() -> None:
    box = hr.Toolbox([get_weather, read, Transfer])
    assert [str(s.id) for s in box.specs()] == ["local/get_weather", "ledger/read",
                                                 "ledger/transfer"]
    assert [s.id.model_name for s in box] == ["get_weather", "ledger--read", "ledger--transfer"]
    assert len(box) == 3
    assert next(iter(box.impls())) is get_weather


def test_duplicate_ids_are_refused_naming_both() -> None:
    @hr.tool(name="get_weather")
    async def other_weather(city: str) -> str:
        return city

    with pytest.raises(hr.UserError) as info:
        hr.Toolbox([get_weather, other_weather])
    message = str(info.value)
    assert "'local/get_weather'" in message
    assert "get_weather" in message and "other_weather" in message

    class Clash(hr.Tool, server="ledger", name="read"):
        async def run(self, ctx: hr.CallContext) -> None: ...

    with pytest.raises(hr.UserError, match=r"ledger/read.*read_?.*Clash|Clash"):
        hr.Toolbox([read, Clash])


def test_toolsets_are_merged_and_duplicates_across_them_refused() -> None:
    inner = hr.Toolbox([read])
    outer = hr.Toolbox([inner, get_weather])
    assert [str(s.id) for s in outer.specs()] == ["ledger/read", "local/get_weather"]
    assert isinstance(inner, hr.Toolset)
    with pytest.raises(hr.UserError, match="two tools have the id 'ledger/read'"):
        hr.Toolbox([inner, read])


def test_non_tools_are_refused() -> None:
    async def plain() -> None: ...

    with pytest.raises(hr.UserError, match="is not a tool"):
        hr.Toolbox([plain])
    with pytest.raises(hr.UserError, match="list of tools"):
        hr.Toolbox(get_weather)  # type: ignore[arg-type]
    with pytest.raises(hr.UserError, match="list of tools"):
        hr.Toolbox("get_weather")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_argument_bytes_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(hr.UserError, match="max_argument_bytes"):
        hr.Toolbox([], max_argument_bytes=bad)


def test_get_takes_ids_and_strings() -> None:
    box = hr.Toolbox([get_weather, read])
    assert box.get("ledger/read") is read
    assert box.get(hr.ToolId("ledger", "read")) is read
    assert box.get("get_weather") is get_weather  # a bare name is on the default server
    assert box.get("local/get_weather") is get_weather
    assert "get_weather" in box and "local/get_weather" in box
    assert hr.ToolId("ledger", "read") in box
    assert "read" not in box and "ledger/missing" not in box and 5 not in box
    with pytest.raises(hr.UnknownTool, match="no tool 'ledger/nope'") as info:
        box.get("ledger/nope")
    assert info.value.disposition is hr.Disposition.NOT_SENT
    assert "ledger/read" in str(info.value)


def test_by_model_name_is_exact() -> None:
    box = hr.Toolbox([get_weather, read])
    assert box.by_model_name("get_weather") is get_weather
    assert box.by_model_name("ledger--read") is read
    for near in ["Get_weather", "get_weather ", "local--get_weather", "ledger/read",
                 "ledger--Read", "ledger-read"]:
        assert box.by_model_name(near) is None


async def test_call_with_id_or_string_and_call_ids() -> None:
    seen: list[str] = []

    @hr.tool
    async def who(ctx: hr.CallContext) -> str:
        seen.append(ctx.call_id)
        return ctx.call_id

    box = hr.Toolbox([who, read])
    assert (await box.call("ledger/read", {"account": "a"})).structured == 7
    assert (await box.call(hr.ToolId("ledger", "read"), {"account": "a"})).structured == 7
    assert (await box.call("who", {}, call_id="mine")).structured == "mine"
    await box.call("who", {})
    await box.call("who", {})
    assert seen[0] == "mine" and seen[1] != seen[2]


async def test_call_unknown_tool() -> None:
    with pytest.raises(hr.UnknownTool):
        await hr.Toolbox([read]).call("ledger/write", {})


async def test_call_refuses_a_tool_that_asks_and_cleans_it_up() -> None:
    log: list[str] = []

    @hr.tool(interactions={"question"})
    async def asks(ctx: hr.CallContext) -> str:
        try:
            return await ctx.ask(hr.Question("?"))
        finally:
            log.append("finally")

    @hr.tool(interactions={"question"})
    async def could_ask(ctx: hr.CallContext) -> str:
        return "did not need to"

    box = hr.Toolbox([asks, could_ask])
    with pytest.raises(hr.HandlerStateError, match="asked a question"):
        await box.call("asks", {})
    assert log == ["finally"]
    assert (await box.call("could_ask", {})).structured == "did not need to"


async def test_handler_per_call() -> None:
    box = hr.Toolbox([read])
    a, b = box.handler("ledger/read"), box.handler("ledger/read")
    assert a is not b
    with pytest.raises(hr.UnknownTool):
        box.handler("ledger/none")


async def test_schema_tools_register_like_any_other() -> None:
    async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.text(args["q"])

    spec = hr.ToolSpec("search/web", "Search.", {"type": "object",
                       "properties": {"q": {"type": "string"}}, "required": ["q"]})
    tool = SchemaTool(spec, run)
    assert isinstance(tool, ToolImpl)
    box = hr.Toolbox([tool, read])
    assert (await box.call("search/web", {"q": "x"})).render_text() == "x"
    assert box.by_model_name("search--web") is tool


def test_a_tool_whose_model_name_would_exceed_64_characters_is_refused() -> None:
    @hr.tool(server="s" * 40, name="n" * 30)
    async def long_one() -> str:
        return "x"

    with pytest.raises(hr.UserError, match="at most 64"):
        hr.Toolbox([long_one])
