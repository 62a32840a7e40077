"""Tool control: an adjudicator outside the agent's code that sees every call before it runs.

A control is asked about each granted, valid call after its actions are known and before
the policy (stage 4b of the gate). It receives one JSON object

```
{"id": call id, "run_id": ..., "agent": ..., "tool": "server/name",
 "input": the validated arguments, "actions": [{"act", "target", ...}, ...]}
```

and answers `{"decision": "pass" | "refuse" | "hold", "reason": "..."}`. It can only make
things stricter: a pass still goes through the policy and any approval; a refuse is a
model-visible error (not sent); a hold parks the run for a person like a deferred approval.

It fails closed: a control that raises (anything, `SystemExit` included), crashes, exits
non-zero, answers something that is not exactly one such object (a repeated key included),
answers too much, or takes longer than its timeout (whatever it answers later) refuses the
call, and the call's record says why. It gets a copy of the query: changing it changes
nothing. It must be side-effect free: it is asked again when a held or
paused call is resumed, and for an approval that modifies the arguments.

`CommandControl` runs an external program (any language); a Python callable (sync or async,
dict in, dict out) is wrapped by `control_from`. The program runs in its own process group,
which is killed when it times out, is cancelled, or has answered.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import anyio

from handrail.errors import UserError

__all__ = [
    "CONTROL_MAX_OUTPUT_BYTES",
    "CONTROL_MAX_REASON_CHARS",
    "CONTROL_TIMEOUT",
    "CallableControl",
    "CommandControl",
    "Control",
    "ControlFailed",
    "ControlVerdict",
    "adjudicate",
    "check_answer",
    "control_from",
    "kill_running_controls",
]

CONTROL_TIMEOUT = 5.0
"""Seconds a control may take to answer, by default."""
CONTROL_MAX_OUTPUT_BYTES = 64 * 1024
"""The most a command's answer may be (stdout); more is a refusal, and is never read."""
CONTROL_MAX_REASON_CHARS = 1000
"""A reason longer than this is cut (it reaches the model and the operator's screen)."""
_STDERR_KEPT = 2000

