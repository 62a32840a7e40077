"""`OpenAIChat`: the chat-completions API of OpenAI and every compatible server.

OpenRouter, vLLM, Ollama and LM Studio speak the same protocol; point `base_url` at them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pydantic_core

from handrail.errors import ModelResponseError, ModelUnavailable
from handrail.models._base import (
    MALFORMED,
    CallIds,
    HttpModel,
    malformed,
    provider_int,
    same_specs,
    unsupported_message,
)
from handrail.models._http import JsonBody, error_detail
from handrail.models._messages import (
    AssistantMessage,
    ModelResponse,
    ModelSettings,
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
    replay,
)
from handrail.tools import Image, ToolSpec
from handrail.tools._content import render_item

__all__ = ["OpenAIChat", "strict_compatible"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FINISH = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

# Keywords OpenAI's strict mode accepts (its "supported schemas" page); any other keyword
# anywhere in a schema makes us offer the tool non-strict rather than risk a 400.
_STRICT_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "anyOf", "$ref", "$defs", "definitions", "description", "title", "pattern", "format",
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "minItems",
    "maxItems",
})  # fmt: skip
_STRICT_FORMATS = frozenset({
    "date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid",
})  # fmt: skip


def strict_compatible(schema: Mapping[str, Any]) -> bool:
    """Whether OpenAI's strict mode can take `schema` unchanged.

    Every object must list all its properties as required and forbid additional ones, and
    only keywords strict mode supports may appear. Optional fields (not required) make a tool
    non-strict: rewriting them as nullable would change what the tool accepts.
    """
    if not isinstance(schema, Mapping):
        return False
    if not _STRICT_KEYWORDS.issuperset(schema):
        return False
    if "format" in schema and schema["format"] not in _STRICT_FORMATS:
        return False
    types = schema.get("type")
    properties = schema.get("properties")
    is_object = types == "object" or (isinstance(types, list) and "object" in types)
    if is_object or properties is not None:
        if schema.get("additionalProperties") is not False:
            return False
        props = properties or {}
        if not isinstance(props, Mapping) or set(schema.get("required", ())) != set(props):
            return False
        if not all(strict_compatible(sub) for sub in props.values()):
            return False
    elif "additionalProperties" in schema:
        return False
    items = schema.get("items")
    if items is not None and not strict_compatible(items):
        return False
    for key in ("anyOf",):
        if key in schema and not all(strict_compatible(s) for s in schema[key]):
            return False
    for key in ("$defs", "definitions"):
        if key in schema and not all(strict_compatible(s) for s in schema[key].values()):
            return False
    return True


def _tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": spec.id.model_name,
        "description": spec.description,
        "parameters": dict(spec.input_schema),
    }
    if strict_compatible(spec.input_schema):
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_result(message: ToolResultMessage) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The `role: tool` message, and the image parts that must follow as a user message."""
    lines: list[str] = []
    images: list[dict[str, Any]] = []
    for item in message.result.content:
        if isinstance(item, Image):
            number = len(images) // 2 + 1
            lines.append(
                f"[image {number} ({item.mime_type}) of this result follows in the next "
                "user message]"
            )
            images.append({
                "type": "text",
                "text": f"Image {number} returned by tool call {message.call_id} "
                f"({message.name}):",
            })
            images.append({
                "type": "image_url",
                "image_url": {"url": f"data:{item.mime_type};base64,{item.data}"},
            })
        else:
            lines.append(render_item(item))
    text = "\n".join(lines)
    if message.result.is_error:
        # Chat completions has no error flag on tool messages; say it in the text.
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": message.call_id, "content": text}, images


