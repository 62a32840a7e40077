"""Typed final output: `Agent(output_type=...)`.

The model is offered one more tool, `handrail--final_result`, whose arguments are the output
(an object type's fields, or `{"result": value}` for a scalar or a list). A final text reply
that is valid JSON for the type is accepted too, as a provider's structured-output mode sends
it. Anything else is returned to the model as a fixable error, under the same invalid-turns
budget as invalid tool arguments.

The output is what the model wrote: its size is bounded (`max_argument_bytes`) before it is
parsed, and pydantic validates it against the type; the value the run returns is the
validated one, stored in its JSON form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from handrail.errors import UserError
from handrail.models import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from handrail.tools import ToolId, ToolResult, ToolSpec

if TYPE_CHECKING:
    import pydantic

__all__ = ["Accept", "OutputType", "Retry", "judge_final", "output_for"]

FINAL_TOOL = ToolId("handrail", "final_result")
"""The tool the model calls with its final output."""

_MAX_ERROR = 2000


@dataclass(frozen=True, slots=True)
class Accept:
    """The turn gave a valid final output."""

    value: Any
    """The validated output."""
    results: list[ToolResultMessage]
    """Results for the turn's calls (every call id gets one), to keep the history whole."""


@dataclass(frozen=True, slots=True)
class Retry:
    """The turn tried to end with an output the type refuses."""

    error: str
    """Why, as the model is told."""
    feedback: list[Any]
    """The messages that tell the model (tool results, or a user message after text)."""


class OutputType:
    """The type a run's final output must have, and how to read it from a model's turn."""

    def __init__(self, output_type: Any, max_bytes: int) -> None:
        # Imported here: an agent without output_type never needs pydantic (issue 11).
        import pydantic

        try:
            adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(output_type)
            schema = adapter.json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError,
                TypeError) as exc:
            raise UserError(f"output_type={output_type!r} is not a type pydantic can "
                            f"validate ({exc}); use a pydantic model, a dataclass, a "
                            "TypedDict or a scalar type") from exc
        self.type = output_type
        self.adapter = adapter
        self.max_bytes = max_bytes
        self.wrapped = schema.get("type") != "object"
        if self.wrapped:
            parameters: dict[str, Any] = {
                "type": "object", "properties": {"result": schema}, "required": ["result"],
                "additionalProperties": False}
            defs = schema.pop("$defs", None)
            if defs is not None:
                parameters["$defs"] = defs
            self.arguments: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
                pydantic.create_model("final_result", result=(output_type, ...)))
        else:
            parameters = schema
            self.arguments = adapter
        self.spec = ToolSpec(
            FINAL_TOOL,
            "Give your final answer by calling this tool with it; the run ends with it.",
            parameters, mutates=False)
        self.name = FINAL_TOOL.model_name

    def _parse(self, adapter: pydantic.TypeAdapter[Any], text: str) -> Any:
        if len(text.encode()) > self.max_bytes:
            raise ValueError(f"the output is larger than {self.max_bytes} bytes")
        import pydantic  # loaded already: this instance's __init__ imported it

        try:
            return adapter.validate_json(text)
        except pydantic.ValidationError as exc:
            raise ValueError(str(exc)[:_MAX_ERROR]) from None

    def from_arguments(self, text: str) -> Any:
        """The output in a final-result call's arguments; ValueError says what is wrong."""
        value = self._parse(self.arguments, text)
        return value.result if self.wrapped else value

    def from_text(self, text: str) -> Any:
        """The output in a text reply (JSON for the type); ValueError says what is wrong."""
        return self._parse(self.adapter, text.strip())

    def restore(self, data: Any) -> Any:
        """The typed value of a stored output (its JSON form)."""
        return self.adapter.validate_python(data)


def output_for(output_type: Any, toolbox: Any, max_bytes: int) -> OutputType | None:
    """The `OutputType` for `Agent(output_type=...)`; None for plain text (`str`)."""
    if output_type is str:
        return None
    output = OutputType(output_type, max_bytes)
    if any(spec.id.model_name == output.name for spec in toolbox.specs()):
        raise UserError(f"a tool is already named {output.name!r}, the name of the final-result "
                        "tool output_type= adds; rename that tool")
    return output


def _result(call: ToolCall, text: str, *, error: bool) -> ToolResultMessage:
    result = ToolResult.error(text) if error else ToolResult.text(text)
    return ToolResultMessage(call.id, call.name, result)


def judge_final(output: OutputType, message: AssistantMessage) -> Accept | Retry | None:
    """Whether `message` ends the run with a valid output; None when it is a turn of calls."""
    calls = [p for p in message.parts if type(p) is ToolCall]
    finals = [c for c in calls if c.name == output.name]
    if calls and not finals:
        return None
    if not calls:
        try:
            return Accept(output.from_text(message.text), [])
        except ValueError as exc:
            error = f"your reply is not a valid final output: {exc}"
            return Retry(error, [UserMessage(
                f"{error}\nCall {output.name} with the final output (or reply with JSON "
                "that matches its schema).")])
    try:
        value = output.from_arguments(finals[0].arguments)
    except ValueError as exc:
        error = f"invalid final output: {exc}"
        return Retry(error, [
            _result(c, error if c is finals[0] else
                    "not executed: the turn also gave a final output; call tools and give the "
                    "final output in separate turns", error=True)
            for c in calls])
    return Accept(value, [
        _result(c, "final output accepted" if c is finals[0] else
                "not executed: the run ended with the final output", error=c is not finals[0])
        for c in calls])
