"""Conversations: a completed run continued with a new user message.

Each message of a conversation is a run of its own (it can pause, be resumed, fail), and the
store keeps the conversation as a thread of runs: each continuing run records a `continues`
event naming the run it continues and the conversation's first run. A continuing run starts
with the whole history of the run it continues (as stored: contents as markers), its
remembered rules, and its recorded policy as the boundary (the agent's current policy can only
add denies and asks to it, as on a resume).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from handrail.errors import UserError
from handrail.models import (
    AssistantMessage,
    SystemMessage,
    ToolResultMessage,
    UserMessage,
    load_messages,
)
from handrail.policy import Policy, Rule
from handrail.runs._outcome import next_step, outcome_from_dict
from handrail.runs._tree import conversation_of, thread
from handrail.store import RunRecord, RunStatus, Store

if TYPE_CHECKING:
    from handrail.runs._agent import Agent
    from handrail.runs._outcome import RunResult

__all__ = ["Conversation", "Start", "conversation_of", "start_messages", "thread"]

_MESSAGE_TYPES = (SystemMessage, UserMessage, AssistantMessage, ToolResultMessage)


@dataclass(slots=True)
class Start:
    """What a new run starts from."""

    messages: list[Any]
    """The history, ending with the new user message."""
    policy: Policy
    """The boundary."""
    remembered: list[Rule] = field(default_factory=list)
    """Rules remembered earlier in the conversation."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """What to record in the new run's events (the link to the run it continues)."""


async def start_messages(agent: Agent, store: Store, task: str, continue_run: str | None,
                         message_history: Sequence[Any] | None, now: float) -> Start:
    """The messages, boundary and remembered rules a new run of `agent` starts with."""
    from handrail.runs._agent import check_resumable

    if continue_run is not None and message_history is not None:
        raise UserError("pass continue_run= (a stored run) or message_history= (messages), "
                        "not both")
    if continue_run is not None:
        previous = await store.run(continue_run)
        if previous.status is not RunStatus.COMPLETED:
            hint = (next_step(outcome_from_dict(previous.outcome), previous.id)
                    if previous.outcome else "it has not finished")
            raise UserError(f"run {previous.id} is {previous.status.value}, and only a "
                            f"completed run can be continued: {hint}")
        check_resumable(previous, agent, allow_manifest_change=False)
        messages = load_messages(await store.messages(previous.id))
        messages.append(UserMessage(task))
        root = conversation_of(previous)
        return Start(
            messages,
            Policy.from_dict(previous.policy or {}).contain(agent.policy),
            [Rule.from_dict(r) for r in previous.remembered],
            [{"kind": "continues", "run": previous.id,
              "conversation": root[0] if root else previous.id, "at": now}])
    history: list[Any] = []
    if message_history is not None:
        if isinstance(message_history, str | bytes) or not isinstance(message_history, Sequence):
            raise UserError("message_history= takes a list of handrail messages")
        for m in message_history:
            if not isinstance(m, _MESSAGE_TYPES):
                raise UserError(f"message_history= holds {type(m).__name__}, not a handrail "
                                "message (hr.models.UserMessage, AssistantMessage, ...)")
        history = list(message_history)
    if agent.instructions and not any(isinstance(m, SystemMessage) for m in history):
        history.insert(0, SystemMessage(agent.instructions))
    history.append(UserMessage(task))
    return Start(history, agent.policy)


class Conversation:
    """A conversation with an agent: each message continues the last completed run.

    ```python
    chat = hr.Conversation(agent, store=store)
    first = await chat.send("what is alice's balance?")
    second = await chat.send("and bob's?")      # sees the whole history
    ```

    In another process, `hr.Conversation(agent, store=store, run_id=second.run_id)` picks
    it up. A message whose run pauses is continued with `hr.resume_with_decision` (or
    `handrail approve`) as any run; the next `send` continues it once it has completed.

    Args:
        agent: The agent.
        store: Where the runs are kept; default an in-memory store.
        run_id: The run to continue from (a completed run of an earlier conversation).
    """

    def __init__(self, agent: Agent, *, store: Store | None = None,
                 run_id: str | None = None) -> None:
        self.agent = agent
        self.store = store if store is not None else Store.memory()
        self.run_id = run_id
        """The conversation's latest run (None before the first message)."""

    async def send(self, message: str, **options: Any) -> RunResult:
        """Send `message`; `options` are `Agent.run`'s (`approver=`, `on_event=`...)."""
        result = await self.agent.run(message, store=self.store, continue_run=self.run_id,
                                      **options)
        self.run_id = result.run_id
        return result

    def send_sync(self, message: str, **options: Any) -> RunResult:
        """`send` for synchronous code (starts an event loop)."""
        import functools

        import anyio

        return anyio.run(functools.partial(self.send, message, **options))

    async def runs(self) -> list[RunRecord]:
        """The conversation's runs, first to last."""
        if self.run_id is None:
            return []
        return await thread(self.store, await self.store.run(self.run_id))
