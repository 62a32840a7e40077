"""The `Model` protocol: the one seam between the agent loop and any model provider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from handrail.models._messages import ModelResponse, ModelSettings, StreamEvent
from handrail.tools import ToolSpec

__all__ = ["Model", "StreamingModel"]


@runtime_checkable
class Model(Protocol):
    """Anything that answers a conversation with an assistant turn.

    `tools` are the specs the model may call, each offered under `spec.id.model_name`; the
    model's tool calls name tools by that exact string.
    """

    @property
    def name(self) -> str:
        """A label for records and logs (`openai:gpt-4.1-mini`, `scripted`)."""
        ...

    async def request(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Send the conversation and return the model's next turn.

        Raises:
            ModelError: the provider failed (after its own retries).
        """
        ...


@runtime_checkable
class StreamingModel(Model, Protocol):
    """A `Model` that can also stream its turn as it is generated (`OpenAIChat`, `Anthropic`).

    `isinstance(model, StreamingModel)` tells a caller whether `request_stream` is there.
    """

    def request_stream(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Send the conversation and yield the turn as it arrives.

        Yields `TextDelta`, `ThinkingDelta`, `ToolCallStart` and `ToolCallDelta` events as the
        provider produces them, then exactly one `ResponseDone` carrying the full
        `ModelResponse`. Close the iterator (`contextlib.aclosing`) when stopping early, so the
        connection is released.

        Raises:
            ModelError: the provider failed (retries happen only before the first event).
        """
        ...
