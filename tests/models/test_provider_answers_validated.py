"""Every provider answer is checked: a malformed one is a ModelError, and the run ends Failed.

The story (issue 9 §6): `Retry-After: nan` escaped as a ValueError, a token count of `1e999`
as an OverflowError, and `1e300` reached the SQLite store, which failed: each left the run
`running`. And (issue 10 §5) a server that ignores `stream: true` and answers with plain JSON
was reported as "the stream ended before the response was complete ... retry".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from model_server import Reply, serve

import handrail as hr
from handrail.errors import ModelResponseError
from handrail.models import (
    Anthropic,
    ModelSettings,
    OpenAIChat,
    ResponseDone,
    TextDelta,
    ToolCallStart,
    UserMessage,
)
from handrail.models._http import parse_retry_after

pytestmark = pytest.mark.anyio

BAD_COUNTS = ["1e999", "-1e999", "NaN", "1e300", "-1", "1.5", '"12"', "true", "9007199254740993"]


def _openai_body(prompt_tokens: str) -> str:
    return ('{"choices": [{"message": {"role": "assistant", "content": "hi"}, '
            '"finish_reason": "stop"}], "usage": {"prompt_tokens": ' + prompt_tokens +
            ', "completion_tokens": 1}}')


def _anthropic_body(output_tokens: str) -> str:
    return ('{"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", '
            '"model": "c", "usage": {"input_tokens": 1, "output_tokens": ' + output_tokens + "}}")


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999", "infinity"])
def test_a_retry_after_that_is_not_finite_is_ignored(value: str) -> None:
    assert parse_retry_after({"retry-after": value}) is None
    assert parse_retry_after({"retry-after-ms": value}) is None
    assert parse_retry_after({"retry-after-ms": value, "retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "-5"}) == 0.0


async def test_a_nan_retry_after_falls_back_to_our_own_backoff() -> None:
    replies = [Reply(429, {"error": {"message": "slow"}}, headers={"retry-after": "nan"}),
               Reply(200, _openai_body("3"))]
    async with serve(replies) as server:
        model = OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k", backoff_base=0.01)
        sleeps: list[float] = []

        async def record(seconds: float) -> None:
            sleeps.append(seconds)

        model._http.sleep = record
        async with model:
            response = await model.request([UserMessage("hi")], [])
    assert response.message.text == "hi"
    assert len(sleeps) == 1 and 0 <= sleeps[0] <= 0.01


@pytest.mark.parametrize("count", BAD_COUNTS)
async def test_an_impossible_openai_token_count_is_a_model_error(count: str) -> None:
    async with serve([Reply(200, _openai_body(count))]) as server:
        async with OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k") as model:
            with pytest.raises(ModelResponseError, match="prompt_tokens"):
                await model.request([UserMessage("hi")], [])


@pytest.mark.parametrize("count", BAD_COUNTS)
async def test_an_impossible_streamed_openai_token_count_is_a_model_error(count: str) -> None:
    body = ('data: {"choices": [{"index": 0, "delta": {"content": "hi"}, '
            '"finish_reason": "stop"}]}\n\n'
            'data: {"choices": [], "usage": {"prompt_tokens": ' + count +
            ', "completion_tokens": 1}}\n\ndata: [DONE]\n\n')
    async with serve([Reply(200, body, "text/event-stream")]) as server:
        async with OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k") as model:
            with pytest.raises(ModelResponseError, match="prompt_tokens"):
                async for _ in model.request_stream([UserMessage("hi")], []):
                    pass


@pytest.mark.parametrize("count", BAD_COUNTS)
async def test_an_impossible_anthropic_token_count_is_a_model_error(count: str) -> None:
    async with serve([Reply(200, _anthropic_body(count))]) as server:
        async with Anthropic("c", base_url=server.url, api_key="k") as model:
            with pytest.raises(ModelResponseError, match="output_tokens"):
                await model.request([UserMessage("hi")], [])


@pytest.mark.parametrize("index", ["1e999", "NaN", "-5"])
async def test_an_impossible_anthropic_block_index_is_a_model_error(index: str) -> None:
    body = ('event: message_start\ndata: {"type": "message_start", "message": {"model": "c", '
            '"usage": {"input_tokens": 1, "output_tokens": 0}}}\n\n'
            'event: content_block_start\ndata: {"type": "content_block_start", "index": ' +
            index + ', "content_block": {"type": "text", "text": ""}}\n\n')
    async with serve([Reply(200, body, "text/event-stream")]) as server:
        async with Anthropic("c", base_url=server.url, api_key="k") as model:
            with pytest.raises(ModelResponseError, match="index"):
                async for _ in model.request_stream([UserMessage("hi")], []):
                    pass


@pytest.mark.parametrize("count", ["1e300", "1e999"])
async def test_a_run_whose_model_answers_an_impossible_count_ends_failed(
        tmp_path: Path, count: str) -> None:
    async with serve([Reply(200, _openai_body(count))]) as server:
        model = OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k", max_retries=0)
        async with hr.Store.open(tmp_path / "runs.db") as store:
            async with model:
                result = await hr.Agent(model, []).run("hi", store=store)
            assert isinstance(result.outcome, hr.Failed)
            assert "prompt_tokens" in result.outcome.error
            run = await store.run(result.run_id)
            assert run.status is hr.RunStatus.FAILED and run.outcome is not None
            assert run.outcome["kind"] == "failed" and run.input_tokens == 0


async def test_any_model_reporting_an_impossible_usage_fails_the_run(tmp_path: Path) -> None:
    class Liar:
        name = "liar"

        async def request(self, messages: Any, tools: Any, settings: Any = None
                          ) -> hr.models.ModelResponse:
            return hr.models.ModelResponse(
                hr.models.AssistantMessage((hr.models.TextPart("hi"),)),
                hr.models.Usage(10**300, 1))

    async with hr.Store.open(tmp_path / "runs.db") as store:
        result = await hr.Agent(Liar(), []).run("hi", store=store)  # type: ignore[arg-type]
        assert isinstance(result.outcome, hr.Failed) and "usage" in result.outcome.error
        assert (await store.run(result.run_id)).status is hr.RunStatus.FAILED


# ------------------------------------------------ a stream answered with JSON


async def test_openai_streamed_request_answered_with_json_is_the_answer() -> None:
    body = {"model": "m", "choices": [{"message": {
        "role": "assistant", "content": "hi",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    async with serve([Reply(200, body, "application/json; charset=utf-8")]) as server:
        async with OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k") as model:
            events = [e async for e in model.request_stream([UserMessage("hi")], [])]
    assert server.requests[0].json()["stream"] is True
    assert TextDelta("hi") in events and ToolCallStart("c1", "f") in events
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.message.text == "hi" and done.response.usage.input_tokens == 3


async def test_anthropic_streamed_request_answered_with_json_is_the_answer() -> None:
    async with serve([Reply(200, _anthropic_body("2"))]) as server:
        async with Anthropic("c", base_url=server.url, api_key="k") as model:
            events = [e async for e in model.request_stream([UserMessage("hi")], [])]
    assert events[0] == TextDelta("hi")
    done = events[-1]
    assert isinstance(done, ResponseDone) and done.response.usage.output_tokens == 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_stream_false_never_asks_the_server_to_stream(provider: str) -> None:
    body = _openai_body("3") if provider == "openai" else _anthropic_body("2")
    async with serve([Reply(200, body)]) as server:
        model: Any = (OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k")
                      if provider == "openai" else Anthropic("c", base_url=server.url,
                                                             api_key="k"))
        async with model:
            events = [e async for e in model.request_stream(
                [UserMessage("hi")], [], ModelSettings(stream=False))]
    assert "stream" not in server.requests[0].json()
    assert events[0] == TextDelta("hi") and isinstance(events[-1], ResponseDone)


@pytest.mark.parametrize("counts", [
    tuple(bad if i == at else 1 for i in range(3))
    for at in range(3) for bad in (2**53 + 1, -1, 0.5, True)])
async def test_every_count_of_a_usage_is_checked_at_its_bounds(counts: tuple[Any, ...]) -> None:
    # The loop's fast path for a well-formed Usage (issue 11) must refuse what provider_int
    # refuses: past 2**53, negative, fractional, a bool; each in every one of the 3 counts.
    class Liar:
        name = "liar"

        async def request(self, messages: Any, tools: Any, settings: Any = None
                          ) -> hr.models.ModelResponse:
            return hr.models.ModelResponse(
                hr.models.AssistantMessage((hr.models.TextPart("hi"),)),
                hr.models.Usage(*counts))

    result = await hr.Agent(Liar(), []).run("hi")  # type: ignore[arg-type]
    assert isinstance(result.outcome, hr.Failed) and "usage" in result.outcome.error


async def test_a_usage_at_the_largest_count_is_kept() -> None:
    class Big:
        name = "big"

        async def request(self, messages: Any, tools: Any, settings: Any = None
                          ) -> hr.models.ModelResponse:
            return hr.models.ModelResponse(
                hr.models.AssistantMessage((hr.models.TextPart("hi"),)),
                hr.models.Usage(2**53, 0, 1))

    result = await hr.Agent(Big(), []).run("hi")  # type: ignore[arg-type]
    assert result.output == "hi" and result.usage.input_tokens == 2**53
