"""The HTTP boundary: the error map, Retry-After, retries, timeouts, broken streams."""

from __future__ import annotations

import email.utils
import itertools
import time
from typing import Any

import anyio
import httpx
import pytest
from model_server import Reply, serve

from handrail.errors import (
    ConfigError,
    ModelAuthError,
    ModelError,
    ModelNotFound,
    ModelRequestError,
    ModelResponseError,
    ModelUnavailable,
)
from handrail.models import Anthropic, OpenAIChat, ResponseDone, TextDelta, UserMessage
from handrail.models._http import EXCEPTION_MAP, ErrorContext, map_failure, parse_retry_after

pytestmark = pytest.mark.anyio

CTX = ErrorContext(provider="OpenAI", model="gpt-x", url="http://h/v1/chat/completions",
                   auth_advice="Set OPENAI_API_KEY.")
OK = {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


def _all_subclasses(cls: type) -> set[type]:
    out = {cls}
    for sub in cls.__subclasses__():
        out |= _all_subclasses(sub)
    return out


def test_exception_map_names_every_httpx_exception() -> None:
    httpx_exceptions = {c for c in _all_subclasses(httpx.HTTPError) if c.__module__ == "httpx"}
    httpx_exceptions |= {c for c in vars(httpx).values()
                         if isinstance(c, type) and issubclass(c, httpx.InvalidURL)}
    missing = httpx_exceptions - set(EXCEPTION_MAP)
    assert not missing, f"decide how these map: {sorted(c.__name__ for c in missing)}"


@pytest.mark.parametrize("cls", sorted(EXCEPTION_MAP, key=lambda c: c.__name__))
def test_every_httpx_exception_maps_to_a_specific_model_error(cls: type[Exception]) -> None:
    request = httpx.Request("POST", "http://h/v1/chat/completions")
    if cls is httpx.HTTPStatusError:
        response = httpx.Response(503, request=request, json={"error": {"message": "down"}})
        exc: Exception = httpx.HTTPStatusError("x", request=request, response=response)
    elif issubclass(cls, httpx.RequestError):
        exc = cls("boom", request=request)
    else:
        exc = cls("boom")
    error = map_failure(exc, CTX)
    assert type(error) is EXCEPTION_MAP[cls]
    assert type(error) is not ModelError
    assert "OpenAI" in str(error)


def _response(status: int, body: Any = None, **headers: str) -> httpx.Response:
    request = httpx.Request("POST", "http://h/v1/chat/completions")
    return httpx.Response(status, json=body or {"error": {"message": "nope"}},
                          headers=headers, request=request)


@pytest.mark.parametrize("status", range(400, 600))
def test_every_error_status_maps(status: int) -> None:
    error = map_failure(_response(status), CTX)
    expected: type[ModelError]
    if status in (401, 403):
        expected = ModelAuthError
    elif status == 404:
        expected = ModelNotFound
    elif status in (408, 409, 429) or status >= 500:
        expected = ModelUnavailable
    else:
        expected = ModelRequestError
    assert type(error) is expected
    assert error.status == status
    assert "nope" in str(error)


def test_auth_error_says_what_to_do() -> None:
    error = map_failure(_response(401, {"error": {"message": "Incorrect API key"}}), CTX)
    assert "Incorrect API key" in str(error) and "OPENAI_API_KEY" in str(error)


def test_bad_request_shows_the_body() -> None:
    body = {"error": {"message": "Invalid schema for function 'x'", "type": "invalid_request"}}
    error = map_failure(_response(400, body), CTX)
    assert isinstance(error, ModelRequestError)
    assert "Invalid schema for function 'x'" in str(error)
    assert error.body == body


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30, abs=1)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# --- against a local server ---


def _openai(url: str, **kwargs: Any) -> OpenAIChat:
    # Only public options: how long the client waited between attempts is read off the
    # local server's arrival times, not by replacing its sleep.
    options: dict[str, Any] = {"backoff_base": 0.001, **kwargs}
    return OpenAIChat("gpt-x", base_url=f"{url}/v1", api_key="sk-test", **options)


def _gaps(server: Any) -> list[float]:
    at = [r.at for r in server.requests]
    return [b - a for a, b in itertools.pairwise(at)]


async def test_429_honours_retry_after_then_succeeds() -> None:
    # retry-after-ms wins over retry-after (seconds): the wait is 0.3 s, never 7 s.
    replies = [Reply(429, {"error": {"message": "slow down"}},
                     headers={"retry-after-ms": "300", "retry-after": "7"}),
               Reply(200, OK)]
    async with serve(replies) as server:
        async with _openai(server.url) as model:
            response = await model.request([UserMessage("hi")], [])
    assert response.message.text == "hi"
    assert len(server.requests) == 2
    (gap,) = _gaps(server)
    assert 0.3 <= gap < 6.5


