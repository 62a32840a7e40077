"""`Anthropic`: the Anthropic Messages API."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pydantic_core

from handrail.errors import (
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelUnavailable,
)
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
from handrail.tools import Image, Text, ToolSpec
from handrail.tools._content import render_item

__all__ = ["Anthropic"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
_TOOL_CHOICE = {"auto": "auto", "required": "any", "none": "none"}
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_ID = re.compile(r"[A-Za-z0-9_-]+")
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


def wire_id(call_id: str) -> str:
    """A call id in the alphabet Anthropic accepts (`[A-Za-z0-9_-]`).

    Ids minted by other providers may hold other characters; the rewrite is deterministic, so
    a `tool_use` and its `tool_result` still agree, and a hash keeps rewritten ids distinct.
    """
    if _ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', call_id)[:40]}_{digest}"


def _input(arguments: str) -> Any:
    """A call's arguments as the object Anthropic's `tool_use.input` must be."""
    try:
        value = pydantic_core.from_json(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    # The model's own broken arguments, kept visible so the echoed turn is faithful.
    return value if isinstance(value, dict) else {"INVALID_JSON": arguments}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ThinkingPart):
            # Only Anthropic's own signed blocks can go back; others are dropped.
            if part.provider != "anthropic":
                continue
            if part.redacted is not None:
                blocks.append({"type": "redacted_thinking", "data": part.redacted})
            elif part.signature is not None:
                blocks.append(
                    {"type": "thinking", "thinking": part.text, "signature": part.signature}
                )
        elif isinstance(part, TextPart):
            if part.text:  # the API refuses empty text blocks
                blocks.append({"type": "text", "text": part.text})
        else:
            blocks.append({
                "type": "tool_use",
                "id": wire_id(part.id),
                "name": part.name,
                "input": _input(part.arguments),
            })
    return blocks


def _tool_result(message: ToolResultMessage) -> dict[str, Any]:
    items = message.result.content
    content: str | list[dict[str, Any]]
    if all(not isinstance(i, Image) or i.mime_type not in _IMAGE_TYPES for i in items):
        content = "\n".join(render_item(i) for i in items)
    else:
        content = []
        for item in items:
            if isinstance(item, Image) and item.mime_type in _IMAGE_TYPES:
                content.append({
                    "type": "image",
                    "source": {"type": "base64", "media_type": item.mime_type, "data": item.data},
                })
            else:
                text = item.text if isinstance(item, Text) else render_item(item)
                if text:
                    content.append({"type": "text", "text": text})
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": wire_id(message.call_id),
        "content": content,
    }
    if message.result.is_error:
        block["is_error"] = True
    return block


def convert_messages(messages: Sequence[Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """Our messages as (system prompt, Messages API messages).

    Consecutive messages of one role are merged into one turn, tool results first, as the
    API requires; assistant thinking blocks go back unchanged with their signatures.
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in messages:
        if isinstance(message, UserMessage):
            add("user", [{"type": "text", "text": message.text}])
        elif isinstance(message, AssistantMessage):
            add("assistant", _assistant_blocks(message))
        elif isinstance(message, ToolResultMessage):
            add("user", [_tool_result(message)])
        elif isinstance(message, SystemMessage):
            system.append(message.text)
        else:
            raise unsupported_message(message)
    return ("\n\n".join(system) if system else None), out


def _finish(raw: Any, has_calls: bool) -> str:
    if not isinstance(raw, str) or not raw:
        return "tool_calls" if has_calls else "stop"
    return _FINISH.get(raw, raw)


def _index(data: Mapping[str, Any]) -> int:
    """A content block's index; -1 (no block) when absent."""
    return -1 if data.get("index") is None else provider_int(data["index"], "index")


