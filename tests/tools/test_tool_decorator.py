"""@hr.tool: the schema comes from the function's signature, never from a second document."""

import threading
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

import handrail as hr
from handrail.tools import FunctionTool

pytestmark = pytest.mark.anyio


async def call(tool: object, arguments: Any, **kw: Any) -> hr.ToolResult:
    return await hr.Toolbox([tool]).call(hr.tools.as_impl(tool).spec.id, arguments, **kw)


# ----------------------------------------------------------------------- declaration


def test_bare_decorator_defaults() -> None:
    @hr.tool
    async def get_weather(city: str, days: int = 3) -> str:
        """Forecast the weather."""
        return city

    assert isinstance(get_weather, FunctionTool)
    spec = get_weather.spec
    assert spec.id == hr.ToolId("local", "get_weather")
    assert spec.id.model_name == "get_weather"
    assert spec.description == "Forecast the weather."
    assert spec.mutates is True  # the cautious default
    assert spec.idempotent is False
    assert spec.timeout is None
    assert spec.interactions == frozenset()
    assert spec.input_schema == {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "default": 3},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


def test_decorator_options() -> None:
    @hr.tool(server="ledger", name="read", mutates=False, description="Reads.", timeout=2.5,
             idempotent=True)
    def read_balance(account: str) -> int:
        """Ignored because description= wins."""
        return 1

    spec = read_balance.spec
    assert str(spec.id) == "ledger/read"
    assert spec.id.model_name == "ledger--read"
    assert spec.description == "Reads."
    assert spec.mutates is False
    assert spec.idempotent is True
    assert spec.timeout == 2.5


async def test_decorated_function_stays_callable() -> None:
    @hr.tool
    async def add(a: int, b: int) -> int:
        return a + b

    @hr.tool
    def mul(a: int, b: int) -> int:
        return a * b

    assert await add(2, 3) == 5
    assert mul(2, 3) == 6
    assert add.__name__ == "add"
    assert add.__wrapped__ is add.fn


def test_parameter_descriptions_from_docstring_args() -> None:
    @hr.tool
    async def f(a: int, b: str = "x") -> None:
        """Do f.

        Args:
            a: The a,
                over two lines.
            b (str): The b.

        Returns:
            Nothing.
        """

    props = f.spec.input_schema["properties"]
    assert props["a"]["description"] == "The a, over two lines."
    assert props["b"]["description"] == "The b."
    assert f.spec.description == "Do f."


def test_parameter_descriptions_from_field() -> None:
    @hr.tool
    async def f(
        a: int = Field(description="from Field", gt=0),
        b: Annotated[int, Field(description="from Annotated")] = 1,
        c: int = Field(default=5, description="explicit wins"),
        d: int = Field(default=7),
    ) -> None:
        """F.

        Args:
            a: from docstring (loses to Field)
            b: from docstring (loses to Annotated Field)
            c: from docstring
            d: from docstring (used: the Field has no description)
        """

    props = f.spec.input_schema["properties"]
    assert props["a"] == {"type": "integer", "description": "from Field", "exclusiveMinimum": 0}
    assert props["b"]["description"] == "from Annotated"
    assert props["c"] == {"type": "integer", "description": "explicit wins", "default": 5}
    assert props["d"] == {"type": "integer", "description": "from docstring (used: the Field "
                          "has no description)", "default": 7}
    assert f.spec.input_schema["required"] == ["a"]


async def test_field_defaults_apply_and_constraints_validate() -> None:
    seen = []

    @hr.tool
    async def f(a: int = Field(gt=0), c: int = Field(default=5)) -> None:
        seen.append((a, c))

    await call(f, {"a": 1})
    assert seen == [(1, 5)]
    with pytest.raises(hr.InvalidArguments) as info:
        await call(f, {"a": 0})
    assert info.value.issues[0].path == "$.a"
    assert seen == [(1, 5)]


