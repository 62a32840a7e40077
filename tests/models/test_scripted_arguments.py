"""The scripted model sends each call's arguments as `json.dumps` writes them (issue 11 made
the encoding cheaper; the text a model call carries must not change with it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handrail.models import AssistantMessage, Scripted, ToolCall, call

pytestmark = pytest.mark.anyio

ARGUMENTS: list[dict[str, Any]] = [
    {"b": "é\u2028", "a": [1, 2.5, 1e300, None, True, {"z": 1, "y": "\x00"}]},
    {"nan": float("nan"), "inf": float("-inf")},
    {},
]


@pytest.mark.parametrize("arguments", ARGUMENTS)
async def test_the_arguments_text_is_json_dumps(arguments: dict[str, Any]) -> None:
    model = Scripted([call("echo", arguments)])
    response = await model.request([], [])
    assert isinstance(response.message, AssistantMessage)
    (part,) = response.message.parts
    assert isinstance(part, ToolCall)
    assert part.arguments == json.dumps(arguments)


async def test_every_scripted_response_reports_one_request_and_no_tokens() -> None:
    # One Usage shared by every response (issue 11): frozen, so no response can change it.
    import dataclasses

    from handrail.models import Usage, reply

    model = Scripted([call("echo", {}), reply("done")])
    first = await model.request([], [])
    second = await model.request([first.message], [])
    assert first.usage == second.usage == Usage(0, 0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.usage.requests = 2  # type: ignore[misc]
