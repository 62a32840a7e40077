"""The `Approver` protocol and the built-in approvers."""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TextIO, runtime_checkable

import anyio
import anyio.to_thread

from handrail.approval._decision import Decision
from handrail.approval._request import Request
from handrail.approval._terminal import ask_line, printable
from handrail.errors import UserError
from handrail.tools import Act, Action

__all__ = ["ApproveAll", "Approver", "CallbackApprover", "DenyAll", "StdinApprover"]


@runtime_checkable
class Approver(Protocol):
    """Decides the calls the policy says to ask about. Only ASK reaches an approver.

    One instance may serve a whole tree of agents, concurrently. There is no timeout: an
    approver may wait as long as it likes (return `Decision.defer()` to let the run pause
    instead of holding it open).
    """

    async def decide(self, request: Request) -> Decision:
        """Approve, deny or defer `request`."""
        ...


class ApproveAll:
    """Approves every request (the policy's denials still hold: they never get here)."""

    async def decide(self, request: Request) -> Decision:
        """Approve."""
        return Decision.approve()


class DenyAll:
    """Denies every request with `reason`."""

    def __init__(self, reason: str = "no approver is available to allow this action") -> None:
        self.reason = reason

    async def decide(self, request: Request) -> Decision:
        """Deny with the configured reason."""
        return Decision.deny(self.reason)


DecideFn = Callable[[Request], Decision | Awaitable[Decision]]


class CallbackApprover:
    """Wraps a function `fn(request) -> Decision` (sync or async).

    A sync function runs on the event loop's thread: keep it quick, or pass
    `blocking=True` to run it in a worker thread.
    """

    def __init__(self, fn: DecideFn, *, blocking: bool = False) -> None:
        if not callable(fn):
            raise UserError("CallbackApprover takes a function request -> Decision")
        self.fn = fn
        self.blocking = blocking

    async def decide(self, request: Request) -> Decision:
        """Call the function and check it returned a Decision."""
        if self.blocking:
            result = await anyio.to_thread.run_sync(self.fn, request)
        else:
            result = self.fn(request)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Decision):
            raise UserError(
                f"the CallbackApprover function returned {result!r}; it must return "
                "Decision.approve(), Decision.deny(reason) or Decision.defer()"
            )
        return result


_MAX_DIFF_LINES = 400
_MAX_REASON = 2000
_MAX_FILE_BYTES = 1 << 20


def _read_current(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"<cannot read the current file: {exc}>".encode()


def _decode(data: bytes) -> str | None:
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def render_diff(target: str, old: bytes | None, new: bytes) -> str:
    """A unified diff of a write, for a person (control characters escaped)."""
    new_text = _decode(new)
    old_text = "" if old is None else _decode(old)
    if new_text is None or old_text is None:
        before = "absent" if old is None else f"{len(old)} bytes"
        return f"  (binary content: {before} -> {len(new)} bytes)\n"
    lines = list(difflib.unified_diff(
        old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
        fromfile="/dev/null" if old is None else f"a/{target}", tofile=f"b/{target}",
    ))
    if not lines:
        return "  (no change: the file already holds exactly these bytes)\n"
    shown = lines[:_MAX_DIFF_LINES]
    out = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                  for line in shown)
    if len(lines) > len(shown):
        out += f"... {len(lines) - len(shown)} more diff lines not shown: deny if unsure\n"
    return printable(out)


_GLOB = frozenset("*?[]{}\\!")
_DEFAULT_REASON = "denied by the operator"


def _rememberable(request: Request) -> str | None:
    """The pattern "allow for this run" remembers: exactly this target, or None.

    Offered only where the pattern can name exactly the one target: a path, host or tool
    without glob characters. An argv is never turned into a pattern (a program's rules match
    in ways a one-key answer should not decide).
    """
    actions = request.actions or (Action(request.act, request.target, request.content),)
    if len(actions) != 1 or actions[0].act is Act.EXEC:
        return None
    target = actions[0].target
    if not isinstance(target, str) or not target or any(c in _GLOB for c in target) \
            or not target.isprintable() or len(target) > 1000:
        return None
    from handrail.errors import PolicyError
    from handrail.policy._patterns import compile_pattern

    try:
        compile_pattern(actions[0].act, target)
    except PolicyError:
        return None
    return target


