"""SchemaTool: a tool from a ToolSpec (plain JSON Schema) and an async function."""

import json
from typing import Any

import pytest

import handrail as hr
from handrail.tools import SchemaTool

pytestmark = pytest.mark.anyio

INPUT = {
    "type": "object",
    "properties": {"q": {"type": "string", "minLength": 1}, "limit": {"type": "integer"}},
    "required": ["q"],
}
OUTPUT = {"type": "object", "properties": {"hits": {"type": "integer"}}, "required": ["hits"]}


def make(result: Any = None, *, output: Any = OUTPUT, input_schema: Any = INPUT,
         **kw: Any) -> tuple[SchemaTool, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    async def run(args: dict[str, Any], ctx: hr.CallContext) -> Any:
        seen.append(args)
        return result if result is not None else hr.ToolResult.json({"hits": len(args["q"])})

    spec = hr.ToolSpec("search/web", "Search.", input_schema, output_schema=output)
    return SchemaTool(spec, run, **kw), seen


async def test_valid_call() -> None:
    tool, seen = make()
    box = hr.Toolbox([tool])
    result = await box.call("search/web", {"q": "abc", "limit": 2})
    assert result.structured == {"hits": 3}
    assert seen == [{"q": "abc", "limit": 2}]
    assert tool.dump_arguments(tool.validate('{"q": "x"}')) == {"q": "x"}
    assert tool.actions({"q": "x"}) == [hr.Action(hr.Act.CALL, "search/web")]
    assert tool.origin == "spec search/web"


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({}, "$"),
        ({"q": ""}, "$.q"),
        ({"q": 5}, "$.q"),
        ({"q": "x", "limit": True}, "$.limit"),
        ({"q": "x", "limit": 1.5}, "$.limit"),
        ({"q": "x", "other": 1}, "$.other"),
        ([1], "$"),
        ("[1]", "$"),
        ("{not json", "$"),
        ('{"q": "x", "limit": NaN}', "$"),
        ('{"q": "x", "limit": Infinity}', "$"),
    ],
)
async def test_invalid_arguments_never_reach_run(arguments: Any, path: str) -> None:
    tool, seen = make()
    with pytest.raises(hr.InvalidArguments) as info:
        await hr.Toolbox([tool]).call("search/web", arguments)
    assert seen == []
    assert path in [i.path for i in info.value.issues]


async def test_unknown_fields_follow_the_schema_when_it_says_so() -> None:
    open_schema = {**INPUT, "additionalProperties": True}
    tool, seen = make(input_schema=open_schema)
    await hr.Toolbox([tool]).call("search/web", {"q": "x", "other": 1})
    tool, seen = make(allow_unknown_fields=True)
    await hr.Toolbox([tool]).call("search/web", {"q": "x", "other": 1})
    assert seen == [{"q": "x", "other": 1}]
    composed = {"type": "object", "allOf": [INPUT, {"properties": {"extra": {}}}]}
    tool, seen = make(input_schema=composed)
    await hr.Toolbox([tool]).call("search/web", {"q": "x", "extra": 1})
    assert seen == [{"q": "x", "extra": 1}]


async def test_older_drafts_are_honoured() -> None:
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"n": {"type": "integer", "exclusiveMaximum": 5}}}
    tool, _ = make(input_schema=draft7, output=None, result=hr.ToolResult.text("ok"))
    tool.validate({"n": 4})
    with pytest.raises(hr.InvalidArguments):
        tool.validate({"n": 5})


async def test_output_schema_checked_on_success_only() -> None:
    for bad in [hr.ToolResult.json({"hits": "many"}), hr.ToolResult.text("no structured")]:
        tool, _ = make(bad)
        with pytest.raises(hr.InvalidOutput) as info:
            await hr.Toolbox([tool]).call("search/web", {"q": "x"})
        assert info.value.disposition is hr.Disposition.LANDED
    tool, _ = make(hr.ToolResult.error("backend down"))
    assert (await hr.Toolbox([tool]).call("search/web", {"q": "x"})).is_error


async def test_explicit_null_validated_when_the_schema_allows_it() -> None:
    tool, _ = make(hr.ToolResult.text("nothing"), output={"type": ["object", "null"]})
    assert (await hr.Toolbox([tool]).call("search/web", {"q": "x"})).structured is None


async def test_run_must_return_a_tool_result() -> None:
    tool, _ = make({"hits": 1})
    with pytest.raises(hr.InvalidOutput, match=r"expected an hr\.ToolResult"):
        await hr.Toolbox([tool]).call("search/web", {"q": "x"})


async def test_transport_errors_keep_their_disposition_and_others_are_tool_failed() -> None:
    async def never_sent(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        raise hr.TransportError("connection refused", disposition=hr.Disposition.NOT_SENT)

    async def broken(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        raise ConnectionResetError("reset")

    spec = hr.ToolSpec("remote/x", "", {"type": "object"})
    with pytest.raises(hr.TransportError) as info:
        await hr.Toolbox([SchemaTool(spec, never_sent)]).call("remote/x", {})
    assert info.value.disposition is hr.Disposition.NOT_SENT
    with pytest.raises(hr.ToolFailed):
        await hr.Toolbox([SchemaTool(spec, broken)]).call("remote/x", {})


def test_invalid_schemas_are_refused_at_declaration() -> None:
    with pytest.raises(hr.UserError, match="invalid JSON Schema"):
        make(input_schema={"type": "object", "properties": {"q": {"type": "strng"}}})
    with pytest.raises(hr.UserError, match="invalid JSON Schema"):
        make(output={"type": 5})


async def test_schema_tool_with_interactions() -> None:
    async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.text(await ctx.ask(hr.Question("Which?")))

    spec = hr.ToolSpec("s/ask", "", {"type": "object"}, interactions={"question"})
    handler = hr.Toolbox([SchemaTool(spec, run)]).handler("s/ask")
    out = await handler.step(hr.Invoke("c", json.dumps({})))
    assert isinstance(out, hr.Interaction)
    out = await handler.step(hr.Respond(out.id, hr.Submit("this")))
    assert isinstance(out, hr.Finished) and out.result.render_text() == "this"
