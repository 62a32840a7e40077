"""The HTTP boundary shared by the model providers: requests, retries, SSE, error mapping.

Every failure that crosses this boundary becomes a `ModelError` in ONE place, `map_failure`:

| failure                                        | becomes              | retried |
|------------------------------------------------|----------------------|---------|
| HTTP 401, 403                                  | `ModelAuthError`     | no      |
| HTTP 404                                       | `ModelNotFound`      | no      |
| HTTP 408, 409, 429, 5xx (Anthropic's 529 too)  | `ModelUnavailable`   | yes     |
| any other HTTP 4xx (400, 413, 422, ...)        | `ModelRequestError`  | no      |
| timeouts, connect/read/write errors, proxy,    | `ModelUnavailable`   | yes     |
| a peer closing mid-response                    |                      |         |
| a bad URL, an unsupported scheme, a request    | `ModelRequestError`  | no      |
| httpx itself refuses to send                   |                      |         |
| undecodable bodies, redirect loops             | `ModelResponseError` | no      |

`ModelUnavailable` is exactly the retryable class. Retries use exponential backoff with jitter,
honour `Retry-After` / `retry-after-ms` (seconds or an HTTP date), and are bounded by
`max_retries`. A streamed request is retried only until its response headers arrive: once
events have been handed to the caller, a failure is raised, never replayed.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import math
import random
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pydantic_core
from anyio.lowlevel import RunVar

from handrail.errors import (
    ConfigError,
    ModelAuthError,
    ModelError,
    ModelNotFound,
    ModelRequestError,
    ModelResponseError,
    ModelUnavailable,
)

__all__ = [
    "EXCEPTION_MAP",
    "ErrorContext",
    "HttpClient",
    "JsonBody",
    "ServerSentEvent",
    "error_detail",
    "map_failure",
    "parse_retry_after",
]

EXCEPTION_MAP: Mapping[type[Exception], type[ModelError]] = {
    # Every httpx exception class, named explicitly so a new one in httpx is a decision
    # (tests/models/test_model_http.py checks the table covers them all).
    httpx.HTTPError: ModelUnavailable,
    httpx.RequestError: ModelUnavailable,
    httpx.TransportError: ModelUnavailable,
    httpx.TimeoutException: ModelUnavailable,
    httpx.ConnectTimeout: ModelUnavailable,
    httpx.ReadTimeout: ModelUnavailable,
    httpx.WriteTimeout: ModelUnavailable,
    httpx.PoolTimeout: ModelUnavailable,
    httpx.NetworkError: ModelUnavailable,
    httpx.ConnectError: ModelUnavailable,
    httpx.ReadError: ModelUnavailable,
    httpx.WriteError: ModelUnavailable,
    httpx.CloseError: ModelUnavailable,
    httpx.ProxyError: ModelUnavailable,
    httpx.ProtocolError: ModelUnavailable,
    httpx.RemoteProtocolError: ModelUnavailable,
    # Our own request was malformed by httpx's standards: sending it again cannot help.
    httpx.LocalProtocolError: ModelRequestError,
    httpx.UnsupportedProtocol: ModelRequestError,
    httpx.InvalidURL: ModelRequestError,
    httpx.DecodingError: ModelResponseError,
    httpx.TooManyRedirects: ModelResponseError,
    # Raised only by raise_for_status, which we never call; mapped by status if it appears.
    httpx.HTTPStatusError: ModelUnavailable,
}
"""httpx exception class -> the `ModelError` it becomes (looked up along the MRO)."""

_RETRYABLE_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorContext:
    """What an error message needs to say what happened and what to do."""

    provider: str
    """The provider's display name (`OpenAI`, `Anthropic`, `OpenRouter`)."""
    model: str
    """The model name sent."""
    url: str
    """The full URL requested."""
    auth_advice: str
    """What to do about a 401/403: which variable or argument holds the key."""
    not_found_hint: str = ""
    """Extra advice for a 404 (e.g. that an OpenAI-compatible base URL ends in /v1)."""


def error_detail(body: Any) -> str:
    """The provider's own error message from a response body, or the body itself."""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            kind = error.get("type") or error.get("code")
            return f"{error['message']} ({kind})" if isinstance(kind, str) else error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return str(body["message"])
    text = body if isinstance(body, str) else pydantic_core.to_json(body).decode()
    return text if len(text) <= 2000 else text[:2000] + "... (truncated)"


def _decode_body(response: httpx.Response) -> Any:
    try:
        return pydantic_core.from_json(response.content)
    except ValueError:
        return response.content.decode("utf-8", "replace")


