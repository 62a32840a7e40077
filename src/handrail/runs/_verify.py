"""Checking a run's final answer: `hr.Verify`, and the attempts a run makes (docs/verify.md).

When the model gives its final answer, the run's check runs. Passing, the run completes (its
events hold the check's result). Failing, the failure goes back to the model as a user message
and the loop continues, up to `max_verify_attempts`; then the run ends `Failed`, its
`verification` a `VerificationFailed` holding every attempt.

A command check is the workspace `exec` tool driven through the gate as a call of the
answer's turn: the policy decides its EXEC action like any other (deny ends the run `Failed`;
ask goes to the approver, and a deferral pauses the run like any ask), and it is recorded like
any call. The check and every attempt are kept in the run's events, so a run resumed in
another process continues with its attempt count and is held to the check it started with.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio

from handrail.errors import (
    InvalidArguments,
    Issue,
    ResumeRefused,
    UserError,
    VerificationAttempt,
    VerificationFailed,
)
from handrail.gate import Gate, RunScope
from handrail.models import AssistantMessage, ToolCall, UserMessage, dump_messages
from handrail.runs._events import EventKind
from handrail.runs._outcome import Completed, Failed, RunOutcome, RunResult, pause_outcome
from handrail.store import Batch, CallRecord, CallStatus, RunRecord, RunStatus, Store
from handrail.tools import CallContext, Toolbox, ToolImpl, ToolResult, scrub_host_paths

__all__ = [
    "DEFAULT_CHECK_TIMEOUT",
    "VERIFY_OUTPUT_CHARS",
    "NotVerified",
    "Verification",
    "Verified",
    "Verify",
    "VerifyContext",
    "check_max_attempts",
]

VERIFY_OUTPUT_CHARS = 4000
"""The most characters of a failure the model is shown (and the run records): a command's
stdout and stderr, each its last half of this; a check's reason, its first."""

DEFAULT_CHECK_TIMEOUT = 300.0
"""Seconds a `Verify.check` callable may take when none is given."""


@dataclass(frozen=True, slots=True)
class Verified:
    """What a check returns when the final answer holds."""

    detail: str = ""
    """Anything worth keeping in the run's record (bounded to `VERIFY_OUTPUT_CHARS`)."""
    kind: Literal["verified"] = "verified"

    def __post_init__(self) -> None:
        if not isinstance(self.detail, str):
            raise UserError("hr.Verified(detail) takes text")


@dataclass(frozen=True, slots=True)
class NotVerified:
    """What a check returns when the final answer does not hold; the model is told `reason`."""

    reason: str
    """What is wrong, in words the model can act on (bounded to `VERIFY_OUTPUT_CHARS`)."""
    kind: Literal["not_verified"] = "not_verified"

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise UserError("hr.NotVerified(reason) needs the reason, as non-empty text: the "
                            "model is told it")


@dataclass(frozen=True, slots=True)
class VerifyContext:
    """What a `Verify.check` callable is given."""

    workspace: Path
    """The agent's workspace (absolute)."""
    answer: str
    """The final answer being checked."""
    run_id: str
    """The run."""
    attempt: int
    """Which attempt this is, from 1."""
    deps: Any = None
    """The agent's `deps`."""


CheckFunction = Callable[[VerifyContext], Any]
"""`(ctx) -> hr.Verified() | hr.NotVerified(reason)`, or a coroutine function returning one."""


