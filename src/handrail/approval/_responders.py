"""The `Responder` protocol (answers a tool's questions about intent) and its built-ins."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO, runtime_checkable

import anyio

from handrail.approval._terminal import ask_line, printable
from handrail.errors import UserError
from handrail.tools import Question

__all__ = ["FixedResponder", "Responder", "ResponderNone", "StdinResponder"]


@runtime_checkable
class Responder(Protocol):
    """Answers a tool's `ctx.ask(Question(...))` when the tool runs under an agent.

    Return the answer, or None when nobody here can answer (the run then pauses as
    AwaitingAnswer). An answer need not be one of the question's choices, and it authorises
    nothing: approvals are a separate channel.
    """

    async def answer(self, question: Question) -> str | None:
        """The answer to `question`, or None to leave it for later."""
        ...


class ResponderNone:
    """Nobody here answers: every question pauses the run (the default)."""

    async def answer(self, question: Question) -> str | None:
        """None."""
        return None


class FixedResponder:
    """Answers every question with the same text (tests, scripted runs)."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise UserError("FixedResponder takes the answer text")
        self.text = text

    async def answer(self, question: Question) -> str | None:
        """The fixed text."""
        return self.text


class StdinResponder:
    """Asks at the terminal.

    A number picks that choice; an empty line (or end of input) means "decide later"
    (None); any other text is the answer as typed.
    """

    def __init__(self, *, input: TextIO | None = None, output: TextIO | None = None) -> None:
        self._input = input
        self._output = output
        self._lock: anyio.Lock | None = None

    async def answer(self, question: Question) -> str | None:
        """Show the question and its numbered choices; read one line."""
        parts = [f"\n{printable(question.question)}\n"]
        if question.context:
            parts.append(f"  ({printable(question.context)})\n")
        for i, choice in enumerate(question.choices, 1):
            parts.append(f"  {i}. {printable(choice)}\n")
        parts.append("Answer (empty line: decide later): ")
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            line = await ask_line(self._output or sys.stdout, self._input or sys.stdin,
                                  "".join(parts))
        if line is None or not line.strip():
            return None
        text = line.strip()
        if text.isdigit() and 1 <= int(text) <= len(question.choices):
            return question.choices[int(text) - 1]
        return text