Decision = Literal["pass", "refuse", "hold"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ControlVerdict:
    """What a control decided about one call (or the refusal its failure became)."""

    decision: Decision
    """`pass` (on to the policy), `refuse` (not sent) or `hold` (a person decides)."""
    reason: str
    """The control's reason, or what went wrong with it."""
    failed: bool = False
    """True when the control itself failed and this refusal is the fail-closed default."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in the call's record."""
        out: dict[str, Any] = {"decision": self.decision, "reason": self.reason}
        if self.failed:
            out["failed"] = True
        return out


@runtime_checkable
class Control(Protocol):
    """Anything that answers the control question for one call.

    `ask` returns the raw answer (a dict with `decision` and `reason`); `adjudicate` checks
    it and turns every failure into a refusal. A control must be side-effect free.
    """

    async def ask(self, query: dict[str, Any]) -> Any:
        """The answer for `query` (see the module docstring)."""
        ...

    def describe(self) -> str:
        """What this control is, for records and messages."""
        ...


class ControlFailed(Exception):
    """A control could not give an answer (crash, exit code, bad output, too much output)."""


def _timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value <= 0:
        raise UserError(f"a control's timeout is a positive number of seconds, not {value!r}")
    return float(value)


class CallableControl:
    """A Python callable as a control: dict in, dict out; sync or async.

    A sync callable runs in a worker thread (it may wait on I/O); one still running at its
    timeout is abandoned (its thread finishes on its own) and the call is refused.
    """

    def __init__(self, fn: Callable[[dict[str, Any]], Any], *,
                 timeout: float = CONTROL_TIMEOUT) -> None:
        if not callable(fn):
            raise UserError(f"control= takes a callable or hr.CommandControl, not "
                            f"{type(fn).__name__}")
        self.fn = fn
        self.timeout = _timeout(timeout)
        self._async = inspect.iscoroutinefunction(fn) or \
            inspect.iscoroutinefunction(type(fn).__call__)

    def describe(self) -> str:
        """`python module.function`."""
        fn = self.fn
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return f"python {getattr(fn, '__module__', '?')}.{name}"

    async def ask(self, query: dict[str, Any]) -> Any:
        """Call the function (a sync one in a worker thread: it may wait on I/O)."""
        if self._async:
            return await self.fn(query)
        out = await anyio.to_thread.run_sync(self.fn, query, abandon_on_cancel=True)
        if inspect.isawaitable(out):  # a sync callable returning a coroutine
            return await out
        return out


class CommandControl:
    """An external program as a control: the query as JSON on stdin, one JSON line on stdout.

    ```python
    agent = hr.Agent(model, box, control=hr.CommandControl(["./adjudicate.py"], timeout=5))
    ```

    The program runs in the agent's workspace directory with the process's environment, in
    a process group of its own; the group is killed (SIGKILL) when the program times out, is
    cancelled, or has answered (a control leaves nothing running). stdout must be exactly one
    line holding one JSON object, at most `max_output_bytes`; stderr is kept (cut) for the
    record when it fails.

    Args:
        argv: The program and its arguments (no shell).
        timeout: Seconds for the whole exchange; past it the call is refused.
        max_output_bytes: The most stdout may carry.
    """

    def __init__(self, argv: Sequence[str], *, timeout: float = CONTROL_TIMEOUT,
                 max_output_bytes: int = CONTROL_MAX_OUTPUT_BYTES) -> None:
        if isinstance(argv, str | bytes) or not isinstance(argv, Sequence) or not argv or \
                not all(isinstance(a, str) for a in argv) or not argv[0]:
            raise UserError(f"CommandControl takes an argv: a non-empty list of strings, "
                            f"e.g. ['./adjudicate.sh'], not {argv!r}")
        if any("\x00" in a for a in argv):
            raise UserError("a CommandControl argument contains a NUL byte")
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or \
                max_output_bytes <= 0:
            raise UserError("max_output_bytes is a positive integer")
        self.argv = tuple(argv)
        self.timeout = _timeout(timeout)
        self.max_output_bytes = max_output_bytes
        self.cwd: str | None = None
        """Where the program runs; the agent sets its workspace."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommandControl) and other.argv == self.argv and \
            other.timeout == self.timeout

    def __hash__(self) -> int:
        return hash((self.argv, self.timeout))

    def __repr__(self) -> str:
        return f"CommandControl({list(self.argv)!r}, timeout={self.timeout:g})"

    def describe(self) -> str:
        """`command ['./adjudicate.sh']`."""
        return f"command {list(self.argv)!r}"

    async def ask(self, query: dict[str, Any]) -> Any:
        """Run the program once for `query`.

        Raises:
            ControlFailed: it could not be started, exited non-zero, or its output is not
                exactly one line, or is larger than allowed.
        """
        data = (json.dumps(query, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        # TODO(host): move onto the host package's process machinery once it lands; this
        # is a small spawn of its own, kept in one place.
        #
        # Started without an await (fork/exec is short), so no cancellation can arrive
        # between the program starting and this function owning it: asyncio's subprocess
        # transport, cancelled while it connects the pipes, kills only the program and then
        # waits for pipes a child of it may hold open forever. The exchange runs in a worker
        # thread that owns the pipes; a timeout or a cancellation abandons it and kills the
        # whole group, which ends the thread's reads.
        try:
            process = subprocess.Popen(  # noqa: ASYNC220 - see above
                list(self.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=self.cwd,
                start_new_session=sys.platform != "win32")
        except OSError as exc:
            raise ControlFailed(f"could not start {self.argv[0]!r}: "
                                f"{exc.strerror or exc}") from None
        _LIVE.add(process)
        try:
            out, err, too_much, code = await anyio.to_thread.run_sync(
                _exchange, process, data, self.max_output_bytes, abandon_on_cancel=True)
        finally:
            # Whatever way out (an answer, a timeout, a cancellation, Ctrl-C): the program and
            # anything it started are killed (the exchange thread reaps it).
            _kill_group(process)
            _LIVE.discard(process)
        stderr = err.decode("utf-8", "replace").strip()
        said = f" (stderr: {stderr[:500]})" if stderr else ""
        if too_much:
            raise ControlFailed(f"its output exceeds {self.max_output_bytes} bytes")
        if code != 0:
            what = (f"was killed by signal {-code}" if code < 0
                    else f"exited with code {code}")
            raise ControlFailed(f"it {what}{said}")
        text = out.decode("utf-8", "replace")
        lines = text.splitlines()
        if len(lines) != 1 or text.count("\n") > 1:
            raise ControlFailed(f"it must print exactly one JSON line, it printed "
                                f"{len(lines)}{said}")
        try:
            return json.loads(lines[0], object_pairs_hook=_no_duplicates)
        except ValueError:
            raise ControlFailed(f"its output is not JSON: {lines[0][:200]!r}") from None


_LIVE: set[subprocess.Popen[bytes]] = set()
"""The control programs running now (so an emergency stop can kill them at once)."""


def kill_running_controls() -> None:
    """Kill every control program of this process at once (a second Ctrl-C)."""
    for process in list(_LIVE):
        _kill_group(process)


def _exchange(process: subprocess.Popen[bytes], data: bytes, limit: int
              ) -> tuple[bytes, bytes, bool, int]:
    """In a worker thread: write the query, read stdout and stderr to their ends, reap.

    stdout is read to at most `limit` + 1 bytes (past that the group is killed); of stderr
    only the first part is kept, but it is read to its end so the program never blocks.

    Returns:
        stdout, stderr (cut), whether stdout exceeded `limit`, the exit code.
    """
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    out = bytearray()
    err = bytearray()
    too_much = False
    pending = memoryview(data)
    streams = (process.stdin, process.stdout, process.stderr)
    try:
        with selectors.DefaultSelector() as selector:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin, selectors.EVENT_WRITE)
            selector.register(process.stdout, selectors.EVENT_READ)
            selector.register(process.stderr, selectors.EVENT_READ)
            while selector.get_map():
                for key, _ in selector.select():
                    stream = key.fileobj
                    if stream is process.stdin:
                        try:
                            written = os.write(process.stdin.fileno(), pending)
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            # A program that answers without reading its stdin: fine.
                            written = len(pending)
                        pending = pending[written:]
                        if not pending:
                            selector.unregister(process.stdin)
                            process.stdin.close()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(stream)
                    elif stream is process.stdout:
                        out += chunk
                        if len(out) > limit:
                            too_much = True
                            _kill_group(process)
                            return bytes(out[:limit]), bytes(err), True, process.wait()
                    elif len(err) < _STDERR_KEPT:
                        err += chunk[:_STDERR_KEPT - len(err)]
        return bytes(out), bytes(err), too_much, process.wait()
    finally:
        for stream in streams:
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(OSError):
            process.wait()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, OSError):
        process.kill()


def control_from(value: object) -> Control | None:
    """`Agent(control=...)`: None, a `Control` (e.g. `CommandControl`), or a callable.

    Raises:
        UserError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, CommandControl | CallableControl):
        return value
    if isinstance(value, Control) and not callable(value):
        return value
    if callable(value):
        return CallableControl(value)
    raise UserError(f"control= takes a callable (dict in, dict out) or "
                    f"hr.CommandControl(argv), not {type(value).__name__}")