class _CheckCommand(ToolImpl):
    """The workspace `exec` tool, run as one check: its validation, actions and body.

    Its arguments are fixed: anything else (an approver's modified arguments) is refused, so
    no one can swap in a command that passes. Declared idempotent (a check is run again, not
    put to an operator, when a crash cut it off); its id stays `workspace/exec`, so policy
    rules and records see the exec tool.
    """

    def __init__(self, inner: ToolImpl, arguments: dict[str, Any]) -> None:
        self._inner = inner
        self._arguments = arguments
        self.spec = inner.spec.replace(idempotent=True)
        self.origin = "hr.Verify.command"
        self.needs_context = inner.needs_context

    def validate(self, arguments: Any) -> Any:
        """The exec tool's validation, and exactly the configured command."""
        validated = self._inner.validate(arguments)
        if self._inner.dump_arguments(validated) != self._arguments:
            raise InvalidArguments(str(self.spec.id), [Issue(
                path="$", message="a verification command runs exactly as configured "
                "(hr.Verify.command); its arguments cannot be changed")])
        return validated

    def actions(self, validated: Any) -> list[Any]:
        """EXEC of exactly the argv."""
        return self._inner.actions(validated)

    def bind(self, validated: Any, workspace: Any, decided: Any = None) -> Any:
        """As the exec tool binds."""
        return self._inner.bind(validated, workspace, decided)

    def dump_arguments(self, validated: Any) -> dict[str, Any]:
        """As the exec tool dumps."""
        return self._inner.dump_arguments(validated)

    def execute(self, validated: Any, ctx: CallContext | None) -> Any:
        """Run the program (the exec tool's body)."""
        return self._inner.execute(validated, ctx)


@functools.cache
def _exec_tool() -> ToolImpl:
    """The exec tool (imported on first use: a run without a command check needs none)."""
    from handrail.builtin import Exec

    return Toolbox([Exec]).get("workspace/exec")


class Verify:
    """How a run's final answer is checked before the run may complete.

    ```python
    agent = hr.Agent(model, tools, verify=hr.Verify.command(["pytest", "-q"], timeout=120))
    result = await agent.run("fix the failing test", verify=hr.Verify.check(my_check))
    ```

    Build one with `Verify.command` or `Verify.check`.
    """

    __slots__ = ("argv", "fn", "kind", "name", "timeout")

    def __init__(self, kind: Literal["command", "check"], *, argv: tuple[str, ...] = (),
                 fn: CheckFunction | None = None, name: str = "", timeout: float) -> None:
        self.kind = kind
        self.argv = argv
        self.fn = fn
        self.name = name
        self.timeout = timeout

    @classmethod
    def command(cls, argv: Sequence[str], *, timeout: float | None = None) -> Verify:
        """Check by running a program in the workspace: exit code 0 passes.

        It is a call of the workspace `exec` tool (`workspace/exec`, an EXEC action of exactly
        `argv`) through the gate: the policy decides it like any other call (the manifest's
        grants do not apply: the model does not call it), and it is recorded.

        Args:
            argv: The program and its arguments (no shell), e.g. `["pytest", "-q"]`.
            timeout: Seconds before the program is killed (a failed attempt); default 60, at
                most 600.

        Raises:
            UserError: `argv` or `timeout` is not what the exec tool accepts.
        """
        if isinstance(argv, str | bytes) or not isinstance(argv, Sequence):
            raise UserError("Verify.command takes the argv as a list of strings, e.g. "
                            "[\"pytest\", \"-q\"] (no shell string)")
        arguments: dict[str, Any] = {"argv": list(argv)}
        if timeout is not None:
            arguments["timeout"] = timeout
        impl = _exec_tool()
        try:
            validated = impl.validate(arguments)
        except InvalidArguments as exc:
            raise UserError(f"Verify.command: {exc}") from None
        dumped = impl.dump_arguments(validated)
        return cls("command", argv=tuple(dumped["argv"]), timeout=dumped.get("timeout") or 60.0)

    @classmethod
    def check(cls, fn: CheckFunction, *, timeout: float = DEFAULT_CHECK_TIMEOUT) -> Verify:
        """Check with a Python callable, sync or async, taking a `hr.VerifyContext`.

        It returns `hr.Verified()` or `hr.NotVerified(reason)`. An exception it raises, or
        running past `timeout`, is a failed attempt (the model is told); returning anything
        else ends the run `Failed` (a broken check never lets a run complete). A sync callable
        runs in a worker thread, abandoned (not killed) at the timeout.

        A run resumed in another process needs the same callable: an agent built with
        `verify=hr.Verify.check(fn)` for the same `fn` (matched by module and name).

        Raises:
            UserError: `fn` is not a callable taking one argument, or `timeout` is not a
                positive number.
        """
        if not callable(fn):
            raise UserError("Verify.check takes a callable (ctx: hr.VerifyContext) -> "
                            "hr.Verified() | hr.NotVerified(reason)")
        try:
            inspect.signature(fn).bind(None)
        except TypeError:
            raise UserError(f"Verify.check: {_name_of(fn)} must accept one argument, the "
                            "hr.VerifyContext") from None
        except ValueError:  # no signature to inspect (some builtins): called as documented
            pass
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
                not math.isfinite(timeout) or timeout <= 0:
            raise UserError("Verify.check: timeout must be a positive number of seconds")
        return cls("check", fn=fn, name=_name_of(fn), timeout=float(timeout))

    def arguments(self) -> dict[str, Any]:
        """A command's arguments for the exec tool."""
        return {"argv": list(self.argv), "timeout": self.timeout}

    def describe(self) -> str:
        """The check in words: the command line, or the callable's name."""
        if self.kind == "command":
            return f"the command `{shlex.join(self.argv)}`"
        return f"the check {self.name}"

    def to_dict(self) -> dict[str, Any]:
        """What the run records of its check."""
        if self.kind == "command":
            return {"kind": "command", "argv": list(self.argv), "timeout": self.timeout}
        return {"kind": "check", "name": self.name, "timeout": self.timeout}

    def __repr__(self) -> str:
        return f"Verify({self.to_dict()!r})"