def _assistant(message: AssistantMessage) -> dict[str, Any]:
    text = "".join(p.text for p in message.parts if isinstance(p, TextPart))
    calls = [
        {"id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
        for p in message.parts
        if isinstance(p, ToolCall)
    ]
    # Thinking parts are dropped: chat completions takes no reasoning back.
    out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    return out


def _wire(message: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One message as a chat-completions message, plus image parts that must follow it."""
    if isinstance(message, ToolResultMessage):
        return _tool_result(message)
    if isinstance(message, AssistantMessage):
        return _assistant(message), []
    if isinstance(message, UserMessage):
        return {"role": "user", "content": message.text}, []
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": message.text}, []
    raise unsupported_message(message)


def _images_message(images: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": images}


def convert_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Our messages as chat-completions messages.

    Tool messages take only text, so a result's images go into one user message placed after
    the whole run of tool messages (a user message between them would break the pairing of
    tool calls and results), and the tool text says so.
    """
    out: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for message in messages:
        if images and not isinstance(message, ToolResultMessage):
            out.append(_images_message(images))
            images = []
        wire, more = _wire(message)
        out.append(wire)
        images.extend(more)
    if images:
        out.append(_images_message(images))
    return out


class _EncodedMessages:
    """`convert_messages`, JSON-encoded, remembering each message's encoding between calls.

    An agent loop resends its whole, growing history on every call; messages are immutable, so
    each is converted and encoded once. The memory is rebuilt on every call from the messages
    of that call, so it holds only what the caller holds anyway.
    """

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, bytes, list[dict[str, Any]]]] = {}

    def encode(self, messages: Sequence[Any]) -> bytes:
        """The JSON array of the wire messages."""
        memo = self._memo
        fresh: dict[int, tuple[Any, bytes, list[dict[str, Any]]]] = {}
        chunks: list[bytes] = []
        images: list[dict[str, Any]] = []
        for message in messages:
            key = id(message)
            entry = memo.get(key)
            if entry is None or entry[0] is not message:
                wire, more = _wire(message)
                entry = (message, pydantic_core.to_json(wire), more)
            fresh[key] = entry
            if images and not isinstance(message, ToolResultMessage):
                chunks.append(pydantic_core.to_json(_images_message(images)))
                images = []
            chunks.append(entry[1])
            images.extend(entry[2])
        if images:
            chunks.append(pydantic_core.to_json(_images_message(images)))
        self._memo = fresh
        return b"[" + b",".join(chunks) + b"]"


def _finish(raw: Any, has_calls: bool) -> str:
    if not isinstance(raw, str) or not raw:
        return "tool_calls" if has_calls else "stop"
    reason = _FINISH.get(raw, raw)
    # Some compatible servers say "stop" for a turn that calls tools.
    return "tool_calls" if reason == "stop" and has_calls else reason


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, Mapping):
        return Usage()
    return Usage(provider_int(raw.get("prompt_tokens"), "usage.prompt_tokens"),
                 provider_int(raw.get("completion_tokens"), "usage.completion_tokens"))


def _arguments(raw: Any) -> str:
    """A call's arguments text, verbatim; none at all stands for `{}` (no-argument call)."""
    if raw is None:
        return "{}"
    if isinstance(raw, str):
        return raw if raw.strip() else "{}"
    # A server that sends an object instead of the JSON text: keep its exact value.
    return pydantic_core.to_json(raw).decode()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers send content parts
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping)
        )
    return ""


def _error_in_body(provider: str, data: Mapping[str, Any]) -> ModelUnavailable:
    # OpenRouter reports upstream failures as a 200 (or an SSE event) carrying `error`.
    return ModelUnavailable(f"{provider} returned an error: {error_detail(data)}", body=data)


@dataclass(slots=True)
class _StreamCall:
    provider_id: Any = None
    name: str = ""
    fragments: list[str] = field(default_factory=list)
    id: str | None = None