async def test_5xx_retried_with_exponential_backoff_and_jitter() -> None:
    replies = [Reply(500, {"error": {"message": "oops"}}), Reply(502, "bad gateway", "text/html"),
               Reply(503, {}), Reply(200, OK)]
    async with serve(replies) as server:
        async with _openai(server.url, backoff_base=0.1) as model:
            response = await model.request([UserMessage("hi")], [])
    assert response.usage.input_tokens == 3
    gaps = _gaps(server)
    assert len(gaps) == 3
    for attempt, gap in enumerate(gaps):
        # Jitter keeps each wait within [half, all] of base * 2**attempt; only the lower
        # bound is exact on a loaded machine (a late wake-up only adds).
        assert 0.05 * 2**attempt <= gap


async def test_retries_are_bounded() -> None:
    async with serve([Reply(503, {"error": {"message": "overloaded"}})] * 5) as server:
        async with _openai(server.url, max_retries=2) as model:
            with pytest.raises(ModelUnavailable, match="gave up after 3 attempts") as info:
                await model.request([UserMessage("hi")], [])
    assert info.value.status == 503
    assert "overloaded" in str(info.value)
    assert len(server.requests) == 3


async def test_retry_after_beyond_the_limit_fails_at_once() -> None:
    replies = [Reply(429, {"error": {"message": "quota"}}, headers={"retry-after": "3600"})]
    async with serve(replies) as server:
        async with _openai(server.url) as model:
            with anyio.fail_after(30):  # at once: never the hour it asks for
                with pytest.raises(ModelUnavailable, match="asks to wait 3600s"):
                    await model.request([UserMessage("hi")], [])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "error", "words"),
    [
        (401, ModelAuthError, ["OPENAI_API_KEY", "bad key"]),
        (403, ModelAuthError, ["OPENAI_API_KEY"]),
        (404, ModelNotFound, ["gpt-x", "/v1"]),
        (400, ModelRequestError, ["bad key"]),
        (422, ModelRequestError, ["bad key"]),
    ],
)
async def test_client_errors_are_not_retried(
    status: int, error: type[ModelError], words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    async with serve([Reply(status, {"error": {"message": "bad key"}})]) as server:
        async with OpenAIChat("gpt-x", base_url=f"{server.url}/v1") as model:
            with pytest.raises(error) as info:
                await model.request([UserMessage("hi")], [])
    for word in words:
        assert word in str(info.value)
    assert len(server.requests) == 1
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_timeouts_are_retried_then_reported() -> None:
    async with serve([Reply(mode="hang"), Reply(mode="hang")]) as server:
        async with _openai(server.url, timeout=0.2, max_retries=1) as model:
            with pytest.raises(ModelUnavailable, match="timed out") as info:
                await model.request([UserMessage("hi")], [])
    assert isinstance(info.value.__cause__, httpx.TimeoutException)
    assert len(server.requests) == 2


async def test_connection_refused_is_retried_then_reported() -> None:
    async with serve([]) as server:
        url = server.url
    async with _openai(url, max_retries=2) as model:
        with pytest.raises(ModelUnavailable, match="gave up after 3 attempts") as info:
            await model.request([UserMessage("hi")], [])
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_body_that_is_not_json() -> None:
    async with serve([Reply(200, "<html>proxy login</html>", "text/html")]) as server:
        async with _openai(server.url) as model:
            with pytest.raises(ModelResponseError, match="proxy login"):
                await model.request([UserMessage("hi")], [])


async def test_body_cut_mid_transfer_is_retried() -> None:
    async with serve([Reply(200, OK, mode="broken_chunked"), Reply(200, OK)]) as server:
        async with _openai(server.url) as model:
            response = await model.request([UserMessage("hi")], [])
    assert response.message.text == "hi" and len(server.requests) == 2


SSE_TEXT = (
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\n\n'
    'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    "data: [DONE]\n\n"
)


async def test_stream_retried_before_the_first_event() -> None:
    replies = [Reply(429, {"error": {"message": "slow"}}, headers={"retry-after": "0"}),
               Reply(200, SSE_TEXT, "text/event-stream")]
    async with serve(replies) as server:
        async with _openai(server.url) as model:
            events = [e async for e in model.request_stream([UserMessage("hi")], [])]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo"]
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.message.text == "Hello"
    assert (done.response.usage.input_tokens, done.response.usage.output_tokens) == (4, 2)
    assert len(server.requests) == 2


@pytest.mark.parametrize("mode", ["broken_chunked", "early_eof"])
async def test_truncated_stream_is_an_error_not_a_short_answer(mode: Any) -> None:
    async with serve([Reply(200, SSE_TEXT, "text/event-stream", mode=mode)]) as server:
        async with _openai(server.url) as model:
            seen: list[Any] = []
            with pytest.raises(ModelUnavailable):
                async for event in model.request_stream([UserMessage("hi")], []):
                    seen.append(event)
    assert not any(isinstance(e, ResponseDone) for e in seen)


async def test_stream_client_error_is_mapped() -> None:
    async with serve([Reply(404, {"error": {"message": "no such model"}})]) as server:
        async with _openai(server.url) as model:
            with pytest.raises(ModelNotFound, match="no such model"):
                async for _ in model.request_stream([UserMessage("hi")], []):
                    pass


async def test_anthropic_overloaded_529_is_retried() -> None:
    ok = {"content": [{"type": "text", "text": "fine"}], "stop_reason": "end_turn",
          "usage": {"input_tokens": 1, "output_tokens": 1}}
    replies = [Reply(529, {"type": "error", "error": {"type": "overloaded_error",
                                                      "message": "Overloaded"}}),
               Reply(200, ok)]
    async with serve(replies) as server:
        async with Anthropic("claude-x", base_url=server.url, api_key="k",
                             backoff_base=0.001) as model:
            response = await model.request([UserMessage("hi")], [])
    assert response.message.text == "fine" and len(server.requests) == 2


async def test_missing_key_fails_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=OK)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        openai = OpenAIChat("gpt-4.1-mini", http_client=client)  # constructing needs no key
        with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
            await openai.request([UserMessage("hi")], [])
        with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
            async for _ in openai.request_stream([UserMessage("hi")], []):
                pass
        anthropic = Anthropic("claude-sonnet-4-5", http_client=client)
        with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
            await anthropic.request([UserMessage("hi")], [])
    assert sent == []


