"""The `exec` tool: run a program (an argv, never a shell string) in the workspace.

Cancellation: the deadline is our own and becomes `timed_out: true` in the result. A
cancellation from outside (the call's deadline, the run being cancelled) is never swallowed:
the process group is killed and reaped under a shielded scope, then the cancellation
propagates.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, Process
from pydantic import Field, field_validator

from handrail.builtin._fs import workspace_root
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
"""Each of stdout and stderr is cut to this many bytes (the rest is read and discarded)."""
PASSED_ENVIRONMENT = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR",
    "TZ", "SYSTEMROOT", "COMSPEC", "PATHEXT", "WINDIR", "TEMP", "TMP",
})
"""The only environment variables a program inherits: the host's API keys and tokens stay out."""

_REAP_SECONDS = 5.0


class _Capture:
    """The first `limit` bytes of a stream, and how many bytes it carried in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.total = 0

    async def drain(self, stream: ByteReceiveStream) -> None:
        # Keep reading past the limit: a program blocked on a full pipe would never exit.
        async for chunk in stream:
            self.total += len(chunk)
            room = self.limit - len(self.data)
            if room > 0:
                self.data += chunk[:room]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.truncated:
            text += f"\n[truncated: {self.total} bytes in all, the first {len(self.data)} shown]"
        return text


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
                lambda: wrap(argv, policy=ctx.policy, workspace=root, mode=ctx.sandbox))
        except SandboxUnavailable as exc:
            return ToolResult.error(str(exc))
        try:
            process = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=root,
                env={k: v for k, v in os.environ.items() if k.upper() in PASSED_ENVIRONMENT},
                start_new_session=sys.platform != "win32",
            )
        except FileNotFoundError:
            return ToolResult.error(f"program {self.argv[0]!r} not found (looked on PATH and "
                                    "relative to the workspace)")
        except PermissionError:
            return ToolResult.error(f"program {self.argv[0]!r} is not executable")
        except OSError as exc:
            return ToolResult.error(f"could not start {self.argv[0]!r}: {exc.strerror or exc}")
        stdout = _Capture(EXEC_OUTPUT_LIMIT_BYTES)
        stderr = _Capture(EXEC_OUTPUT_LIMIT_BYTES)
        timed_out = False
        try:
            # The deadline covers reading the output too: a background child that keeps the
            # pipes open must not hold the call past its timeout.
            with anyio.move_on_after(timeout) as scope:
                async with anyio.create_task_group() as tg:
                    assert process.stdout is not None and process.stderr is not None
                    tg.start_soon(stdout.drain, process.stdout)
                    tg.start_soon(stderr.drain, process.stderr)
                    await process.wait()
            timed_out = scope.cancelled_caught
        finally:
            with anyio.move_on_after(_REAP_SECONDS, shield=True):
                if timed_out or process.returncode is None:
                    _kill_group(process)
                await process.aclose()
        code = process.returncode
        value: dict[str, Any] = {
            "exit_code": code,
            "timed_out": timed_out,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "stdout_truncated": stdout.truncated,
            "stderr_truncated": stderr.truncated,
            "sandbox": confinement,
        }
        if timed_out:
            value["note"] = f"killed after the {timeout:g}s timeout"
        # A non-zero exit is information for the model, not a tool failure; a timeout is.
        return ToolResult((Json(value),), value, is_error=timed_out)


def _kill_group(process: Process) -> None:
    """Kill the program and everything it started in its session."""
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