class StdinApprover:
    """Asks at the terminal: `y` approves, `a` also allows the same for the rest of the run.

    Anything else denies, with a reason the person types (the model reads it).

    Shows the act and target and, for a write, a unified diff against the current file (for
    `edit_file`, the file as the edit would leave it); control characters escaped, so what the
    model wrote cannot restyle the terminal. At the end of input (no terminal, a closed
    stdin) nobody is there to decide: the request is deferred (the run pauses), never denied
    in a person's name.

    Reads in a worker thread, so the event loop keeps running; concurrent requests (from
    several agents) are asked one at a time.
    """

    def __init__(self, *, input: TextIO | None = None, output: TextIO | None = None) -> None:
        self._input = input
        self._output = output
        self._lock: anyio.Lock | None = None

    async def decide(self, request: Request) -> Decision:
        """Show the request, read the answer (and a reason for a denial)."""
        text = await self._render(request)
        pattern = _rememberable(request)
        choices = "[y/N/a]" if pattern is not None else "[y/N]"
        if pattern is not None:
            text += (f"  a: approve, and allow {printable(request.act.value)} "
                     f"{printable(pattern)} for the rest of this run\n")
        if self._lock is None:
            self._lock = anyio.Lock()
        output, input = self._output or sys.stdout, self._input or sys.stdin
        async with self._lock:
            answer = await ask_line(output, input, text + f"Approve? {choices} ")
            if answer is None:
                # End of input: nobody is there to decide. A denial would be recorded, and
                # read by the model, as a person's; the run pauses for one instead.
                return Decision.defer()
            # Exactly `y` (either case): anything else, "yes" and a stray keystroke included,
            # is a denial. Approving a side effect should take a deliberate answer.
            choice = answer.strip().lower()
            if choice == "y":
                return Decision.approve()
            if choice == "a" and pattern is not None:
                return Decision.approve(remember=(pattern,))
            reason = await ask_line(output, input, "Why? (the model reads this; Enter for "
                                                   f"{_DEFAULT_REASON!r}) ")
        reason = (reason or "").strip()[:_MAX_REASON]
        return Decision.deny(reason or _DEFAULT_REASON)

    async def _render(self, request: Request) -> str:
        actions = request.actions or (Action(request.act, request.target, request.content),)
        parts = [f"\n{printable(request.agent or 'agent')} calls {printable(request.tool)}"
                 f" (call {printable(request.call_id)})\n"]
        if request.verdict_reason:
            parts.append(f"  policy: {printable(request.verdict_reason)}\n")
        for taint in request.taint:
            parts.append(f"  tainted: {printable(taint.describe())}\n")
        for action in actions:
            parts.append(f"  {printable(action.describe())}\n")
            if action.act is Act.WRITE and action.content is not None:
                assert isinstance(action.target, str)
                root = request.workspace or os.getcwd()
                old = await anyio.to_thread.run_sync(
                    _read_current, os.path.join(root, action.target)
                )
                parts.append(render_diff(action.target, old, action.content))
            elif action.act is Act.WRITE and request.tool == "workspace/edit_file":
                assert isinstance(action.target, str)
                root = request.workspace or os.getcwd()
                old = await anyio.to_thread.run_sync(
                    _read_current, os.path.join(root, action.target)
                )
                parts.append(_edit_diff(action.target, old, request.arguments))
        return "".join(parts)


def _edit_diff(target: str, current: bytes | None, arguments: Mapping[str, Any]) -> str:
    """`edit_file`'s change as a diff: the file now, and as the edit would leave it.

    The edit itself re-reads the file when it runs (and refuses unless `old` occurs exactly
    once then); this shows what it would do to the file as it is now.
    """
    old, new = arguments.get("old"), arguments.get("new")
    if not isinstance(old, str) or not isinstance(new, str) or not old:
        return "  (no diff: the edit's arguments are not text)\n"
    text = None if current is None else _decode(current)
    if text is None:
        return ("  (no diff: the file does not exist; the edit will be refused)\n"
                if current is None else "  (no diff: the file is not UTF-8 text)\n")
    # Overlapping occurrences counted, as edit_file counts them.
    found, at = 0, text.find(old)
    while at != -1 and found < 2:
        found, at = found + 1, text.find(old, at + 1)
    if found != 1:
        where = "more than once" if found else "nowhere"
        return (f"  (no diff: the text to replace occurs {where} in the file now; the edit "
                "will be refused unless that changes)\n")
    return render_diff(target, current, text.replace(old, new, 1).encode("utf-8"))
