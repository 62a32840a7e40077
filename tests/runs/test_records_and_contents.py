"""Records and contents: a write's bytes are stored only while the write may still happen.

While a call may be performed (an approval pending, in flight, in doubt) its records keep the
exact arguments: it is performed exactly as approved after a process exit. Once it is
performed, denied or refused, every stored copy of the content becomes a
`{"sha256": ..., "bytes": N}` marker; `record_contents="full"` keeps the bytes (recorded).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.models import AssistantMessage, Scripted, ToolCall, Turn, call, reply

pytestmark = pytest.mark.anyio

SECRET = "the exact bytes of the draft, written once"
MARKER = {"sha256": hashlib.sha256(SECRET.encode()).hexdigest(), "bytes": len(SECRET)}


def stored(db: Path) -> str:
    """Everything the SQLite file holds, as text."""
    con = sqlite3.connect(db)
    try:
        return "\n".join(repr(con.execute(f"SELECT * FROM {t}").fetchall())
                         for t in ("runs", "messages", "calls", "pending"))
    finally:
        con.close()


def seen_calls(into: list[list[ToolCall]]) -> Any:
    """A model turn that notes the calls it is shown from its history, then answers."""
    def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        into.append([p for m in messages if isinstance(m, AssistantMessage)
                     for p in m.tool_calls])
        return reply("done")

    return turn


def build(ws: Path, *turns: Any, policy: hr.Policy | None = None, **kw: Any) -> hr.Agent:
    return hr.Agent(Scripted(list(turns)), hr.builtin.workspace_tools(), workspace=ws,
                    policy=policy, **kw)


WRITE = call("workspace/write_file", {"path": "draft.md", "content": SECRET})


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


async def test_a_deferred_write_keeps_its_bytes_until_performed_then_only_markers(
        tmp_path: Path, ws: Path) -> None:
    db = tmp_path / "runs.db"
    shown: list[list[ToolCall]] = []
    async with hr.Store.open(db) as store:
        paused = await build(ws, WRITE, seen_calls(shown)).run("write", store=store)
        assert isinstance(paused.outcome, hr.AwaitingApproval)
    # Pending: the exact content is kept, so another process performs exactly what was asked.
    assert SECRET in stored(db)
    async with hr.Store.open(db) as store:
        done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                             hr.Decision.approve(),
                                             agent=build(ws, WRITE, seen_calls(shown)))
        assert done.outcome == hr.Completed("done")
        (record,) = await store.calls(paused.run_id)
        item = await store.pending_item(paused.outcome.request_id)
        messages = await store.messages(paused.run_id)
    assert (ws / "draft.md").read_text() == SECRET
    assert SECRET not in stored(db)
    assert record.performed_arguments == {"path": "draft.md", "content": MARKER}
    assert json.loads(record.arguments) == {"path": "draft.md", "content": MARKER}
    assert record.arguments_digest is not None  # the digest of what was performed stays
    assert (item.payload["content"], item.payload["content_sha256"],
            item.payload["content_bytes"]) == (None, MARKER["sha256"], MARKER["bytes"])
    assert item.payload["arguments"] == {"path": "draft.md", "content": MARKER}
    (part,) = [p for m in messages if m["kind"] == "assistant" for p in m["parts"]
               if p["kind"] == "tool_call"]
    assert json.loads(part["arguments"]) == {"path": "draft.md", "content": MARKER}
    # The resumed run showed the model its own earlier call, with the marker.
    assert [json.loads(c.arguments) for c in shown[-1]] == [
        {"path": "draft.md", "content": MARKER}]


async def test_an_allowed_write_keeps_no_bytes_once_the_turn_ends(tmp_path: Path,
                                                                   ws: Path) -> None:
    db = tmp_path / "runs.db"
    allow = hr.Policy.default().layer("app").allow(hr.Act.WRITE, "*.md")
    async with hr.Store.open(db) as store:
        done = await build(ws, WRITE, reply("ok"), policy=allow).run("w", store=store)
    assert done.outcome == hr.Completed("ok") and (ws / "draft.md").read_text() == SECRET
    assert SECRET not in stored(db)


@pytest.mark.parametrize("how", ["policy", "operator-now", "operator-later"])
async def test_a_refused_or_denied_write_keeps_no_bytes_anywhere(tmp_path: Path, ws: Path,
                                                                 how: str) -> None:
    db = tmp_path / "runs.db"
    shown: list[list[ToolCall]] = []
    deny = hr.Policy.default().layer("app").deny(hr.Act.WRITE, "*.md")
    async with hr.Store.open(db) as store:
        if how == "policy":
            done = await build(ws, WRITE, seen_calls(shown), policy=deny).run("w", store=store)
        else:
            paused = await build(ws, WRITE, seen_calls(shown)).run("w", store=store)
            assert isinstance(paused.outcome, hr.AwaitingApproval)
            if how == "operator-now":  # an approver at resume is asked, and denies
                done = await hr.resume(store, paused.run_id, agent=build(
                    ws, WRITE, seen_calls(shown)), approver=hr.DenyAll())
            else:
                done = await hr.resume_with_decision(
                    store, paused.outcome.request_id, hr.Decision.deny("no"),
                    agent=build(ws, WRITE, seen_calls(shown)))
        assert done.outcome == hr.Completed("done")
        (record,) = await store.calls(done.run_id)
        messages = await store.messages(done.run_id)
    assert record.status is hr.CallStatus.REFUSED
    assert not (ws / "draft.md").exists()
    assert SECRET not in stored(db)
    (part,) = [p for m in messages if m["kind"] == "assistant" for p in m["parts"]
               if p["kind"] == "tool_call"]
    kept = json.loads(part["arguments"])
    assert kept["redacted"] and kept["bytes"] > len(SECRET)  # the whole arguments' size


CRASH: list[bool] = []


class Draft(hr.Tool, server="docs", name="draft"):
    """Write a draft (its process dies mid-write while CRASH holds True)."""

    path: str
    content: str

    def actions(self) -> list[hr.Action]:
        return [hr.Action(hr.Act.WRITE, self.path, content=self.content.encode())]

    async def run(self, ctx: hr.CallContext) -> str:
        if CRASH:
            raise KeyboardInterrupt  # not a tool failure: it tears the runner down
        (ctx.workspace / self.path).write_text(self.content)
        return "written"


async def test_a_call_in_doubt_keeps_its_bytes_until_the_operator_decides(
        tmp_path: Path, ws: Path) -> None:
    db = tmp_path / "runs.db"
    draft = call("docs/draft", {"path": "draft.md", "content": SECRET})

    def agent() -> hr.Agent:
        return hr.Agent(Scripted([draft, reply("ok")]), [Draft], workspace=ws)

    async with hr.Store.open(db) as store:
        paused = await agent().run("w", store=store)
        assert isinstance(paused.outcome, hr.AwaitingApproval)
        CRASH.append(True)
        try:
            with pytest.raises(KeyboardInterrupt):
                await hr.resume_with_decision(store, paused.outcome.request_id,
                                              hr.Decision.approve(), agent=agent())
        finally:
            CRASH.clear()
        # Applied, the approval no longer holds the bytes; the call record does (a retry
        # performs them exactly).
        approval = await store.pending_item(paused.outcome.request_id)
        assert approval.payload["content"] is None
        (record,) = await store.calls(paused.run_id)
        # The interrupt was seen: the call is recorded in doubt (a hard crash leaves STARTED;
        # either way a resume puts it to an operator).
        assert record.status is hr.CallStatus.IN_DOUBT
        assert record.performed_arguments == {"path": "draft.md", "content": SECRET}
        doubt = await hr.resume(store, paused.run_id, agent=agent())
        assert isinstance(doubt.outcome, hr.AwaitingRecovery)
        (item,) = await store.pending(kind="recovery")
        assert item.payload["arguments"]["content"] == SECRET
        done = await hr.resume_with_recovery(store, doubt.outcome.call_id, hr.Recovery.retry(),
                                             agent=agent(), approver=hr.ApproveAll())
        assert done.outcome == hr.Completed("ok")
        recovered = await store.pending_item(doubt.outcome.call_id)
    assert (ws / "draft.md").read_text() == SECRET
    assert recovered.payload["arguments"]["content"] == MARKER
    assert SECRET not in stored(db)


async def test_record_contents_full_keeps_the_bytes_and_says_so(tmp_path: Path,
                                                                ws: Path) -> None:
    db = tmp_path / "runs.db"
    async with hr.Store.open(db) as store:
        paused = await build(ws, WRITE, reply("ok"), record_contents="full").run(
            "w", store=store)
        assert isinstance(paused.outcome, hr.AwaitingApproval)
        started = await store.run(paused.run_id)
        assert [e["mode"] for e in started.events if e["kind"] == "record_contents"] == ["full"]
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=build(ws, WRITE, reply("ok"),
                                                  record_contents="full"))
        (record,) = await store.calls(paused.run_id)
        run = await store.run(paused.run_id)
    assert record.performed_arguments == {"path": "draft.md", "content": SECRET}
    assert [e["mode"] for e in run.events if e["kind"] == "record_contents"] == ["full"]
    with pytest.raises(hr.UserError, match="record_contents"):
        build(ws, record_contents="bytes")  # type: ignore[arg-type]


async def test_the_arguments_digest_is_sha256_of_the_canonical_json() -> None:
    # Keys sorted at every depth, compact separators, non-ASCII kept as is: the same
    # arguments give the same digest whatever order the model wrote them in (issue 11 made
    # the encoding faster; these bytes are what it must keep producing).
    box = hr.Toolbox([hr.SchemaTool(
        hr.ToolSpec(hr.ToolId("local", "note"), "Note.", {"type": "object"}, mutates=False),
        lambda args: hr.ToolResult.text("ok"))])
    given = ['{"z": {"b": [1, 2.5, {"y": null, "x": "é\\u2028"}], "a": true}, "a": 1e300}',
             '{"a": 1e300, "z": {"a": true, "b": [1, 2.5, {"x": "é\\u2028", "y": null}]}}']
    agent = hr.Agent(Scripted([Turn(tool_calls=(("note", given[0]), ("note", given[1]))),
                               reply("done")]), box, policy=hr.Policy.default())
    store = hr.Store.memory()
    result = await agent.run("go", store=store)
    records = await store.calls(result.run_id)
    canonical = json.dumps(json.loads(given[0]), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    expected = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert [r.arguments_digest for r in records] == [expected, expected]
