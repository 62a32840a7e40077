"""Models: the `Model` protocol, message types, and the providers.

`Scripted` (deterministic) is here; `OpenAIChat` and `Anthropic` are the real providers.
"""

from handrail.models._messages import (
    AssistantMessage,
    Message,
    ModelResponse,
    ModelSettings,
    Part,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    dump_messages,
    load_messages,
)
from handrail.models._model import Model
from handrail.models._scripted import Scripted, Turn, call, calls, reply

__all__ = [
    "AssistantMessage",
    "Message",
    "Model",
    "ModelResponse",
    "ModelSettings",
    "Part",
    "Scripted",
    "SystemMessage",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolResultMessage",
    "Turn",
    "Usage",
    "UserMessage",
    "call",
    "calls",
    "dump_messages",
    "load_messages",
    "reply",
]
