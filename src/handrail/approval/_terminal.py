"""Talking to a person at a terminal without blocking the event loop or trusting the text."""

from __future__ import annotations

import functools
from typing import TextIO

import anyio
import anyio.to_thread

__all__ = ["ask_line", "printable"]


def printable(text: str) -> str:
    """`text` with control characters shown as escapes (newlines and tabs kept).

    What the model wrote reaches the operator's terminal here: an escape sequence could
    otherwise hide a line of a diff or rewrite the prompt.
    """
    return "".join(
        c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" if ord(c) < 256
        else f"\\u{ord(c):04x}"
        for c in text
    )


def _prompt(output: TextIO, input: TextIO, text: str) -> str | None:
    output.write(text)
    output.flush()
    line = input.readline()
    return None if line == "" else line.rstrip("\r\n")


async def ask_line(output: TextIO, input: TextIO, text: str) -> str | None:
    """Write `text`, read one line in a worker thread; None at end of input.

    A cancelled caller stops waiting at once (the thread finishes its read on its own).
    """
    return await anyio.to_thread.run_sync(
        functools.partial(_prompt, output, input, text), abandon_on_cancel=True
    )
