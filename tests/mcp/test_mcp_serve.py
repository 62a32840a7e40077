"""`handrail serve --stdio` driven by the official `mcp` Python client, approvals from another
process (`handrail approve`), and exactly-once after approval."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_servers import FIXTURE_SERVER, Served, serve, text
from serve_tools import MANIFEST

import handrail as hr

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
async def patient(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """A server that waits up to 60 s for an approval."""
    async with serve(tmp_path_factory.mktemp("patient"), "serve_tools:box",
                     "--approval-timeout", "60", manifest=MANIFEST) as s:
        yield s


@pytest.fixture(scope="module")
async def hasty(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """A server that waits only 0.5 s, then tells the client the call awaits approval."""
    async with serve(tmp_path_factory.mktemp("hasty"), "serve_tools:box",
                     "--approval-timeout", "0.5", manifest=MANIFEST) as s:
        yield s



async def test_tools_list_shows_the_grants_with_the_manifests_descriptions(
        patient: Served) -> None:
    tools = {t.name: t for t in (await patient.session.list_tools()).tools}
    assert set(tools) == {"add", "launch", "secret", "greet"}
    assert tools["add"].description == "Add two integers."
    assert tools["add"].annotations is not None and tools["add"].annotations.read_only_hint
    assert tools["launch"].annotations is not None
    assert not tools["launch"].annotations.read_only_hint


async def test_a_call_passes_the_gate_and_is_recorded_in_the_sessions_run(
        patient: Served) -> None:
    result = await patient.call("add", {"a": 2, "b": 3})
    assert not result.is_error and text(result) == "5"
    bad = await patient.call("add", {"a": "two", "b": 3})
    assert bad.is_error and "$.a" in text(bad)
    denied = await patient.call("secret", {})
    assert denied.is_error and text(denied) == hr.PolicyDenied.MODEL_MESSAGE
    unknown = await patient.call("nope", {})
    assert unknown.is_error and "no tool named" in text(unknown)
    listed = await patient.cli("runs", "--json")
    assert "MCP session of" in listed
    store = hr.Store.open(str(patient.store_path))
    try:
        [run] = await store.runs()
        records = await store.calls(run.id)
    finally:
        await store.close()
    assert [(r.tool, r.status.value) for r in records[:3]] == [
        ("local/add", "finished"), ("local/add", "refused"), ("local/secret", "refused")]
    shown = await patient.cli("show", run.id)
    assert "local/add" in shown and "result: 5" in shown and "local/secret" in shown


async def test_a_call_that_asks_waits_for_handrail_approve_and_runs_once(
        patient: Served) -> None:
    known = {p.id for p in await patient.pending()}
    async with anyio.create_task_group() as tg:
        box: list[Any] = []

        async def client() -> None:
            box.append(await patient.call("launch", {"target": "moon"}))

        tg.start_soon(client)
        item = await patient.wait_pending("local/launch", known)
        assert patient.launched() == []  # nothing ran while it waited
        await patient.cli("approve", item.id)
    [result] = box
    assert not result.is_error, text(result)
    assert text(result) == "launched moon"
    assert patient.launched() == ["moon"]


async def test_past_the_timeout_the_client_is_told_and_the_retry_runs_exactly_once(
        hasty: Served) -> None:
    first = await hasty.call("launch", {"target": "mars"})
    assert first.is_error
    assert text(first).startswith("awaiting approval: request ap-")
    request_id = text(first).rpartition(" ")[2]
    # The same call again, still undecided: the same request, still waiting, nothing ran.
    again = await hasty.call("launch", {"target": "mars"})
    assert text(again) == f"awaiting approval: request {request_id}"
    assert [p.id for p in await hasty.pending()] == [request_id]
    said = await hasty.cli("approve", request_id)
    # Nothing to resume: the gateway's call goes on in the server (issue 36).
    assert "the MCP client's call goes on by itself" in said and "resume" not in said
    assert hasty.launched() == []  # approving records; the call runs in the server
    done = await hasty.call("launch", {"target": "mars"})
    assert not done.is_error and text(done) == "launched mars"
    assert hasty.launched() == ["mars"]
    # A later identical call is a new call: it asks again rather than reusing the approval.
    later = await hasty.call("launch", {"target": "mars"})
    assert text(later).startswith("awaiting approval: request ap-")
    assert text(later) != f"awaiting approval: request {request_id}"
    assert hasty.launched() == ["mars"]


async def test_other_arguments_are_another_call_and_a_denial_reason_reaches_the_client(
        hasty: Served) -> None:
    first = await hasty.call("launch", {"target": "venus"})
    other = await hasty.call("launch", {"target": "pluto"})
    first_id, other_id = text(first).rpartition(" ")[2], text(other).rpartition(" ")[2]
    assert first_id != other_id
    await hasty.cli("deny", other_id, "--reason", "not pluto")
    denied = await hasty.call("launch", {"target": "pluto"})
    assert denied.is_error and "not pluto" in text(denied)
    assert "pluto" not in hasty.launched()


async def test_two_identical_retries_at_once_perform_the_approved_call_once(
        hasty: Served) -> None:
    first = await hasty.call("launch", {"target": "io"})
    request_id = text(first).rpartition(" ")[2]
    await hasty.cli("approve", request_id)
    answers: list[str] = []

    async def retry() -> None:
        answers.append(text(await hasty.call("launch", {"target": "io"})))

    async with anyio.create_task_group() as tg:
        tg.start_soon(retry)
        tg.start_soon(retry)
    assert hasty.launched().count("io") == 1
    assert sorted(a.startswith("awaiting approval") for a in answers) == [False, True]
    assert "launched io" in answers


async def test_a_tool_that_asks_waits_for_handrail_answer_and_the_retry_gets_it(
        hasty: Served) -> None:
    first = await hasty.call("greet", {"name": "Ada"})
    assert first.is_error and text(first).startswith("awaiting an answer: question q-")
    question_id = text(first).rpartition(" ")[2]
    await hasty.cli("answer", question_id, "Hello")
    done = await hasty.call("greet", {"name": "Ada"})
    assert not done.is_error and text(done) == "Hello, Ada"


UPSTREAM = """
[[tools]]
ref = "fx/die"
description = "Die."

