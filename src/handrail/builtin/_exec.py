"""The `exec` tool: run a program (an argv, never a shell string) in the workspace.

Cancellation: the deadline is our own and becomes `timed_out: true` in the result. A
cancellation from outside (the call's deadline, the run being cancelled) is never swallowed:
the process group is terminated (SIGTERM, a grace period, SIGKILL: `handrail.host`) and
reaped under a shielded scope, then the cancellation propagates.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from pydantic import Field, field_validator

from handrail.builtin._fs import workspace_root
from handrail.host import (
    PASSED_ENVIRONMENT,
    ProcessCapture,
    Projection,
    current_call,
    hand_over,
    passed_environment,
    run_process,
)
from handrail.policy import is_inside, resolve_program
from handrail.sandbox import SandboxUnavailable, wrap
from handrail.tools import Act, Action, CallContext, Json, Tool, ToolResult

__all__ = ["EXEC_DEFAULT_TIMEOUT", "EXEC_MAX_TIMEOUT", "EXEC_OUTPUT_LIMIT_BYTES",
           "PASSED_ENVIRONMENT", "Exec"]

EXEC_DEFAULT_TIMEOUT = 60.0
"""Seconds a program may run when the call gives no timeout."""
EXEC_MAX_TIMEOUT = 600.0
"""The longest timeout a call may ask for."""
EXEC_OUTPUT_LIMIT_BYTES = 64 * 1024
"""Each of stdout and stderr is shown as its first and last half of this many bytes (the
rest is read and counted; the disk record, when kept, has all of it)."""


class Exec(Tool, server="workspace", name="exec", mutates=True, protected=["/argv"]):
    """Run a program in the workspace directory and return its exit code and output.

    `argv` is the program and its arguments as a list (no shell: pipes, globs and `&&` are
    not interpreted; run `["sh", "-c", "..."]` if a shell is really needed). stdin is empty;
    stdout and stderr are returned, each cut at 64 KiB. A non-zero exit code is reported, not
    treated as a failure of the tool. The program is killed when the timeout passes.
    """

    argv: list[str] = Field(min_length=1)
    """The program and its arguments, e.g. ["git", "status"]."""
    timeout: float | None = Field(default=None, gt=0, le=EXEC_MAX_TIMEOUT)
    """Seconds before the program is killed; default 60, at most 600."""

    @field_validator("argv")
    @classmethod
    def _plain_strings(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the program (argv[0]) must not be empty")
        if any("\x00" in arg for arg in value):
            raise ValueError("an argument contains a NUL byte")
        return value

    def actions(self) -> list[Action]:
        """Executes exactly this argv."""
        return [Action(Act.EXEC, tuple(self.argv))]

    async def run(self, ctx: CallContext) -> ToolResult:
        """Run the program."""
        root = workspace_root(ctx, files=False)
        timeout = self.timeout if self.timeout is not None else EXEC_DEFAULT_TIMEOUT
        # Run the very file the policy decided on: argv[0] resolved the same way (PATH lookup
        # skipping the workspace, or a canonical path), never re-resolved by the OS.
        program = resolve_program(self.argv[0], root)
        if program.path is None:
            return ToolResult.error(f"program {self.argv[0]!r} not found on PATH (a program in "
                                    "the workspace is run by its path, e.g. './script')")
        if program.real != program.path and is_inside(program.path, root):
            # A link in the workspace can be re-pointed between the check and the run (by
            # another call of the same turn): the policy decided on the name, so refuse.
            return ToolResult.error(f"program {self.argv[0]!r} is a symbolic link inside the "
                                    "workspace; run the program it points to by its own path")
        argv = [program.path, *self.argv[1:]]
        try:
            # Confined as the policy in force says (docs/sandbox.md); off the loop: it walks
            # the workspace to expand the policy's denied paths.
            argv, confinement = await anyio.to_thread.run_sync(
                lambda: wrap(argv, policy=ctx.policy, workspace=root, mode=ctx.sandbox,
                             model_argv=True))
        except SandboxUnavailable as exc:
            return ToolResult.error(str(exc))
        # Spawning, killing the group and projecting the output: the one implementation,
        # shared with programs as tools (handrail.host). Spawned from the event loop's thread:
        # bwrap's --die-with-parent follows the spawning thread.
        slot = current_call()
        projection = (slot.projection if slot is not None and slot.projection is not None
                      else _PROJECTION)
        capture = ProcessCapture.new(projection,
                                     keep_full=slot is not None and slot.path is not None)
        try:
            await run_process(argv, capture, cwd=root, env=passed_environment(),
                              timeout=timeout,
                              bwrap=confinement.get("mechanism") == "bwrap")
        finally:
            hand_over(capture, source="exec")
        if capture.spawn_error is not None:
            return ToolResult.error(_spawn_message(self.argv[0], capture.spawn_error))
        record = None if slot is None else slot.output_path
        timed_out = capture.timed_out
        value: dict[str, Any] = {
            "exit_code": capture.exit_code,
            "timed_out": timed_out,
            "stdout": capture.stdout.project(record),
            "stderr": capture.stderr.project(record),
            "stdout_truncated": capture.stdout.cut,
            "stderr_truncated": capture.stderr.cut,
            "sandbox": confinement,
        }
        if timed_out:
            value["note"] = f"killed after the {timeout:g}s timeout"
        elif capture.signal is not None and not capture.signal_ours:
            value["note"] = f"killed by signal {capture.signal}, not sent by handrail"
        # A non-zero exit is information for the model, not a tool failure; a timeout is.
        return ToolResult((Json(value),), value, is_error=timed_out)


_PROJECTION = Projection(EXEC_OUTPUT_LIMIT_BYTES // 2, EXEC_OUTPUT_LIMIT_BYTES // 2)


def _spawn_message(program: str, problem: str) -> str:
    if "not found" in problem:
        return (f"program {program!r} not found (looked on PATH and relative to the "
                "workspace)")
    if "not executable" in problem:
        return f"program {program!r} is not executable"
    return problem