async def test_call_context_is_injected_and_not_in_the_schema() -> None:
    got: list[hr.CallContext] = []

    @hr.tool
    async def f(x: int, ctx: hr.CallContext) -> int:
        got.append(ctx)
        return x

    @hr.tool
    def g(context: Annotated[hr.CallContext, "meta"], y: int) -> int:
        got.append(context)
        return y

    assert f.spec.input_schema["properties"].keys() == {"x"}
    assert "ctx" not in f.spec.input_schema.get("required", [])
    assert g.spec.input_schema["properties"].keys() == {"y"}
    assert f.needs_context and g.needs_context
    await call(f, {"x": 1}, call_id="c-1")
    await call(g, {"y": 2}, call_id="c-2")
    assert [c.call_id for c in got] == ["c-1", "c-2"]
    assert [c.tool_id for c in got] == [f.spec.id, g.spec.id]
    with pytest.raises(hr.InvalidArguments, match="ctx"):
        await call(f, {"x": 1, "ctx": {}})


def test_a_tool_without_context_does_not_need_one() -> None:
    @hr.tool
    async def f(x: int) -> int:
        return x

    assert f.needs_context is False


def test_two_call_contexts_are_refused() -> None:
    with pytest.raises(hr.UserError, match=r"second hr\.CallContext"):

        @hr.tool
        async def f(a: hr.CallContext, b: hr.CallContext) -> None: ...


async def test_parameters_shadowing_basemodel_attributes_keep_their_names() -> None:
    seen = {}

    @hr.tool
    async def f(json: str, copy: int, model_config: int, arg_json: int, schema: str) -> None:
        seen.update(json=json, copy=copy, model_config=model_config, arg_json=arg_json,
                    schema=schema)

    props = f.spec.input_schema["properties"]
    assert set(props) == {"json", "copy", "model_config", "arg_json", "schema"}
    args = {"json": "j", "copy": 1, "model_config": 2, "arg_json": 3, "schema": "s"}
    await call(f, args)
    assert seen == args
    validated = f.validate(args)
    assert f.dump_arguments(validated) == args
    with pytest.raises(hr.InvalidArguments):
        await call(f, {**args, "arg_json_": 4})


# ------------------------------------------------------------------ refused declarations


class Opaque:
    pass


def test_unschemable_parameter_is_named_at_decoration_time() -> None:
    with pytest.raises(hr.UserError, match=r"parameter 'thing' of .*Opaque"):

        @hr.tool
        async def f(ok: int, thing: Opaque) -> None: ...


def test_parameter_with_a_type_that_has_no_json_schema_is_named() -> None:
    with pytest.raises(hr.UserError, match=r"parameter 'callback'"):

        @hr.tool
        async def f(callback: Callable[[int], int]) -> None: ...


def test_unschemable_return_type_is_refused() -> None:
    with pytest.raises(hr.UserError, match="return type"):

        @hr.tool
        async def f() -> Opaque:
            return Opaque()


def test_missing_annotation_is_named() -> None:
    with pytest.raises(hr.UserError, match=r"parameter 'x' .* no type annotation"):

        @hr.tool
        async def f(x) -> None: ...  # type: ignore[no-untyped-def]


def test_star_args_and_positional_only_are_refused() -> None:
    with pytest.raises(hr.UserError, match=r"\*args"):

        @hr.tool
        async def f(*items: int) -> None: ...

    with pytest.raises(hr.UserError, match=r"\*args/\*\*kwargs"):

        @hr.tool
        async def g(**items: int) -> None: ...

    with pytest.raises(hr.UserError, match="positional-only"):

        @hr.tool
        async def h(a: int, /) -> None: ...


def test_unresolvable_annotation_is_refused() -> None:
    with pytest.raises(hr.UserError, match="cannot resolve"):

        @hr.tool
        async def f(x: "NoSuchType") -> None: ...  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize("name", ["get weather", "gеt", "a/b", "", "x" * 65])
def test_bad_tool_names_are_refused(name: str) -> None:
    with pytest.raises(hr.UserError, match="invalid tool name"):

        @hr.tool(name=name)
        async def f() -> None: ...


def test_non_ascii_function_names_are_refused() -> None:
    with pytest.raises(hr.UserError, match="invalid tool name"):

        @hr.tool
        async def café() -> None: ...


def test_interactions_need_an_async_function() -> None:
    with pytest.raises(hr.UserError, match="not async"):

        @hr.tool(interactions={"question"})
        def f(ctx: hr.CallContext) -> None: ...


