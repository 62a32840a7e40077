"""What the HTTP providers share: API keys, the HTTP client, names, invented call ids."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx

from handrail.errors import ConfigError, ModelResponseError, UserError
from handrail.models._http import ErrorContext, HttpClient
from handrail.models._messages import MAX_COUNT, provider_int
from handrail.tools import ToolSpec

__all__ = [
    "MALFORMED",
    "MAX_COUNT",
    "CallIds",
    "HttpModel",
    "malformed",
    "provider_int",
    "same_specs",
    "unsupported_message",
]

# Hosted vendor endpoints always need a key; a self-hosted compatible server (vLLM, Ollama,
# LM Studio) usually takes none, so elsewhere a missing key means "send no auth header".
_HOSTED = frozenset({"api.openai.com", "openrouter.ai", "api.anthropic.com",
                     "generativelanguage.googleapis.com"})
_DISPLAY = {"openai": "OpenAI", "openrouter": "OpenRouter", "anthropic": "Anthropic",
            "gemini": "Gemini", "ollama": "Ollama"}


class HttpModel:
    """Base of `OpenAIChat` and `Anthropic`: key resolution, the HTTP client, lifecycle."""

    _path: str
    _not_found_hint: str = ""

    def __init__(
        self,
        model: str,
        *,
        provider: str,
        base_url: str,
        api_key: str | None,
        api_key_env: str,
        headers: Mapping[str, str] | None,
        timeout: float | None,
        max_retries: int,
        backoff_base: float,
        http_client: httpx.AsyncClient | None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model must be a non-empty string, got {model!r}")
        self.model = model
        """The model name sent to the provider."""
        self.provider = provider
        """The provider label, the prefix of `name` (`openai`, `openrouter`, `anthropic`)."""
        self.base_url = base_url
        """Where requests go, in the vendor's own convention."""
        self.api_key_env = api_key_env
        """The environment variable the key is read from when `api_key` is not given."""
        self._api_key = api_key
        self._key_required = urlsplit(base_url).hostname in _HOSTED
        self._display = _DISPLAY.get(provider, provider)
        self._http = HttpClient(
            base_url=base_url,
            headers={"user-agent": "handrail", **(headers or {})},
            auth_headers=self._auth,
            context=self._error_context,
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            http_client=http_client,
        )

    @property
    def name(self) -> str:
        """The label recorded with runs: `<provider>:<model>`."""
        return f"{self.provider}:{self.model}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, base_url={self.base_url!r})"

    def _key(self) -> str | None:
        """The API key, read lazily so an agent can be built offline.

        Raises:
            ConfigError: a hosted endpoint and no key anywhere (before any request).
        """
        if self._api_key:
            return self._api_key
        key = os.environ.get(self.api_key_env) or None
        if key is None and self._key_required:
            raise ConfigError(
                f"{self._display} needs an API key for model '{self.model}': set the "
                f"{self.api_key_env} environment variable or pass api_key=... "
                "(no request was sent)"
            )
        return key

    def _auth_headers_for(self, key: str) -> dict[str, str]:
        raise NotImplementedError

    def _auth(self) -> Mapping[str, str]:
        key = self._key()
        return {} if key is None else self._auth_headers_for(key)

    def _error_context(self, url: str) -> ErrorContext:
        if self._api_key:
            advice = f"Check the api_key passed to {type(self).__name__}(...)."
        elif os.environ.get(self.api_key_env):
            advice = (
                f"Check {self.api_key_env}: {self._display} does not accept that key for "
                f"model '{self.model}'."
            )
        else:
            advice = f"No key was sent: set {self.api_key_env} or pass api_key=...."
        return ErrorContext(
            provider=self._display,
            model=self.model,
            url=url,
            auth_advice=advice,
            not_found_hint=self._not_found_hint,
        )

    async def aclose(self) -> None:
        """Close the HTTP connections this model opened in the running event loop."""
        await self._http.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class CallIds:
    """Tool-call ids of one response: the provider's, or invented when missing or repeated.

    Some compatible servers send an empty id, none at all, or the same id for every call; the
    gate needs one distinct id per call to pair each `ToolCall` with its result.
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def take(self, provider_id: Any) -> str:
        """The id to use for a call the provider labelled `provider_id`."""
        call_id = provider_id if isinstance(provider_id, str) and provider_id else None
        if call_id is None or call_id in self._seen:
            call_id = f"call_hr_{uuid.uuid4().hex}"
        self._seen.add(call_id)
        return call_id


def same_specs(cached: Sequence[ToolSpec] | None, tools: Sequence[ToolSpec]) -> bool:
    """Whether `tools` are the very spec objects converted last time (an agent reuses them)."""
    return (
        cached is not None
        and len(cached) == len(tools)
        and all(a is b for a, b in zip(cached, tools, strict=True))
    )


def unsupported_message(message: Any) -> UserError:
    """The error for a value in `messages` that is not one of the message types."""
    return UserError(
        f"cannot send {type(message).__name__} to a model: messages must be SystemMessage, "
        "UserMessage, AssistantMessage or ToolResultMessage"
    )


MALFORMED = (AttributeError, TypeError, KeyError, IndexError, ValueError, OverflowError)
"""What reading a response of an unexpected shape raises (a list where an object belongs...).

Caught only around response parsing, where it means the provider's answer is malformed."""


def malformed(provider: str, exc: Exception, body: Any = None) -> ModelResponseError:
    """The error for a response whose shape the parser could not follow."""
    return ModelResponseError(
        f"{provider} sent a response handrail could not understand "
        f"({type(exc).__name__}: {exc})",
        body=body,
    )


