"""Models: the `Model` protocol, message types, and the providers.

`Scripted` (deterministic) is here; `OpenAIChat` (chat completions: OpenAI, OpenRouter, vLLM,
Ollama, LM Studio) and `Anthropic` are the real providers. They are imported on first use, so
importing handrail does not import httpx.
"""

from typing import TYPE_CHECKING, Any

from handrail.models._infer import infer_model
from handrail.models._messages import (
    AssistantMessage,
    Message,
    ModelResponse,
    ModelSettings,
    Part,
    ResponseDone,
    StreamEvent,
    SystemMessage,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolResultMessage,
    Usage,
    UserMessage,
    dump_messages,
    load_messages,
    provider_int,
)
from handrail.models._model import Model, StreamingModel
from handrail.models._scripted import Scripted, Turn, call, calls, reply

if TYPE_CHECKING:
    from handrail.models._anthropic import Anthropic
    from handrail.models._openai import OpenAIChat

__all__ = [
    "Anthropic",
    "AssistantMessage",
    "Message",
    "Model",
    "ModelResponse",
    "ModelSettings",
    "OpenAIChat",
    "Part",
    "ResponseDone",
    "Scripted",
    "StreamEvent",
    "StreamingModel",
    "SystemMessage",
    "TextDelta",
    "TextPart",
    "ThinkingDelta",
    "ThinkingPart",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStart",
    "ToolResultMessage",
    "Turn",
    "Usage",
    "UserMessage",
    "call",
    "calls",
    "dump_messages",
    "infer_model",
    "load_messages",
    "provider_int",
    "reply",
]


def __getattr__(name: str) -> Any:
    # The HTTP providers pull in httpx; load them only when asked for.
    if name == "OpenAIChat":
        from handrail.models._openai import OpenAIChat

        return OpenAIChat
    if name == "Anthropic":
        from handrail.models._anthropic import Anthropic

        return Anthropic
    raise AttributeError(f"module 'handrail.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