def test_interaction_kinds_are_checked() -> None:
    with pytest.raises(hr.UserError, match="unknown interaction kind"):

        @hr.tool(interactions={"telepathy"})
        async def f() -> None: ...

    with pytest.raises(hr.UserError, match="set of kinds"):

        @hr.tool(interactions="question")
        async def g() -> None: ...


def test_non_callables_are_refused() -> None:
    with pytest.raises(hr.UserError, match="decorates a function"):
        hr.tool(42)  # type: ignore[call-overload]


# --------------------------------------------------------------------- running a body


async def test_sync_body_runs_in_a_worker_thread() -> None:
    threads = []

    @hr.tool
    def f() -> None:
        threads.append(threading.get_ident())

    await call(f, {})
    assert threads and threads[0] != threading.get_ident()


async def test_async_callable_object() -> None:
    class Adder:
        __name__ = "adder"

        async def __call__(self, a: int) -> int:
            return a + 1

    adder = hr.tool(Adder())
    assert (await call(adder, {"a": 1})).structured == 2


async def test_actions_callback_gets_the_validated_arguments() -> None:
    @hr.tool(actions=lambda path: [hr.Action(hr.Act.READ, path)])
    async def read(path: str) -> str:
        return path

    assert read.actions(read.validate({"path": "a.txt"})) == [hr.Action(hr.Act.READ, "a.txt")]

    @hr.tool
    async def plain() -> None: ...

    assert plain.actions(plain.validate({})) == [hr.Action(hr.Act.CALL, "local/plain")]


async def test_body_exception_is_tool_failed_landed() -> None:
    @hr.tool
    async def f() -> None:
        raise KeyError("boom")

    with pytest.raises(hr.ToolFailed, match="KeyError") as info:
        await call(f, {})
    assert info.value.disposition is hr.Disposition.LANDED
    assert isinstance(info.value.__cause__, KeyError)


async def test_sync_body_exception_is_tool_failed() -> None:
    @hr.tool
    def f() -> None:
        raise ValueError("bad")

    with pytest.raises(hr.ToolFailed, match="ValueError: bad"):
        await call(f, {})


async def test_a_not_sent_error_raised_inside_a_body_is_not_believed() -> None:
    inner_box = hr.Toolbox()

    @hr.tool
    async def outer() -> None:
        # The body ran (it might have acted) before a nested call failed "not sent".
        await inner_box.call("nothing/here", {})

    with pytest.raises(hr.ToolFailed) as info:
        await call(outer, {})
    assert info.value.disposition is hr.Disposition.LANDED
    assert isinstance(info.value.__cause__, hr.UnknownTool)


async def test_an_in_doubt_error_raised_inside_a_body_passes_through() -> None:
    @hr.tool
    async def remote() -> None:
        raise hr.TransportError("link dropped after sending")

    with pytest.raises(hr.TransportError) as info:
        await call(remote, {})
    assert info.value.disposition is hr.Disposition.IN_DOUBT


# --------------------------------------------------------------------------- outputs


class Point(BaseModel):
    x: int
    y: int


class Pair(TypedDict):
    a: int
    b: str


async def test_typed_return_gives_output_schema_and_structured_content() -> None:
    @hr.tool
    async def where() -> Point:
        return Point(x=1, y=2)

    assert where.spec.output_schema == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    }
    result = await call(where, {})
    assert result.structured == {"x": 1, "y": 2}
    assert result.content == (hr.Text('{"x":1,"y":2}'),)
    assert result.is_error is False


@pytest.mark.parametrize(
    ("annotation", "value", "structured", "text"),
    [
        (int, 5, 5, "5"),
        (int, -(2**70), -(2**70), str(-(2**70))),
        (float, 1.5, 1.5, "1.5"),
        (bool, True, True, "true"),
        (str, "hi", "hi", "hi"),
        (list[int], [1, 2], [1, 2], "[1,2]"),
        (Pair, {"a": 1, "b": "x"}, {"a": 1, "b": "x"}, '{"a":1,"b":"x"}'),
        (int | None, None, None, "null"),
    ],
)
async def test_scalar_and_container_returns(
    annotation: Any, value: Any, structured: Any, text: str
) -> None:
    async def f() -> Any:
        return value

    f.__annotations__["return"] = annotation
    tool = hr.tool(f)
    assert tool.spec.output_schema is not None
    result = await call(tool, {})
    assert result.structured == structured
    assert result.content == (hr.Text(text),)