def _input_tokens(usage: Mapping[str, Any]) -> int:
    return sum(
        provider_int(usage.get(k), f"usage.{k}")
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


def _stream_error(provider: str, data: Mapping[str, Any]) -> ModelError:
    error = data.get("error")
    kind = error.get("type") if isinstance(error, Mapping) else None
    message = f"{provider} reported an error mid-stream: {error_detail(data)}"
    if kind in _RETRYABLE_ERRORS:
        return ModelUnavailable(message, body=data)
    if kind == "invalid_request_error":
        return ModelRequestError(message, body=data)
    return ModelResponseError(message, body=data)


@dataclass(slots=True)
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    signature: str | None = None
    redacted: str | None = None
    call_id: str = ""
    name: str = ""
    start_input: Any = None


class Anthropic(HttpModel):
    """A Claude model behind the Anthropic Messages API.

    Thinking blocks come back as `ThinkingPart(provider="anthropic")` with their signature and
    are sent back unchanged, as extended thinking with tools requires. Turn thinking on with
    `ModelSettings(extra={"thinking": {"type": "enabled", "budget_tokens": 2000}})`.

    Example:
        ```python
        model = hr.models.Anthropic("claude-sonnet-4-5")     # ANTHROPIC_API_KEY
        ```

    Args:
        model: The model name (`claude-sonnet-4-5`).
        base_url: The API root without `/v1`, as Anthropic's own clients expect; defaults to
            `ANTHROPIC_BASE_URL`, else `https://api.anthropic.com`.
        api_key: The key; defaults to the `api_key_env` variable, read at the first request.
        api_key_env: The variable holding the key (`ANTHROPIC_API_KEY`).
        headers: Extra headers sent with every request (e.g. `anthropic-beta`).
        timeout: Seconds a request may take (connecting: at most 10), None for no limit.
        max_retries: Retries after rate limits, overload, 5xx, timeouts and broken connections.
        backoff_base: First backoff delay in seconds; it doubles per retry, with jitter.
        max_tokens: Output bound when `ModelSettings.max_tokens` is not set (the API needs one).
        http_client: An `httpx.AsyncClient` to use (proxies, TLS); you close it.
    """

    _path = "/v1/messages"
    _not_found_hint = ", and that base_url is the API root without /v1"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 120.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            model,
            provider="anthropic",
            base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL,
            api_key=api_key,
            api_key_env=api_key_env,
            headers={"anthropic-version": API_VERSION, **(headers or {})},
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            http_client=http_client,
        )
        self.max_tokens = max_tokens
        """Output bound sent when the settings give none."""
        self._tools_cache: tuple[Sequence[ToolSpec] | None, list[dict[str, Any]]] = (None, [])

    def _auth_headers_for(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def _tools(self, tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
        cached, converted = self._tools_cache
        if not same_specs(cached, tools):
            converted = [
                {
                    "name": spec.id.model_name,
                    "description": spec.description,
                    "input_schema": dict(spec.input_schema),
                }
                for spec in tools
            ]
            self._tools_cache = (tools, converted)
        return converted

    def _body(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None,
        stream: bool,
    ) -> dict[str, Any]:
        system, converted = convert_messages(messages)
        max_tokens = settings.max_tokens if settings and settings.max_tokens else None
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens or self.max_tokens,
            "messages": converted,
        }
        if system is not None:
            body["system"] = system
        if tools:
            body["tools"] = self._tools(tools)
            choice = (settings.tool_choice if settings else None) or "auto"
            body["tool_choice"] = {"type": _TOOL_CHOICE[choice]}
        if stream:
            body["stream"] = True
        if settings is not None:
            if settings.temperature is not None:
                body["temperature"] = settings.temperature
            body.update(settings.extra)
        return body

    async def request(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Send the conversation and return the model's next turn.

        Raises:
            ConfigError: no API key (nothing was sent).
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
        if not isinstance(data, Mapping) or not isinstance(data.get("content"), list):
            if isinstance(data, Mapping) and data.get("type") == "error":
                raise _stream_error(self._display, data)
            raise ModelResponseError(
                f"{self._display} answered without a content list", body=data
            )
        ids = CallIds()
        parts: list[TextPart | ToolCall | ThinkingPart] = []
        for block in data["content"]:
            kind = block.get("type")
            if kind == "text":
                parts.append(TextPart(str(block.get("text", ""))))
            elif kind == "thinking":
                parts.append(ThinkingPart(
                    str(block.get("thinking", "")), block.get("signature"), "anthropic"
                ))
            elif kind == "redacted_thinking":
                parts.append(ThinkingPart("", None, "anthropic", str(block.get("data", ""))))
            elif kind == "tool_use":
                parts.append(ToolCall(
                    ids.take(block.get("id")),
                    str(block.get("name") or ""),
                    pydantic_core.to_json(block.get("input") or {}).decode(),
                ))
        has_calls = any(isinstance(p, ToolCall) for p in parts)
        if not parts:
            parts.append(TextPart(""))
        usage = data.get("usage") or {}
        return ModelResponse(
            AssistantMessage(tuple(parts)),
            Usage(_input_tokens(usage),
                  provider_int(usage.get("output_tokens"), "usage.output_tokens")),
            _finish(data.get("stop_reason"), has_calls),
            data.get("model") or self.model,
        )

    async def request_stream(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream the model's next turn: deltas as they arrive, then `ResponseDone`.

        `tool_use` input arrives as `input_json_delta` fragments, assembled verbatim. A
        stream that ends before `message_stop` raises `ModelUnavailable`.

        Raises:
            ConfigError: no API key (nothing was sent).
            ModelError: the provider failed (retried only before the first event).
        """
        if settings is not None and settings.stream is False:
            for whole in replay(await self.request(messages, tools, settings)):
                yield whole
            return
        body = self._body(messages, tools, settings, stream=True)
        blocks: dict[int, _Block] = {}
        ids = CallIds()
        input_tokens = output_tokens = 0
        stop_reason: Any = None
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
                    try:
                        data = pydantic_core.from_json(event.data)
                    except ValueError as exc:
                        raise ModelResponseError(
                            f"{self._display} streamed an event that is not JSON: "
                            f"{event.data[:200]!r}"
                        ) from exc
                    kind = data.get("type") if isinstance(data, Mapping) else None
                    if kind == "message_start":
                        message = data.get("message") or {}
                        model = message.get("model")
                        usage = message.get("usage") or {}
                        input_tokens = _input_tokens(usage)
                        output_tokens = provider_int(usage.get("output_tokens"),
                                                     "usage.output_tokens")
                    elif kind == "content_block_start":
                        raw = data.get("content_block") or {}
                        at = provider_int(data.get("index", len(blocks)), "index")
                        block = blocks[at] = _Block(str(raw.get("type")))
                        if block.kind == "text" and raw.get("text"):
                            block.text.append(raw["text"])
                            yield TextDelta(raw["text"])
                        elif block.kind == "thinking" and raw.get("thinking"):
                            block.text.append(raw["thinking"])
                            yield ThinkingDelta(raw["thinking"])
                        elif block.kind == "redacted_thinking":
                            block.redacted = str(raw.get("data", ""))
                        elif block.kind == "tool_use":
                            block.call_id = ids.take(raw.get("id"))
                            block.name = str(raw.get("name") or "")
                            block.start_input = raw.get("input")
                            yield ToolCallStart(block.call_id, block.name)
                    elif kind == "content_block_delta":
                        block = blocks.get(_index(data), _Block("unknown"))
                        delta = data.get("delta") or {}
                        dkind = delta.get("type")
                        if dkind == "text_delta" and delta.get("text"):
                            block.text.append(delta["text"])
                            yield TextDelta(delta["text"])
                        elif dkind == "thinking_delta" and delta.get("thinking"):
                            block.text.append(delta["thinking"])
                            yield ThinkingDelta(delta["thinking"])
                        elif dkind == "signature_delta":
                            signature = str(delta.get("signature", ""))
                            block.signature = (block.signature or "") + signature
                        elif dkind == "input_json_delta" and delta.get("partial_json"):
                            block.text.append(delta["partial_json"])
                            if block.kind == "tool_use":
                                yield ToolCallDelta(block.call_id, delta["partial_json"])
                    elif kind == "content_block_stop":
                        block = blocks.get(_index(data), _Block("unknown"))
                        if block.kind == "tool_use" and not block.text and block.start_input:
                            # The whole input came with the block's start, no fragments followed.
                            block.text.append(pydantic_core.to_json(block.start_input).decode())
                            yield ToolCallDelta(block.call_id, block.text[0])
                    elif kind == "message_delta":
                        stop_reason = (data.get("delta") or {}).get("stop_reason") or stop_reason
                        usage = data.get("usage") or {}
                        if usage.get("output_tokens") is not None:
                            output_tokens = provider_int(usage["output_tokens"],
                                                         "usage.output_tokens")
                        if usage.get("input_tokens") is not None:
                            input_tokens = _input_tokens(usage)
                    elif kind == "message_stop":
                        done = True
                        break
                    elif kind == "error":
                        raise _stream_error(self._display, data)
            except MALFORMED as exc:
                raise malformed(self._display, exc) from exc
        if not done:
            raise ModelUnavailable(
                f"the {self._display} stream ended before message_stop; retry the request"
            )
        parts: list[TextPart | ToolCall | ThinkingPart] = []
        for index in sorted(blocks):
            block = blocks[index]
            text = "".join(block.text)
            if block.kind == "text":
                parts.append(TextPart(text))
            elif block.kind == "thinking":
                parts.append(ThinkingPart(text, block.signature, "anthropic"))
            elif block.kind == "redacted_thinking":
                parts.append(ThinkingPart("", None, "anthropic", block.redacted))
            elif block.kind == "tool_use":
                parts.append(ToolCall(block.call_id, block.name, text or "{}"))
        has_calls = any(isinstance(p, ToolCall) for p in parts)
        if not parts:
            parts.append(TextPart(""))
        yield ResponseDone(ModelResponse(
            AssistantMessage(tuple(parts)),
            Usage(input_tokens, output_tokens),
            _finish(stop_reason, has_calls),
            model or self.model,
        ))
