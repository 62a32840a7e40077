"""`TerminalPrinter`: a live view of a run in the terminal (rich)."""

from __future__ import annotations

from typing import Any

from handrail.runs._agent import RunEvent
from handrail.runs._program import text_lines

__all__ = ["TerminalPrinter"]

_STYLE = {"allow": "green", "ask": "yellow", "deny": "red"}
_PROGRAM_TAIL = 5
"""The last lines of a program's stdout and stderr the live view shows (`show` has more)."""


def _plain(text: object, limit: int = 300) -> str:
    """Model- or tool-written text as the terminal shows it: escaped, bounded, one line."""
    from rich.markup import escape

    value = str(text)
    if len(value) > limit:
        value = value[:limit] + "..."
    value = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in value)
    return escape(value)


class TerminalPrinter:
    """A live view of a run in the terminal.

    Streamed text, each call with its verdict and duration, a spinner while the turn's calls
    run. Pass it as `on_event` (the `handrail run` command does).

    ```python
    printer = hr.TerminalPrinter()
    result = await agent.run("task", on_event=printer)
    ```

    Everything a model or a tool wrote is shown escaped (no terminal escape sequences, no
    markup), so a display cannot differ from what happened.

    Args:
        console: A `rich.console.Console`; default one on stdout.
        spinner: Show a spinner while calls run (off when the console is not a terminal).
    """

    def __init__(self, console: Any = None, *, spinner: bool = True) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(highlight=False)
        self.spinner = spinner and self.console.is_terminal
        self._status: Any = None
        self._streamed = False

    def pause(self) -> None:
        """Stop the spinner (before asking the person at the terminal something)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _program(self, program: dict[str, Any]) -> None:
        """The end of a program's output: the lines a person looks at first."""
        if program.get("note"):
            self.console.print(f"    [yellow]{_plain(program['note'])}[/]")
        for name in ("stdout", "stderr"):
            text = program.get(name)
            if not isinstance(text, str) or not text.strip():
                continue
            lines = text_lines(text, head=0, tail=_PROGRAM_TAIL, width=200)
            self.console.print(f"    [dim]{name}:[/]")
            for line in lines:
                self.console.print(f"      {_plain(line, 200)}")

    def __call__(self, event: RunEvent) -> None:
        """Show one event."""
        d = event.detail
        console = self.console
        if event.kind == "text_delta":
            self.pause()
            console.print(_plain(d.get("text", ""), 10_000), end="")
            self._streamed = True
        elif event.kind == "model_turn":
            if self._streamed:
                console.print()
            elif d.get("text"):
                console.print(f"[cyan]model[/] {_plain(d['text'], 2000)}")
            self._streamed = False
        elif event.kind == "call_planned":
            console.print(f"[dim]-> {_plain(d.get('name'))} {_plain(d.get('arguments'), 120)}[/]")
            if self.spinner and self._status is None:
                self._status = console.status("running tools...")
                self._status.start()
        elif event.kind == "call_finished":
            self.pause()
            verdict = d.get("verdict") or "-"
            style = _STYLE.get(verdict, "white")
            duration = d.get("duration")
            took = f" {duration * 1000:.0f}ms" if isinstance(duration, float) else ""
            decision = f" ({_plain(d['decision'])})" if d.get("decision") else ""
            program = d.get("program")
            exited = ""
            if isinstance(program, dict):
                exited = (" timed out" if program.get("timed_out") else
                          f" exit code {_plain(program.get('exit_code'))}")
            console.print(f"  [{style}]{_plain(verdict)}[/]{decision} {_plain(d.get('tool'))} "
                          f"{_plain(d.get('status'))}{took}{exited}")
            if d.get("sandbox"):
                console.print(f"    [bold red]{_plain(d['sandbox'], 400)}[/]")
            if isinstance(program, dict):
                self._program(program)
            shown = d.get("error") or d.get("result")
            if shown:
                for line in text_lines(str(shown), head=3, tail=3, width=200):
                    console.print(f"    [dim]{_plain(line, 200)}[/]")
        elif event.kind in ("paused", "finished"):
            self.pause()
            outcome = d.get("outcome") or {}
            kind = outcome.get("kind", "?")
            style = "green" if kind == "completed" else "red" if kind == "failed" else "yellow"
            console.print(f"[{style}]{_plain(kind)}[/]")