def map_failure(failure: BaseException | httpx.Response, ctx: ErrorContext) -> ModelError:
    """Map an httpx exception or a non-2xx response to the `ModelError` it means.

    The one mapping of this boundary (see the module docstring's table). The caller raises
    the result `from` the original exception. A response must have been read.
    """
    if isinstance(failure, httpx.Response):
        return _map_status(failure, ctx)
    if isinstance(failure, httpx.HTTPStatusError):
        return _map_status(failure.response, ctx)
    cls = next((EXCEPTION_MAP[c] for c in type(failure).__mro__ if c in EXCEPTION_MAP), None)
    what = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
    if cls is None:
        raise TypeError(f"map_failure got {type(failure).__name__}, not an httpx failure")
    if cls is ModelUnavailable:
        verb = "timed out" if isinstance(failure, httpx.TimeoutException) else "failed"
        return ModelUnavailable(f"{ctx.provider} request to {ctx.url} {verb} ({what})")
    if cls is ModelRequestError:
        return ModelRequestError(
            f"could not send the request to {ctx.provider} at {ctx.url} ({what}); check base_url"
        )
    return ModelResponseError(f"{ctx.provider} sent a response that could not be read ({what})")


def _map_status(response: httpx.Response, ctx: ErrorContext) -> ModelError:
    status = response.status_code
    body = _decode_body(response)
    detail = error_detail(body)
    if status in (401, 403):
        return ModelAuthError(
            f"{ctx.provider} refused the request as unauthorised (HTTP {status}): {detail}. "
            f"{ctx.auth_advice}",
            status=status,
            body=body,
        )
    if status == 404:
        return ModelNotFound(
            f"{ctx.provider} does not know model '{ctx.model}' (HTTP 404 from {ctx.url}): "
            f"{detail}. Check the model name{ctx.not_found_hint}.",
            status=status,
            body=body,
        )
    if status in _RETRYABLE_STATUSES or status >= 500:
        what = "rate limited the request" if status == 429 else f"answered HTTP {status}"
        return ModelUnavailable(f"{ctx.provider} {what}: {detail}", status=status, body=body)
    return ModelRequestError(
        f"{ctx.provider} refused the request (HTTP {status}): {detail}", status=status, body=body
    )


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or HTTP date), or None.

    A value that is not a finite number (`nan`, `inf`, `1e999`) or a date is ignored, as if
    absent: the provider's hint is then replaced by our own backoff. A negative one is 0.
    """
    millis = _finite(headers.get("retry-after-ms"))
    if millis is not None:
        return max(millis / 1000.0, 0.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    try:
        wait = when.timestamp() - (time.time() if now is None else now)
    except (ValueError, OverflowError):  # a date no clock can reach
        return None
    return max(wait, 0.0) if math.isfinite(wait) else None


def _finite(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building a verifying context loads the CA bundle (~10-100 ms): do it once per process.
    return httpx.create_ssl_context()


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One SSE event: its `event:` name (empty when absent) and its joined `data:` lines."""

    event: str
    data: str


@dataclass(frozen=True, slots=True)
class JsonBody:
    """A streamed request answered with one JSON body (the server ignored `stream: true`)."""

    data: Any
    """The decoded body: what a non-streamed request returns."""