async def test_an_int_past_the_digit_limit_is_still_its_digits() -> None:
    """Issue 38: an int's text is `str(value)`, which refuses past the interpreter's digit
    limit (4,300 by default); the serialiser writes it anyway, as it always did."""
    @hr.tool
    async def huge() -> int:
        return 10**5000

    result = await call(huge, {})
    assert result.content == (hr.Text("1" + "0" * 5000),)
    assert result.structured == 10**5000


@pytest.mark.parametrize("annotation", [None, Any, hr.ToolResult, "missing"])
def test_no_output_schema_for_none_any_toolresult_or_no_annotation(annotation: Any) -> None:
    async def f() -> None: ...

    if annotation == "missing":
        del f.__annotations__["return"]
    else:
        f.__annotations__["return"] = annotation
    assert hr.tool(f).spec.output_schema is None


async def test_untyped_results_are_text_without_structured_content() -> None:
    @hr.tool
    async def f(kind: str) -> Any:
        return {"s": "text", "d": {"k": [1]}, "n": None}[kind]

    assert (await call(f, {"kind": "s"})) == hr.ToolResult([hr.Text("text")])
    assert (await call(f, {"kind": "d"})) == hr.ToolResult([hr.Text('{"k":[1]}')])
    assert (await call(f, {"kind": "n"})) == hr.ToolResult([hr.Text("null")])


async def test_untyped_unserialisable_result_is_invalid_output() -> None:
    @hr.tool
    async def f() -> Any:
        return object()

    with pytest.raises(hr.InvalidOutput) as info:
        await call(f, {})
    assert info.value.disposition is hr.Disposition.LANDED


async def test_returning_a_tool_result_passes_it_through() -> None:
    @hr.tool
    async def f() -> hr.ToolResult:
        return hr.ToolResult.error("nope")

    assert await call(f, {}) == hr.ToolResult.error("nope")


async def test_toolresult_annotation_refuses_other_values() -> None:
    @hr.tool
    async def f() -> hr.ToolResult:
        return "text"  # type: ignore[return-value]

    with pytest.raises(hr.InvalidOutput, match=r"expected an hr\.ToolResult"):
        await call(f, {})


async def test_output_that_fails_its_schema_is_invalid_output_landed() -> None:
    @hr.tool
    async def f() -> Point:
        return {"x": "not a number", "y": 2}  # type: ignore[return-value]

    with pytest.raises(hr.InvalidOutput) as info:
        await call(f, {})
    assert info.value.disposition is hr.Disposition.LANDED
    assert info.value.issues[0].path == "$.x"


async def test_explicit_none_is_validated_against_the_output_schema() -> None:
    @hr.tool
    async def f() -> int:
        return None  # type: ignore[return-value]

    with pytest.raises(hr.InvalidOutput):
        await call(f, {})


async def test_tool_result_structured_is_checked_including_absent_structured() -> None:
    @hr.tool
    async def f(mode: str) -> Point:
        if mode == "good":
            return hr.ToolResult.json({"x": 1, "y": 2})  # type: ignore[return-value]
        if mode == "model":
            return hr.ToolResult([hr.Text("p")], Point(x=3, y=4))  # type: ignore[return-value]
        if mode == "bad":
            return hr.ToolResult.json({"x": 1})  # type: ignore[return-value]
        if mode == "none":
            return hr.ToolResult.text("no structured content")  # type: ignore[return-value]
        return hr.ToolResult.error("failed")  # type: ignore[return-value]

    assert (await call(f, {"mode": "good"})).structured == {"x": 1, "y": 2}
    # A model instance is carried as its JSON form, so results can be stored and sent.
    assert (await call(f, {"mode": "model"})).structured == {"x": 3, "y": 4}
    with pytest.raises(hr.InvalidOutput):
        await call(f, {"mode": "bad"})
    with pytest.raises(hr.InvalidOutput):
        await call(f, {"mode": "none"})
    # An error result is exempt from the output schema.
    assert (await call(f, {"mode": "error"})).is_error


async def test_non_finite_float_output_is_refused() -> None:
    @hr.tool
    async def f() -> float:
        return float("nan")

    with pytest.raises(hr.InvalidOutput, match="not a JSON number"):
        await call(f, {})