def _name_of(fn: object) -> str:
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}"


def check_max_attempts(value: object) -> int:
    """`max_verify_attempts`, checked.

    Raises:
        UserError: not a positive integer.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"max_verify_attempts must be a positive integer, not {value!r}")
    return value


class _Loop(Protocol):
    """What of the agent loop (`runs._agent._Runner`) a verification uses."""

    run: RunRecord
    messages: list[Any]
    store: Store
    scope: RunScope
    turns: int
    _pending_message: tuple[str, int, dict[str, Any]] | None

    def _run_update(self, **changes: Any) -> RunRecord: ...

    async def _end(self, outcome: RunOutcome, status: RunStatus,
                   batch: Batch | None = None) -> RunResult: ...

    async def _emit(self, kind: EventKind, **detail: Any) -> None: ...


class Verification:
    """One run's check and its limit; the attempts themselves live in the run's events."""

    def __init__(self, verify: Verify, max_attempts: int) -> None:
        self.verify = verify
        self.max_attempts = max_attempts

    def event(self) -> dict[str, Any]:
        """The run event that records the check a run is held to (written when it starts)."""
        return {"kind": "verify", "check": self.verify.to_dict(),
                "max_attempts": self.max_attempts, "at": time.time()}

    @classmethod
    def of_run(cls, run: RunRecord, given: Verify | None) -> Verification | None:
        """The verification a run recorded, or None when it has none.

        A command is rebuilt from the record (the recorded one is the run's contract, whatever
        the resuming agent says); a callable cannot be recorded, so `given` must be a check of
        the same name.

        Raises:
            ResumeRefused: the run checks with a callable this agent does not have.
        """
        recorded = next((e for e in reversed(run.events) if e.get("kind") == "verify"), None)
        if recorded is None:
            return None
        spec = recorded.get("check") or {}
        max_attempts = int(recorded.get("max_attempts") or 1)
        if spec.get("kind") == "command":
            return cls(Verify.command(list(spec.get("argv") or ()),
                                      timeout=spec.get("timeout")), max_attempts)
        name = str(spec.get("name"))
        if given is None or given.kind != "check" or given.name != name:
            raise ResumeRefused(
                f"run {run.id} checks its final answer with the callable {name}, and this "
                "agent has no such check: build the agent with verify=hr.Verify.check("
                f"{name.rpartition('.')[2]}) (the same function) to resume it"
            )
        return cls(Verify("check", fn=given.fn, name=name,
                          timeout=float(spec.get("timeout") or given.timeout)), max_attempts)

    @staticmethod
    def attempts(run: RunRecord) -> list[VerificationAttempt]:
        """Every attempt the run has recorded, in order."""
        return [VerificationAttempt.from_dict(e) for e in run.events
                if e.get("kind") == "verification"]

    async def step(self, loop: _Loop) -> RunResult | None:
        """Check the final answer that ends `loop.messages`.

        Returns the run's result when it ends (passed, failed for good) or pauses (the
        command waits for an approval), or None when the model was told of a failure and the
        loop goes on.
        """
        run = loop.run
        last = loop.messages[-1]
        assert isinstance(last, AssistantMessage)
        answer = last.text
        turn = loop.turns - 1
        done = self.attempts(run)
        number = len(done) + 1
        first = Batch(run=loop._run_update())
        pending = loop._pending_message
        # The answer not yet stored means this turn is new; stored, the run was resumed here
        # and the check may have left a call record behind.
        fresh = pending is not None and pending[1] == len(loop.messages) - 1
        if pending is not None:
            first.messages.append(pending)
            loop._pending_message = None
        fatal: str | None = None
        if self.verify.kind == "command":
            ran = await self._command(loop, turn, number, fresh, first)
            if isinstance(ran, RunResult):
                return ran
            attempt, fatal, batch = ran
        else:
            await loop.store.write(first)
            attempt, fatal = await self._check(loop, answer, number, turn)
            batch = Batch()
        loop._run_update(events=[*run.events, {"kind": "verification", **attempt.to_dict()}])
        await loop._emit("verification", **attempt.to_dict())
        if attempt.passed:
            return await loop._end(Completed(answer), RunStatus.COMPLETED, batch)
        attempts = [*done, attempt]
        if fatal is None and number >= self.max_attempts:
            fatal = (f"the final answer failed its verification {number} time"
                     f"{'s' if number > 1 else ''} (max_verify_attempts={self.max_attempts});"
                     f" the last: {_cut(attempt.reason, 500)}")
        if fatal is not None:
            return await loop._end(Failed(fatal, verification=VerificationFailed(fatal, attempts)),
                                   RunStatus.FAILED, batch)
        feedback = UserMessage(self._feedback(attempt))
        loop.messages.append(feedback)
        batch.messages.append((run.id, len(loop.messages) - 1, dump_messages([feedback])[0]))
        batch.run = loop._run_update()
        await loop.store.write(batch)
        return None

    def _feedback(self, attempt: VerificationAttempt) -> str:
        left = self.max_attempts - attempt.attempt
        text = (f"Your final answer was checked, and the check failed (attempt "
                f"{attempt.attempt} of {self.max_attempts}): {attempt.reason}.")
        if attempt.output:
            text += f"\n\n{attempt.output}"
        return text + (f"\n\nThe task is not done: fix what the check reports, then give your "
                       f"final answer again ({left} more check{'s' if left != 1 else ''} "
                       "allowed).")

    async def _command(self, loop: _Loop, turn: int, number: int, fresh: bool, first: Batch
                       ) -> RunResult | tuple[VerificationAttempt, str | None, Batch]:
        # The run's own scope (policy, remembered rules, approver, store), offering only the
        # check: the manifest grants what the model may call, and the model does not call this.
        impl = _exec_tool()
        arguments = impl.dump_arguments(impl.validate(self.verify.arguments()))
        commands = Toolbox([_CheckCommand(impl, arguments)])
        scope = dataclasses.replace(loop.scope, toolbox=commands, manifest=None)
        existing: dict[str, CallRecord] = {}
        if not fresh:
            existing = {c.call_id: c for c in await loop.store.calls(loop.run.id)
                        if c.turn == turn}
        if existing:
            record = next(iter(existing.values()))
            call = ToolCall(record.call_id, record.model_name, record.arguments)
        else:
            # A fresh random id: a model's call ids are its own text and must not be able to
            # name (and so overwrite) the record of a check.
            call = ToolCall(f"verify-{number}-{uuid.uuid4().hex[:12]}",
                            impl.spec.id.model_name, json.dumps(arguments))
        result = await Gate(scope).drive_turn(turn, [call], existing, first)
        loop.scope.policy = scope.policy  # rules an approver asked to remember
        if result.pause is not None:
            paused = pause_outcome(result.pause)
            return await loop._end(paused, RunStatus(paused.kind), result.final)
        record = result.final.calls[0]
        tool_result = result.results[0].result
        now = time.time()
        base: dict[str, Any] = {"attempt": number, "call_id": record.id, "turn": turn,
                                "at": now}
        if record.status is CallStatus.REFUSED:
            why = record.error or "refused"
            shown = tool_result.render_text()
            reason = (f"{self.verify.describe()} was refused ({why}"
                      + ("" if shown in why else f"; {shown}") + ")")
            fatal = (f"the final answer cannot be verified: {reason}. Allow the command in the "
                     "policy (or approve it), or change the check")
            return VerificationAttempt(passed=False, reason=reason, **base), fatal, result.final
        return self._judged(tool_result, base), None, result.final

    def _judged(self, result: ToolResult, base: dict[str, Any]) -> VerificationAttempt:
        value = result.structured
        described = self.verify.describe()
        if not isinstance(value, dict) or "exit_code" not in value:
            # The program did not run (not found, not executable) or the tool failed.
            return VerificationAttempt(passed=False, reason=f"{described} could not run: "
                                       f"{_cut(result.render_text(), 500)}", **base)
        output = _projected(value)
        if value.get("timed_out"):
            return VerificationAttempt(
                passed=False, output=output, **base,
                reason=f"{described} did not finish within {self.verify.timeout:g}s and was "
                       "killed")
        code = value.get("exit_code")
        exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        if exit_code == 0:
            return VerificationAttempt(passed=True, exit_code=0, output=output, **base)
        return VerificationAttempt(passed=False, exit_code=exit_code, output=output, **base,
                                   reason=f"{described} exited with code {code}")

    async def _check(self, loop: _Loop, answer: str, number: int, turn: int
                     ) -> tuple[VerificationAttempt, str | None]:
        verify = self.verify
        fn = verify.fn
        assert fn is not None
        workspace = loop.scope.workspace
        ctx = VerifyContext(workspace=Path(workspace), answer=answer, run_id=loop.run.id,
                            attempt=number, deps=loop.scope.deps)
        base: dict[str, Any] = {"attempt": number, "turn": turn}
        out: object = None
        with anyio.move_on_after(verify.timeout) as deadline:
            try:
                if inspect.iscoroutinefunction(fn):
                    out = await fn(ctx)
                else:
                    out = await anyio.to_thread.run_sync(fn, ctx, abandon_on_cancel=True)
                if inspect.isawaitable(out):
                    out = await out
            except Exception as exc:  # boundary: the check's failure is a failed attempt
                text = scrub_host_paths(f"{type(exc).__name__}: {exc}", workspace)
                return VerificationAttempt(passed=False, at=time.time(), **base,
                                           reason=f"{verify.describe()} raised "
                                                  f"{_cut(text, VERIFY_OUTPUT_CHARS)}"), None
        if deadline.cancelled_caught:
            return VerificationAttempt(passed=False, at=time.time(), **base,
                                       reason=f"{verify.describe()} did not finish within "
                                              f"{verify.timeout:g}s"), None
        if isinstance(out, Verified):
            return VerificationAttempt(passed=True, output=_cut(out.detail, VERIFY_OUTPUT_CHARS),
                                       at=time.time(), **base), None
        if isinstance(out, NotVerified):
            return VerificationAttempt(passed=False, at=time.time(), **base,
                                       reason=_cut(out.reason, VERIFY_OUTPUT_CHARS)), None
        shown = _cut(repr(out), 200)
        reason = f"{verify.describe()} returned {shown}, not hr.Verified() or hr.NotVerified()"
        return (VerificationAttempt(passed=False, reason=reason, at=time.time(), **base),
                f"the final answer cannot be verified: {reason}; fix the check")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[… the first {len(text) - limit} characters cut …]\n" + text[-limit:]


def _projected(value: dict[str, Any]) -> str:
    """A command's output as the model is shown it: the end of each stream, bounded."""
    parts = []
    for name in ("stdout", "stderr"):
        text = value.get(name)
        if isinstance(text, str) and text.strip():
            parts.append(f"{name}:\n{_tail(text, VERIFY_OUTPUT_CHARS // 2)}")
    return "\n\n".join(parts)
