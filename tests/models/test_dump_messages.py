"""`dump_messages` writes each kind of message and part as `load_messages` reads it back.

Issue 38: a model's turn is dumped on every turn of the loop, on a path of its own (a loop over
its parts, a call's dict written inline); what it writes must stay what the general path
wrote, part by part, in order.
"""

from __future__ import annotations

from handrail import ToolResult
from handrail.models import (
    AssistantMessage,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    dump_messages,
    load_messages,
)


def test_every_part_of_a_turn_is_dumped_in_order_and_loads_back() -> None:
    turn = AssistantMessage(
        (
            ThinkingPart("hm", signature="sig", provider="anthropic"),
            TextPart("first"),
            ToolCall("call_1", "add", '{"a": 1}'),
            TextPart("between"),
            ToolCall("call_2", "sub", '{"b": 2}'),
        )
    )
    messages = [
        SystemMessage("be brief"),
        UserMessage("add"),
        turn,
        ToolResultMessage("call_1", "add", ToolResult.text("2")),
    ]
    dumped = dump_messages(messages)
    assert dumped[2] == {
        "kind": "assistant",
        "parts": [
            {
                "kind": "thinking",
                "text": "hm",
                "signature": "sig",
                "provider": "anthropic",
                "redacted": None,
            },
            {"kind": "text", "text": "first"},
            {"kind": "tool_call", "id": "call_1", "name": "add", "arguments": '{"a": 1}'},
            {"kind": "text", "text": "between"},
            {"kind": "tool_call", "id": "call_2", "name": "sub", "arguments": '{"b": 2}'},
        ],
    }
    assert load_messages(dumped) == messages