class HttpClient:
    """POSTs JSON to one provider, with retries, SSE streaming and the error map.

    One `httpx.AsyncClient` per event loop (a client's connections belong to the loop that
    opened them), unless the caller supplies its own client, which is used as is and never
    closed here.
    """

    def __init__(
        self,
        *,
        base_url: str,
        headers: Mapping[str, str],
        auth_headers: Callable[[], Mapping[str, str]],
        context: Callable[[str], ErrorContext],
        timeout: float | None,
        max_retries: int,
        backoff_base: float,
        backoff_max: float = 30.0,
        max_retry_after: float = 120.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url {base_url!r} must start with http:// or https://")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be 0 or more, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.headers = {"content-type": "application/json", **headers}
        self._auth_headers = auth_headers
        self._context = context
        self.timeout = httpx.Timeout(timeout, connect=None if timeout is None else min(timeout, 10))
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_after = max_retry_after
        self._external = http_client
        self._clients: RunVar[httpx.AsyncClient | None] = RunVar(
            f"handrail.models.http.{id(self)}", None
        )
        self.sleep: Callable[[float], Awaitable[None]] = anyio.sleep
        """How to wait between attempts (tests swap in a recorder)."""

    def _client(self) -> httpx.AsyncClient:
        if self._external is not None:
            return self._external
        client = self._clients.get()
        if client is None:
            client = httpx.AsyncClient(timeout=self.timeout, verify=_ssl_context())
            self._clients.set(client)
        return client

    async def aclose(self) -> None:
        """Close this event loop's client (a supplied client is left open)."""
        if self._external is not None:
            return
        client = self._clients.get()
        if client is not None:
            self._clients.set(None)
            await client.aclose()

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        if retry_after is not None:
            return retry_after
        ceiling = min(self.backoff_max, self.backoff_base * 2.0**attempt)
        return ceiling * random.uniform(0.5, 1.0)

    def _prepare(
        self, path: str, body: Mapping[str, Any] | bytes
    ) -> tuple[str, bytes, dict[str, str]]:
        # The key is resolved before anything is sent: a missing key is a ConfigError here.
        headers = {**self.headers, **self._auth_headers()}
        content = body if isinstance(body, bytes) else pydantic_core.to_json(body)
        return self.base_url + path, content, headers

    async def _retry_or_raise(
        self,
        error: ModelError,
        cause: BaseException | None,
        attempt: int,
        response: httpx.Response | None,
    ) -> None:
        """Sleep before the next attempt, or raise `error` when it is final."""
        if not isinstance(error, ModelUnavailable):
            raise error from cause
        retry_after = None if response is None else parse_retry_after(response.headers)
        if retry_after is not None and retry_after > self.max_retry_after:
            raise ModelUnavailable(
                f"{error} — the provider asks to wait {retry_after:.0f}s before retrying, more "
                f"than the {self.max_retry_after:.0f}s handrail waits; try again later",
                status=error.status,
                body=error.body,
            ) from cause
        if attempt >= self.max_retries:
            raise ModelUnavailable(
                f"{error} — gave up after {attempt + 1} attempt{'s' if attempt else ''}",
                status=error.status,
                body=error.body,
            ) from cause
        await self.sleep(self.backoff(attempt, retry_after))

    async def post_json(self, path: str, body: Mapping[str, Any] | bytes) -> Any:
        """POST `body` (a JSON object, or its encoding) and return the decoded JSON answer.

        Raises:
            ConfigError: no API key where one is required (nothing was sent).
            ModelError: the mapped failure, after retries for `ModelUnavailable`.
        """
        url, content, headers = self._prepare(path, body)
        ctx = self._context(url)
        client = self._client()
        attempt = 0
        while True:
            try:
                response = await client.post(url, content=content, headers=headers)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                await self._retry_or_raise(map_failure(exc, ctx), exc, attempt, None)
            else:
                if response.is_success:
                    try:
                        return pydantic_core.from_json(response.content)
                    except ValueError as exc:
                        raise ModelResponseError(
                            f"{ctx.provider} answered with a body that is not JSON: "
                            f"{error_detail(response.text)}",
                            status=response.status_code,
                        ) from exc
                await self._retry_or_raise(map_failure(response, ctx), None, attempt, response)
            attempt += 1

    async def stream_sse(
        self, path: str, body: Mapping[str, Any] | bytes
    ) -> AsyncGenerator[ServerSentEvent | JsonBody, None]:
        """POST `body` and yield the server-sent events of the answer.

        Retried like `post_json` until the response headers arrive; failures while reading
        the stream are mapped and raised. Ends when the server closes the stream: a caller
        checks its own end-of-message marker to detect truncation. A server that answers
        with a JSON content type instead of a stream yields one `JsonBody`.

        Raises:
            ConfigError: no API key where one is required (nothing was sent).
            ModelError: the mapped failure.
        """
        url, content, headers = self._prepare(path, body)
        headers["accept"] = "text/event-stream"
        ctx = self._context(url)
        client = self._client()
        attempt = 0
        while True:
            request = client.build_request("POST", url, content=content, headers=headers)
            try:
                response = await client.send(request, stream=True)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                await self._retry_or_raise(map_failure(exc, ctx), exc, attempt, None)
                attempt += 1
                continue
            try:
                if not response.is_success:
                    try:
                        await response.aread()
                    except httpx.HTTPError as exc:
                        error: ModelError = map_failure(exc, ctx)
                        cause: BaseException | None = exc
                    else:
                        error, cause = map_failure(response, ctx), None
                    await self._retry_or_raise(error, cause, attempt, response)
                    attempt += 1
                    continue
                content_type = response.headers.get("content-type", "").lower()
                if "json" in content_type and "event-stream" not in content_type:
                    try:
                        await response.aread()
                    except httpx.HTTPError as exc:
                        raise map_failure(exc, ctx) from exc
                    try:
                        data = pydantic_core.from_json(response.content)
                    except ValueError as exc:
                        raise ModelResponseError(
                            f"{ctx.provider} answered with a body that is not JSON: "
                            f"{error_detail(response.text)}",
                            status=response.status_code,
                        ) from exc
                    yield JsonBody(data)
                    return
                try:
                    async with contextlib.aclosing(_parse_sse(response.aiter_lines())) as events:
                        async for event in events:
                            yield event
                except httpx.HTTPError as exc:
                    raise map_failure(exc, ctx) from exc
                return
            finally:
                await response.aclose()


async def _parse_sse(lines: AsyncIterator[str]) -> AsyncGenerator[ServerSentEvent, None]:
    """Parse the SSE line protocol; an incomplete event at end of stream is dropped."""
    event = ""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield ServerSentEvent(event, "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