class OpenAIChat(HttpModel):
    """A model behind the OpenAI chat-completions API, or any server compatible with it.

    Example:
        ```python
        model = hr.models.OpenAIChat("gpt-4.1-mini")                   # OPENAI_API_KEY
        local = hr.models.OpenAIChat("qwen3", base_url="http://localhost:11434/v1")  # Ollama
        ```

    Args:
        model: The model name the server knows (`gpt-4.1-mini`, `meta-llama/llama-3.3-70b`).
        base_url: The API root, including `/v1` as OpenAI's own clients expect; defaults to
            `OPENAI_BASE_URL`, else `https://api.openai.com/v1`.
        api_key: The key; defaults to the `api_key_env` variable, read at the first request.
            OpenAI's and OpenRouter's endpoints need one; a self-hosted server may go without.
        api_key_env: The variable holding the key (`OPENAI_API_KEY`).
        headers: Extra headers sent with every request (e.g. OpenRouter's `HTTP-Referer`).
        timeout: Seconds a request may take (connecting: at most 10), None for no limit.
        max_retries: Retries after rate limits, 5xx answers, timeouts and broken connections.
        backoff_base: First backoff delay in seconds; it doubles per retry, with jitter.
        provider: The prefix of `name` (`openai:<model>`), `openrouter` for OpenRouter.
        http_client: An `httpx.AsyncClient` to use (proxies, TLS); you close it.
    """

    _path = "/chat/completions"
    _not_found_hint = (
        ", and that base_url is the API root the server documents (for OpenAI-compatible "
        "servers it usually ends in /v1)"
    )

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 120.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        provider: str = "openai",
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            model,
            provider=provider,
            base_url=base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            api_key=api_key,
            api_key_env=api_key_env,
            headers=headers,
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            http_client=http_client,
        )
        # OpenAI's reasoning models refuse the older `max_tokens`; other servers may not
        # know its replacement.
        self._max_tokens_field = (
            "max_completion_tokens" if "api.openai.com" in self.base_url else "max_tokens"
        )
        self._tools_cache: tuple[Sequence[ToolSpec] | None, list[dict[str, Any]]] = (None, [])
        self._encoded = _EncodedMessages()

    def _auth_headers_for(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    def _tools(self, tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
        cached, converted = self._tools_cache
        if not same_specs(cached, tools):
            converted = [_tool(spec) for spec in tools]
            self._tools_cache = (tools, converted)
        return converted

    def _body(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None,
        stream: bool,
    ) -> bytes:
        """The request body, encoded (the history's encoding is reused between calls)."""
        body: dict[str, Any] = {"model": self.model}
        if tools:
            body["tools"] = self._tools(tools)
            body["tool_choice"] = (settings.tool_choice if settings else None) or "auto"
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if settings is not None:
            if settings.max_tokens is not None:
                body[self._max_tokens_field] = settings.max_tokens
            if settings.temperature is not None:
                body["temperature"] = settings.temperature
            body.update(settings.extra)
        if "messages" in body:  # the caller's own messages, from settings.extra
            return pydantic_core.to_json(body)
        # `{"messages":[...],` then the other fields: the same JSON object, built from parts.
        return b'{"messages":' + self._encoded.encode(messages) + b"," + pydantic_core.to_json(
            body
        )[1:]

    async def request(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Send the conversation and return the model's next turn.

        Raises:
            ConfigError: no API key for a hosted endpoint (nothing was sent).
            ModelError: the provider failed, after retries where retrying can help.
        """
        data = await self._http.post_json(
            self._path, self._body(messages, tools, settings, stream=False)
        )
        try:
            return self._parse(data)
        except MALFORMED as exc:
            raise malformed(self._display, exc, data) from exc

    def _parse(self, data: Any) -> ModelResponse:
        if not isinstance(data, Mapping):
            raise ModelResponseError(f"{self._display} answered with {type(data).__name__}, "
                                     "not a JSON object", body=data)
        choices = data.get("choices")
        if not choices:
            if data.get("error"):
                raise _error_in_body(self._display, data)
            raise ModelResponseError(f"{self._display} answered without choices", body=data)
        choice = choices[0]
        message = choice.get("message") or {}
        parts: list[TextPart | ToolCall | ThinkingPart] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append(ThinkingPart(reasoning, provider=self.provider))
        text = _text(message.get("content")) or _text(message.get("refusal"))
        if text:
            parts.append(TextPart(text))
        ids = CallIds()
        for raw in message.get("tool_calls") or ():
            function = raw.get("function") or {}
            parts.append(ToolCall(
                ids.take(raw.get("id")),
                str(function.get("name") or ""),
                _arguments(function.get("arguments")),
            ))
        has_calls = any(isinstance(p, ToolCall) for p in parts)
        if not parts:
            parts.append(TextPart(""))
        return ModelResponse(
            AssistantMessage(tuple(parts)),
            _usage(data.get("usage")),
            _finish(choice.get("finish_reason"), has_calls),
            data.get("model") or self.model,
        )

    async def request_stream(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream the model's next turn: deltas as they arrive, then `ResponseDone`.

        Tool-call arguments are assembled from their fragments verbatim. A stream that ends
        before the server's end marker raises `ModelUnavailable`.

        Raises:
            ConfigError: no API key for a hosted endpoint (nothing was sent).
            ModelError: the provider failed (retried only before the first event).
        """
        if settings is not None and settings.stream is False:
            for whole in replay(await self.request(messages, tools, settings)):
                yield whole
            return
        body = self._body(messages, tools, settings, stream=True)
        text: list[str] = []
        reasoning: list[str] = []
        calls: dict[Any, _StreamCall] = {}
        ids = CallIds()
        finish: Any = None
        usage = Usage()
        model: str | None = None
        done = False
        stream = self._http.stream_sse(self._path, body)
        async with contextlib.aclosing(stream) as events:
            try:
                async for event in events:
                    if isinstance(event, JsonBody):  # the server ignored `stream: true`
                        for whole in replay(self._parse(event.data)):
                            yield whole
                        return
                    if event.data.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        chunk = pydantic_core.from_json(event.data)
                    except ValueError as exc:
                        raise ModelResponseError(
                            f"{self._display} streamed an event that is not JSON: "
                            f"{event.data[:200]!r}"
                        ) from exc
                    if not isinstance(chunk, Mapping):
                        continue
                    if chunk.get("error"):
                        raise _error_in_body(self._display, chunk)
                    model = chunk.get("model") or model
                    if chunk.get("usage"):
                        usage = _usage(chunk["usage"])
                    for choice in chunk.get("choices") or ():
                        if choice.get("index", 0) != 0:
                            continue
                        delta = choice.get("delta") or {}
                        thought = delta.get("reasoning_content") or delta.get("reasoning")
                        if isinstance(thought, str) and thought:
                            reasoning.append(thought)
                            yield ThinkingDelta(thought)
                        piece = _text(delta.get("content"))
                        if piece:
                            text.append(piece)
                            yield TextDelta(piece)
                        for raw in delta.get("tool_calls") or ():
                            for out in self._call_delta(calls, ids, raw):
                                yield out
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
            except MALFORMED as exc:
                raise malformed(self._display, exc) from exc
        if not done and finish is None:
            raise ModelUnavailable(
                f"the {self._display} stream ended before the response was complete "
                "(no finish reason, no [DONE]); retry the request"
            )
        for call in calls.values():
            if call.id is None:  # never named: still surface it, the gate will refuse it
                call.id = ids.take(call.provider_id)
                yield ToolCallStart(call.id, call.name)
                if call.fragments:
                    yield ToolCallDelta(call.id, "".join(call.fragments))
        parts: list[TextPart | ToolCall | ThinkingPart] = []
        if reasoning:
            parts.append(ThinkingPart("".join(reasoning), provider=self.provider))
        if text:
            parts.append(TextPart("".join(text)))
        for call in calls.values():
            assert call.id is not None
            parts.append(ToolCall(call.id, call.name, _arguments("".join(call.fragments))))
        if not parts:
            parts.append(TextPart(""))
        yield ResponseDone(ModelResponse(
            AssistantMessage(tuple(parts)),
            usage,
            _finish(finish, bool(calls)),
            model or self.model,
        ))

    @staticmethod
    def _call_delta(
        calls: dict[Any, _StreamCall], ids: CallIds, raw: Mapping[str, Any]
    ) -> list[StreamEvent]:
        """Fold one tool-call delta into `calls`; the events it produces."""
        key = raw.get("index")
        if key is None:
            # Servers that omit the index: a name (sent only with a call's first chunk) or a
            # new id starts a new call; anything else continues the last one.
            raw_id = raw.get("id")
            fresh = bool((raw.get("function") or {}).get("name")) or (
                raw_id and raw_id not in {c.provider_id for c in calls.values()}
            )
            key = len(calls) if fresh or not calls else len(calls) - 1
        call = calls.get(key)
        if call is None:
            call = calls[key] = _StreamCall()
        if raw.get("id") and call.provider_id is None:
            call.provider_id = raw["id"]
        function = raw.get("function") or {}
        events: list[StreamEvent] = []
        name = function.get("name")
        if name and not call.name:
            call.name = str(name)
        fragment = function.get("arguments")
        if isinstance(fragment, Mapping):
            fragment = pydantic_core.to_json(fragment).decode()
        if call.id is None and call.name:
            call.id = ids.take(call.provider_id)
            events.append(ToolCallStart(call.id, call.name))
            if call.fragments:  # arguments that came before the name
                events.append(ToolCallDelta(call.id, "".join(call.fragments)))
        if isinstance(fragment, str) and fragment:
            call.fragments.append(fragment)
            if call.id is not None:
                events.append(ToolCallDelta(call.id, fragment))
        return events