def _timeout_of(control: Control) -> float:
    value = getattr(control, "timeout", CONTROL_TIMEOUT)
    return float(value) if isinstance(value, int | float) else CONTROL_TIMEOUT


def _cut(text: str) -> str:
    if len(text) <= CONTROL_MAX_REASON_CHARS:
        return text
    return text[:CONTROL_MAX_REASON_CHARS] + f" [cut: {len(text)} characters in all]"


def _refused(why: str) -> ControlVerdict:
    return ControlVerdict(decision="refuse", reason=_cut(why), failed=True)


def check_answer(answer: object) -> ControlVerdict:
    """A control's raw answer as a verdict; anything but exactly the expected shape refuses."""
    if not isinstance(answer, Mapping):
        return _refused(f"the tool control answered {type(answer).__name__}, not an object "
                        "with 'decision' and 'reason'")
    unknown = sorted(str(k) for k in answer if k not in ("decision", "reason"))
    if unknown:
        return _refused(f"the tool control's answer has unknown key(s) {unknown}; it holds "
                        "only 'decision' and 'reason'")
    decision = answer.get("decision")
    if decision not in ("pass", "refuse", "hold"):
        return _refused(f"the tool control's decision must be 'pass', 'refuse' or 'hold', "
                        f"not {str(decision)[:100]!r}")
    reason = answer.get("reason", "")
    if not isinstance(reason, str):
        return _refused("the tool control's reason must be a string")
    return ControlVerdict(decision=decision, reason=_cut(reason))


async def adjudicate(control: Control, query: dict[str, Any]) -> ControlVerdict:
    """Ask `control` about one call, within its timeout; every failure is a refusal.

    The control gets a deep copy of `query`: whatever it does to it changes neither the
    record, nor the approval request, nor what runs (it can only make things stricter).
    Past the deadline the call is refused whatever the control then answers (a coroutine
    that swallowed the cancellation, or blocked the loop and never awaited). A control that
    raises anything, `SystemExit`, `KeyboardInterrupt` and a `CancelledError` of its own
    included, refuses the call; an outside cancellation is never swallowed (a command's
    process group is killed first).
    """
    timeout = _timeout_of(control)
    answer: Any = None
    deadline = anyio.current_time() + timeout
    with anyio.CancelScope(deadline=deadline) as scope:
        try:
            answer = await control.ask(copy.deepcopy(query))
        except ControlFailed as exc:
            return _refused(f"the tool control failed: {exc}")
        except Exception as exc:  # boundary: the control's own code failing refuses the call
            return _refused(f"the tool control failed: {type(exc).__name__}: {exc}")
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()) and (
                    scope.cancel_called or _cancelled_from_outside()):
                raise  # our deadline (handled below) or an outside cancel: not the control's
            return _refused(f"the tool control failed: {type(exc).__name__}: {exc}")
    if scope.cancel_called or anyio.current_time() >= deadline:
        return _refused(f"the tool control timed out after {timeout:g}s")
    return check_answer(answer)


def _cancelled_from_outside() -> bool:
    """Whether this task has a cancellation pending (asyncio counts them; trio's are real)."""
    try:
        import asyncio

        task = asyncio.current_task()
    except RuntimeError:  # not under asyncio: a Cancelled there comes from a cancellation
        return True
    return task is None or task.cancelling() > 0


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # Which one a reader takes differs between parsers: neither can be trusted.
            raise ControlFailed(f"its answer has a duplicate key {key[:100]!r}")
        out[key] = value
    return out