[[tools]]
ref = "fx/echo"
description = "Echo."

[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{python} {server}", "call:fx/*"]

[[servers]]
name = "fx"
names = "prefixed"            # shown as models see them (issue 36: default upstream)
command = "{python}"
args = ["{server}"]
"""


async def test_an_upstream_servers_restart_is_an_event_of_the_sessions_run(
        tmp_path: Path) -> None:
    manifest = UPSTREAM.format(python=sys.executable, server=FIXTURE_SERVER)
    async with serve(tmp_path, manifest=manifest) as served:
        died = await served.call("fx--die", {})
        assert died.is_error and "may have partly taken effect" in text(died)
        back = await served.call("fx--echo", {"text": "back"})
        assert text(back) == "back"
    store = hr.Store.open(str(served.store_path))
    try:
        [run] = await store.runs()
    finally:
        await store.close()
    # The session's run records its governance first (issue 32), that it is an MCP client's
    # session (issue 36), then what happened.
    assert [e["kind"] for e in run.events] == ["governance", "mcp_session",
                                               "mcp_server_restarted"]
    assert "dying on purpose" in run.events[2]["stderr_tail"]


async def test_serve_client_approval_puts_an_ask_to_the_clients_user(tmp_path: Path) -> None:
    import mcp_types as t

    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> t.ElicitResult:
        asked.append(params.message)
        return t.ElicitResult(action="accept", content={"approve": True})

    async with serve(tmp_path, "serve_tools:box", "--approval-timeout", "30",
                     "--client-approval", "call", manifest=MANIFEST,
                     elicitation_callback=elicit) as served:
        result = await served.call("launch", {"target": "moon"})
        assert not result.is_error, text(result)
        assert served.launched() == ["moon"]
        assert await served.pending() == []
    assert len(asked) == 1 and "local/launch" in asked[0]
