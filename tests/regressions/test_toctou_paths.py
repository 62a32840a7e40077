"""A path is decided and used as one thing (issue 9 §1).

The story: the calls of a turn were all checked first and performed afterwards, concurrently,
and each tool body resolved its path again. One turn holding an allowed
`exec ["ln", "-s", "../.env", "notes/a"]` and an allowed `write_file notes/a` overwrote `.env`
(the same with `read_file` returned its contents), while the record said "write notes/a,
allow". Now effects happen in call order (a mutating call after every call before it), each
path is canonicalised again at its moment of use and the call is refused, not sent, if it
leads elsewhere; the body opens exactly the canonical path, never following a symlink.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.models import Scripted, ToolResultMessage, Turn, calls, reply
from handrail.tools import as_impl

pytestmark = pytest.mark.anyio


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / ".env").write_text("API_KEY=hunter2\n")
    return ws


def seen_into(into: list[ToolResultMessage]) -> Any:
    def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        into.extend(m for m in messages if isinstance(m, ToolResultMessage))
        return reply("done")

    return turn


async def run_turn(workspace: Path, items: list[tuple[str, dict[str, Any]]],
                   tools: Any = None, policy: hr.Policy | None = None,
                   ) -> tuple[list[ToolResultMessage], list[hr.CallRecord]]:
    seen: list[ToolResultMessage] = []
    store = hr.Store.memory()
    agent = hr.Agent(Scripted([calls(items), seen_into(seen)]),
                     tools if tools is not None else workspace_tools(),
                     policy=policy or hr.Policy.permissive(), workspace=workspace)
    with anyio.fail_after(30):
        result = await agent.run("go", store=store)
    assert isinstance(result.outcome, hr.Completed)
    return seen, await store.calls(result.run_id)


def text(message: ToolResultMessage) -> str:
    return "".join(getattr(c, "text", "") for c in message.result.content)


async def test_a_symlink_planted_by_an_earlier_call_of_the_turn_is_not_written_through(
    workspace: Path,
) -> None:
    seen, records = await run_turn(workspace, [
        ("workspace/exec", {"argv": ["ln", "-s", "../.env", "notes/a"]}),
        ("workspace/write_file", {"path": "notes/a", "content": "PWNED\n"}),
    ])
    assert (workspace / ".env").read_text() == "API_KEY=hunter2\n"
    assert (workspace / "notes" / "a").is_symlink()  # the exec ran first, in call order
    write = records[1]
    assert write.status is hr.CallStatus.REFUSED
    assert write.disposition == hr.Disposition.NOT_SENT.value
    assert seen[1].result.is_error
    assert "was checked as 'notes/a' but now leads to '.env'" in text(seen[1])


async def test_a_symlink_planted_by_an_earlier_call_of_the_turn_is_not_read_through(
    workspace: Path,
) -> None:
    seen, records = await run_turn(workspace, [
        ("workspace/exec", {"argv": ["ln", "-s", "../.env", "notes/a"]}),
        ("workspace/read_file", {"path": "notes/a"}),
    ])
    assert "hunter2" not in text(seen[1])
    assert seen[1].result.is_error
    assert records[1].status is hr.CallStatus.REFUSED


async def test_a_symlink_swapped_in_after_the_last_check_is_not_followed(
    workspace: Path,
) -> None:
    """The body opens the canonical path it was given, refusing a symlink met on the way."""
    (workspace / "notes" / "a").write_text("mine\n")
    impl = as_impl(workspace_tools()[1])
    assert str(impl.spec.id) == "workspace/write_file"
    validated = impl.validate({"path": "notes/a", "content": "PWNED\n"})
    bound = impl.bind(validated, workspace, {"notes/a": "notes/a"})
    assert bound.path == Path(os.path.realpath(workspace), "notes", "a")  # noqa: ASYNC240 - test setup
    # The race: the link lands between the last check and the open.
    (workspace / "notes" / "a").unlink()
    (workspace / "notes" / "a").symlink_to("../.env")
    ctx = hr.CallContext(call_id="c", tool_id=impl.spec.id, workspace=workspace)
    result = await impl.execute(bound, ctx)
    assert result.is_error
    assert (workspace / ".env").read_text() == "API_KEY=hunter2\n"


async def test_a_read_after_a_write_in_one_turn_sees_the_write(workspace: Path) -> None:
    seen, _ = await run_turn(workspace, [
        ("workspace/write_file", {"path": "notes/b", "content": "hello\n"}),
        ("workspace/read_file", {"path": "notes/b"}),
    ])
    assert text(seen[1]) == "hello\n"


async def test_mutating_calls_of_a_turn_run_one_after_another_in_call_order(
    workspace: Path,
) -> None:
    order: list[str] = []

    @hr.tool(server="t", actions=lambda name: [hr.Action(hr.Act.CALL, f"t/step/{name}")])
    async def step(name: str) -> str:
        """A mutating step."""
        order.append(f"{name}-start")
        for _ in range(5):  # yield to the loop: a concurrent sibling would start now
            await anyio.lowlevel.checkpoint()
        order.append(f"{name}-end")
        return name

    await run_turn(workspace, [("t/step", {"name": "one"}), ("t/step", {"name": "two"}),
                               ("t/step", {"name": "three"})], tools=[step])
    assert order == ["one-start", "one-end", "two-start", "two-end", "three-start",
                     "three-end"]


async def test_reads_next_to_each_other_run_concurrently(workspace: Path) -> None:
    first_waiting = anyio.Event()
    second_ran = anyio.Event()

    @hr.tool(server="t", mutates=False)
    async def first() -> str:
        """Waits for the second read: only possible when both run at once."""
        first_waiting.set()
        await second_ran.wait()
        return "first"

    @hr.tool(server="t", mutates=False)
    async def second() -> str:
        """Lets the first finish."""
        await first_waiting.wait()
        second_ran.set()
        return "second"

    seen, _ = await run_turn(workspace, [("t/first", {}), ("t/second", {})],
                             tools=[first, second])
    assert [text(m) for m in seen] == ["first", "second"]


async def test_a_write_never_goes_through_a_hard_link(workspace: Path, tmp_path: Path) -> None:
    """The rule: a write replaces the name it was given; other names keep the old bytes."""
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    os.link(outside, workspace / "notes" / "linked")
    seen, _ = await run_turn(workspace, [
        ("workspace/write_file", {"path": "notes/linked", "content": "new\n"}),
        ("workspace/edit_file", {"path": "notes/linked", "old": "new", "new": "newer"}),
    ])
    assert not seen[0].result.is_error and not seen[1].result.is_error
    assert outside.read_text() == "outside\n"
    assert (workspace / "notes" / "linked").read_text() == "newer\n"


async def test_a_tool_declaring_its_own_write_action_is_rechecked_too(workspace: Path) -> None:
    """The re-check at the moment of use covers every READ/WRITE action, typed or declared."""

    @hr.tool(server="t", actions=lambda path: [hr.Action(hr.Act.WRITE, path)])
    def put(path: str, ctx: hr.CallContext) -> str:
        """Write by the model's spelling (what the re-check protects)."""
        assert ctx.workspace is not None
        (ctx.workspace / path).write_text("PWNED\n")
        return "written"

    seen, records = await run_turn(workspace, [
        ("workspace/exec", {"argv": ["ln", "-s", "../.env", "notes/a"]}),
        ("t/put", {"path": "notes/a"}),
    ], tools=[*workspace_tools(), put])
    assert (workspace / ".env").read_text() == "API_KEY=hunter2\n"
    assert records[1].status is hr.CallStatus.REFUSED
    assert "now leads to '.env'" in text(seen[1])
