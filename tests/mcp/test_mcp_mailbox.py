"""The in-flight call's mailbox: what the request task and a server's forms hand the body.

It replaced an anyio memory stream (a checkpoint at each send and receive: two event-loop
iterations per MCP call, issue 38); it must keep the stream's promises: order, a wait that
ends at the first item, nothing accepted once the body has gone, and what was never taken
handed back so a waiting server form can be told "cancel". The own link's mailbox
(`_LoopMailbox`, a bare future of the loop instead of an anyio event) keeps the same ones.
"""

from __future__ import annotations

import anyio
import pytest

from handrail.mcp._client import _LoopMailbox, _Mailbox

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[_Mailbox, _LoopMailbox])
def make(request: pytest.FixtureRequest) -> type[_Mailbox]:
    """Each kind of mailbox (the SDK path's, the own link's)."""
    kind: type[_Mailbox] = request.param
    return kind


async def test_items_come_out_in_the_order_put_and_a_wait_ends_at_the_first(
        make: type[_Mailbox]) -> None:
    mail = make()
    got: list[tuple[str, object]] = []

    async def body() -> None:
        got.append(await mail.get())
        got.append(await mail.get())
        got.append(await mail.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await anyio.wait_all_tasks_blocked()
        assert got == []  # waiting, not spinning
        mail.put(("elicit", 1))
        mail.put(("elicit", 2))
        await anyio.wait_all_tasks_blocked()
        assert got == [("elicit", 1), ("elicit", 2)]
        mail.put(("result", 3))
    assert got == [("elicit", 1), ("elicit", 2), ("result", 3)]


async def test_a_closed_mailbox_refuses_and_returns_what_was_never_taken(
        make: type[_Mailbox]) -> None:
    mail = make()
    mail.put(("elicit", "form"))
    assert mail.close() == [("elicit", "form")]
    with pytest.raises(anyio.ClosedResourceError):
        mail.put(("result", None))
    assert mail.close() == []


async def test_a_waiting_get_is_cancellable(
        make: type[_Mailbox]) -> None:
    mail = make()
    with anyio.move_on_after(0.01) as scope:
        await mail.get()
    assert scope.cancelled_caught
    mail.put(("result", 1))  # still usable after a cancelled wait
    assert await mail.get() == ("result", 1)