async def test_self_hosted_server_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with serve([Reply(200, OK)]) as server:
        async with OpenAIChat("qwen3", base_url=f"{server.url}/v1") as model:
            await model.request([UserMessage("hi")], [])
    assert "authorization" not in server.requests[0].headers


def test_bad_base_url() -> None:
    with pytest.raises(ConfigError, match="http:// or https://"):
        OpenAIChat("m", base_url="localhost:11434/v1")


def test_one_model_serves_several_event_loops() -> None:
    # `run_sync` style: each call gets its own event loop; a client is per loop.
    import gc
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import anyio

    body = json.dumps(OK).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        model = OpenAIChat("m", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1")

        async def once() -> str:
            return (await model.request([UserMessage("x")], [])).message.text

        assert anyio.run(once) == "hi"
        assert anyio.run(once) == "hi"
        gc.collect()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("body", [
    {"choices": ["not an object"]},
    {"choices": [{"message": {"tool_calls": [{"function": "get"}]}}]},
    [1, 2],
    {"nothing": True},
])
async def test_malformed_openai_response_is_a_model_response_error(body: Any) -> None:
    async with serve([Reply(200, body)]) as server:
        async with _openai(server.url) as model:
            with pytest.raises(ModelResponseError, match="OpenAI"):
                await model.request([UserMessage("hi")], [])


@pytest.mark.parametrize("body", [
    'data: {"choices":[{"delta":"x"}]}\n\n',
    "data: {not json\n\n",
])
async def test_malformed_stream_is_a_model_response_error(body: str) -> None:
    async with serve([Reply(200, body, "text/event-stream")]) as server:
        async with _openai(server.url) as model:
            with pytest.raises(ModelResponseError):
                async for _ in model.request_stream([UserMessage("hi")], []):
                    pass


async def test_malformed_anthropic_response_is_a_model_response_error() -> None:
    async with serve([Reply(200, {"content": [{"type": "tool_use", "input": []}, 7]})]) as server:
        async with Anthropic("c", base_url=server.url, api_key="k") as model:
            with pytest.raises(ModelResponseError, match="Anthropic"):
                await model.request([UserMessage("hi")], [])


async def test_stopping_a_stream_early_releases_the_connection() -> None:
    import contextlib

    replies = [Reply(200, SSE_TEXT, "text/event-stream"), Reply(200, OK)]
    async with serve(replies) as server:
        async with _openai(server.url) as model:
            async with contextlib.aclosing(
                model.request_stream([UserMessage("hi")], [])
            ) as events:
                async for event in events:
                    assert isinstance(event, TextDelta)
                    break
            response = await model.request([UserMessage("again")], [])
    assert response.message.text == "hi" and len(server.requests) == 2
