"""Spawning, killing and projecting a program's output: the one implementation.

The workspace `exec` tool and `SubprocessTool` both run programs through `run_process`:

- the program runs in its own process group (a new session), with only the environment it
  is given;
- stdin is the given bytes, then closed (or empty);
- stdout and stderr are read to the end concurrently (a program blocked on a full pipe would
  never exit), each kept as its first `head` and last `tail` bytes, with totals, and in full
  (up to `RECORD_LIMIT_BYTES`) when a disk record wants it;
- on the deadline, or when the call is cancelled from outside: SIGTERM to the group, a grace
  period, then SIGKILL to every descendant and to the group (children that ignore SIGTERM
  included; those in a session of their own too, which the launcher of `handrail.sandbox`
  keeps below the program as a subreaper).

Cancellation: an outside cancellation is never swallowed; the group is terminated and the
process reaped under a shielded scope bounded by the grace period, then it propagates.

Every group started here is in a registry from spawn to reap, so an emergency stop (a second
Ctrl-C) can SIGKILL all of them at once with `kill_all_now`, grace periods or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_HEAD_BYTES",
    "DEFAULT_TAIL_BYTES",
    "PASSED_ENVIRONMENT",
    "RECORD_LIMIT_BYTES",
    "ProcessCapture",
    "Projection",
    "StreamCapture",
    "kill_all_now",
    "passed_environment",
    "run_process",
]

PASSED_ENVIRONMENT = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR",
    "TZ", "SYSTEMROOT", "COMSPEC", "PATHEXT", "WINDIR", "TEMP", "TMP",
})
"""The only environment variables a program inherits: the host's API keys and tokens stay out."""

DEFAULT_HEAD_BYTES = 16 * 1024
"""Bytes of each stream shown from its start."""
DEFAULT_TAIL_BYTES = 16 * 1024
"""Bytes of each stream shown from its end."""
DEFAULT_GRACE_SECONDS = 5.0
"""Between SIGTERM and SIGKILL."""
RECORD_LIMIT_BYTES = 64 * 1024 * 1024
"""The most of one stream a disk record keeps (the rest is counted, not kept)."""

_REAP_SECONDS = 5.0  # after SIGKILL: the kernel has to deliver it and we have to reap


_LIVE: dict[int, Process] = {}
"""The programs started by `run_process` and not yet reaped, by process (= group) id."""


def kill_all_now() -> None:
    """SIGKILL every process group `run_process` started and has not reaped, at once.

    For an emergency stop (a second Ctrl-C while the first one's cleanup waits out a grace
    period). Safe to call from a signal handler: it only sends signals; each `run_process`
    then reaps its own program as usual.
    """
    for process in list(_LIVE.values()):
        _kill_tree(process.pid)
        _signal_group(process, signal.SIGKILL)


def passed_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlisted variables of this process's environment, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k.upper() in PASSED_ENVIRONMENT}
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True, slots=True)
class Projection:
    """How much of each stream the model is shown: the first `head` and last `tail` bytes."""

    head: int = DEFAULT_HEAD_BYTES
    """Bytes from the start of a stream."""
    tail: int = DEFAULT_TAIL_BYTES
    """Bytes from its end."""

    def __post_init__(self) -> None:
        for name in ("head", "tail"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Projection.{name} must be a non-negative integer, "
                                 f"got {value!r}")


class StreamCapture:
    """One stream: its head and tail bytes, its totals, and (when kept) all of it."""

    __slots__ = ("full", "full_truncated", "head", "head_limit", "lines", "name", "tail",
                 "tail_limit", "total")

    def __init__(self, name: str, projection: Projection, *, keep_full: bool = False) -> None:
        self.name = name
        self.head_limit = projection.head
        self.tail_limit = projection.tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.lines = 0
        self.full: bytearray | None = bytearray() if keep_full else None
        self.full_truncated = False

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the stream (memory stays bounded by head + tail)."""
        full = self.full
        if full is not None:
            room = RECORD_LIMIT_BYTES - len(full)
            if room >= len(chunk):
                full += chunk
            else:
                full += chunk[:max(room, 0)]
                self.full_truncated = True
        self.total += len(chunk)
        self.lines += chunk.count(b"\n")
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def raw(self) -> bytes | None:
        """Everything, when kept."""
        return None if self.full is None else bytes(self.full)

    @property
    def cut(self) -> bool:
        """Whether the projection leaves bytes out."""
        return self.total > len(self.head) + len(self.tail)

    def project(self, record: str | None = None) -> str:
        """The model's view: head, a marker line when bytes are left out, tail.

        Non-UTF-8 bytes are replaced (the disk record keeps them raw).
        """
        if not self.cut:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        lines = self.lines + (0 if self.total == 0 or self._ends_with_newline() else 1)
        marker = (f"[{self.name}: {self.total} bytes, {lines} lines in all; showing the first "
                  f"{len(self.head)} and the last {len(self.tail)} bytes, {omitted} bytes "
                  f"left out; " + (f"full record: {record}]" if record else "no full record "
                                   "kept]"))
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace")
        sep = "" if head.endswith("\n") or not head else "\n"
        return f"{head}{sep}{marker}\n{tail}"

    def _ends_with_newline(self) -> bool:
        last = self.tail or self.head
        return bool(last) and last[-1:] == b"\n"


@dataclass(kw_only=True)
class ProcessCapture:
    """What became of one program run: filled in by `run_process`, even when it is cancelled."""

    stdout: StreamCapture
    """Standard output."""
    stderr: StreamCapture
    """Standard error."""
    exit_code: int | None = None
    """The exit status (negative: killed by that signal); None while running."""
    signal: str | None = None
    """The name of the signal that ended it (`SIGKILL`), if one did."""
    signal_ours: bool = False
    """Whether handrail sent the signals (deadline, cancel); False: someone else killed it."""
    timed_out: bool = False
    """Whether the deadline passed and the group was terminated."""
    spawn_error: str | None = None
    """Why the program could not be started; then nothing ran."""
    started: float | None = None
    """Wall-clock start (seconds since the epoch)."""
    ended: float | None = None
    """Wall-clock end."""
    pid: int | None = None
    """The process id (also its process group id)."""
    notes: list[str] = field(default_factory=list)
    """Lines for the envelope (why it ended, if it did not end by itself)."""

    @classmethod
    def new(cls, projection: Projection | None = None, *, keep_full: bool = False
            ) -> ProcessCapture:
        """An empty capture with these projection limits."""
        projection = projection or Projection()
        return cls(stdout=StreamCapture("stdout", projection, keep_full=keep_full),
                   stderr=StreamCapture("stderr", projection, keep_full=keep_full))

    def envelope(self, record: str | None = None) -> str:
        """The model's text: `Exit code: N`, stdout, then `--- stderr ---` and stderr if any.

        Never empty. `record` is the path of the full disk record, named in any marker line.
        """
        code = "none" if self.exit_code is None else str(self.exit_code)
        parts = [f"Exit code: {code}"]
        if self.spawn_error is not None:
            parts.append(f"The program could not be started: {self.spawn_error}")
        if self.signal is not None:
            who = ("sent by handrail" if self.signal_ours
                   else "not sent by handrail: something else killed it")
            parts.append(f"Killed by signal {self.signal} ({who})")
        parts.extend(self.notes)
        out = self.stdout.project(record)
        if out:
            parts.append(out.removesuffix("\n"))
        if self.stderr.total:
            parts.append("--- stderr ---")
            parts.append(self.stderr.project(record).removesuffix("\n"))
        return "\n".join(parts)

    @property
    def failed(self) -> bool:
        """A non-zero exit, a signal, a spawn failure or a deadline: an `is_error` result."""
        return self.exit_code != 0 or self.timed_out or self.spawn_error is not None


async def run_process(
    argv: Sequence[str],
    capture: ProcessCapture,
    *,
    stdin: bytes | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 - ours: it ends in capture.timed_out
    grace: float = DEFAULT_GRACE_SECONDS,
    bwrap: bool = False,
) -> None:
    """Run `argv` to its end (or its deadline), filling `capture` as it goes.

    Args:
        argv: The program and its arguments (no shell).
        capture: Where output and the exit status go; complete even if this is cancelled.
        stdin: Bytes written to the program's stdin, which is then closed; None: empty.
        cwd: Its working directory.
        env: Its whole environment (nothing is inherited beyond it).
        timeout: Seconds before the group is terminated (`capture.timed_out`); the deadline
            covers reading the output too, so a background child holding the pipes open
            cannot hold the call.
        grace: Seconds between SIGTERM and SIGKILL.
        bwrap: `argv` is a bubblewrap command line (`handrail.sandbox.wrap` said mechanism
            "bwrap"): its status report (`--json-status-fd`) tells the program's own exit
            from bubblewrap failing to start it, which its exit code alone does not.
    """
    status_read = status_write = -1
    spawned = False
    if bwrap:
        from handrail.sandbox._sandbox import SECCOMP_FD, bwrap_index

        status_read, status_write = os.pipe()
        if status_write == SECCOMP_FD:  # the trampoline opens the filter there
            moved = os.dup(status_write)
            os.close(status_write)
            status_write = moved
        os.set_blocking(status_read, False)
        # bwrap's options are not positional: this one goes right after the executable
        # (which follows the trampoline that opens its seccomp filter, when there is one).
        at = bwrap_index(argv) + 1
        argv = [*argv[:at], "--json-status-fd", str(status_write), *argv[at:]]
    try:
        # Shielded: a cancel that landed while the spawn was awaited would lose the process
        # (started, never registered, never killed: its tree outlives the call). The spawn is
        # bounded (fork and exec); the cancel is delivered at the first await after it, inside
        # the try below, whose cleanup kills the group.
        with anyio.CancelScope(shield=True):
            process = await anyio.open_process(
                list(argv),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=sys.platform != "win32",
                pass_fds=(status_write,) if bwrap else (),
            )
    except FileNotFoundError:
        capture.exit_code, capture.spawn_error = 127, f"{argv[0]!r} was not found"
        return
    except PermissionError:
        capture.exit_code, capture.spawn_error = 126, f"{argv[0]!r} is not executable"
        return
    except OSError as exc:
        capture.exit_code = 126
        capture.spawn_error = f"could not start {argv[0]!r}: {exc.strerror or exc}"
        return
    else:
        spawned = True
    finally:
        if bwrap:
            os.close(status_write)
            if not spawned:
                os.close(status_read)
    capture.pid = process.pid
    capture.started = time.time()
    _LIVE[process.pid] = process
    finished = False
    try:
        with anyio.move_on_after(timeout) as scope:
            async with anyio.create_task_group() as tg:
                assert process.stdout is not None and process.stderr is not None
                tg.start_soon(_drain, process.stdout, capture.stdout)
                tg.start_soon(_drain, process.stderr, capture.stderr)
                if stdin:
                    assert process.stdin is not None
                    tg.start_soon(_feed, process.stdin, stdin)
                await process.wait()
        capture.timed_out = scope.cancelled_caught
        finished = True
    finally:
        with anyio.move_on_after(grace + _REAP_SECONDS, shield=True):
            if not finished or capture.timed_out or process.returncode is None:
                await _terminate(process, grace, capture)
            await process.aclose()
        if process.returncode is not None:
            # Reaped: its pid may be reused from now on, so it must not be signalled again.
            # (Not reaped within the bound: it stays, so an emergency stop still kills it.)
            _LIVE.pop(process.pid, None)
        capture.ended = time.time()
        code = process.returncode
        capture.exit_code = code
        if code is not None and code < 0:
            try:
                capture.signal = signal.Signals(-code).name
            except ValueError:
                capture.signal = f"signal {-code}"
        if bwrap:
            _bwrap_status(status_read, capture)
        if capture.timed_out:
            capture.notes.append(f"Killed after the {timeout:g}s timeout (SIGTERM to its "
                                 f"process group, SIGKILL after {grace:g}s)")


_BWRAP_STATUS_LIMIT = 64 * 1024
"""Bytes of bwrap's status report read (two short JSON lines; the program cannot write it)."""
_BWRAP_EXEC = re.compile(r"^bwrap: execvp (.*): ([^:\n]*)$", re.MULTILINE)


def _bwrap_status(fd: int, capture: ProcessCapture) -> None:
    """Correct `capture` from bwrap's status report (then close `fd`).

    bwrap writes `{"child-pid": N, ...}` once its child exists and `{"exit-code": N}` when
    the program has ended; no exit-code means the program never ran (bwrap's own setup or
    its execvp failed, said on stderr) and bwrap's exit code (1) is not the program's.
    A program killed by signal N is reported as exit code 128+N, exactly like a program
    that exited with 128+N: bwrap does not tell them apart, so neither can the record.
    """
    try:
        data = b""
        with contextlib.suppress(BlockingIOError):
            while len(data) < _BWRAP_STATUS_LIMIT:
                chunk = os.read(fd, _BWRAP_STATUS_LIMIT)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(fd)
    code = capture.exit_code
    if code is None or code < 0 or capture.signal_ours:
        # bwrap itself was killed (by someone else), or by us (a deadline, a cancel): it
        # then exits without a report, which must not read as "could not start it".
        return
    exit_code: int | None = None
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            report = json.loads(line)
            if isinstance(report, dict) and isinstance(report.get("exit-code"), int):
                exit_code = report["exit-code"]
    if exit_code is None:
        said = (bytes(capture.stderr.head) + bytes(capture.stderr.tail)).decode("utf-8",
                                                                                "replace")
        failed = _BWRAP_EXEC.search(said)
        if failed is not None and failed.group(2) == "No such file or directory":
            capture.exit_code = 127
            capture.spawn_error = f"{failed.group(1)!r} was not found"
        elif failed is not None and failed.group(2) == "Permission denied":
            capture.exit_code = 126
            capture.spawn_error = f"{failed.group(1)!r} is not executable"
        else:
            capture.exit_code = 126
            last = said.strip().splitlines()[-1:] or [f"bwrap exited with {code}"]
            capture.spawn_error = f"the sandbox (bubblewrap) could not start it: {last[0]}"
        return
    capture.exit_code = exit_code
    if 128 < exit_code <= 128 + 64:
        try:
            name = signal.Signals(exit_code - 128).name
        except ValueError:
            return
        capture.notes.append(
            f"Exit code {exit_code}: the program exited with {exit_code} or was killed by "
            f"signal {name} (not sent by handrail); inside the sandbox the two look the same")


async def _drain(stream: ByteReceiveStream, into: StreamCapture) -> None:
    # Keep reading past any limit: a program blocked on a full pipe would never exit.
    async for chunk in stream:
        into.feed(chunk)


async def _feed(stream: ByteSendStream, data: bytes) -> None:
    # A program that exits without reading its input is not an error of ours.
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError,
                             BrokenPipeError, ConnectionResetError):
        await stream.send(data)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError,
                             BrokenPipeError, ConnectionResetError, OSError):
        await stream.aclose()


async def _terminate(process: Process, grace: float, capture: ProcessCapture) -> None:
    """SIGTERM to the group, up to `grace` for the whole group to go, then SIGKILL to it."""
    capture.signal_ours = True
    pgid = process.pid
    _signal_group(process, signal.SIGTERM)
    with anyio.move_on_after(grace):
        await process.wait()
        # The leader is gone; its children may still be there (one that ignores SIGTERM).
        # Polling is the only way to see a process group empty; it is bounded by `grace`.
        while _group_alive(pgid):  # noqa: ASYNC110 - no event tells a group is empty
            await anyio.sleep(0.02)
    # Before the leader goes: under the launcher (sandbox "off", Landlock) it is a subreaper
    # holding every descendant, `setsid()` ones included, in its tree; killed first, they
    # would be re-parented to init and outlive the call.
    await anyio.to_thread.run_sync(_kill_tree, pgid)
    _signal_group(process, signal.SIGKILL)
    await process.wait()


def _kill_tree(pid: int) -> None:
    if sys.platform.startswith("linux"):
        from handrail.sandbox._landlock import kill_descendants

        kill_descendants(pid, reap=False)  # their parents reap them, not this process


def _signal_group(process: Process, sig: signal.Signals) -> None:
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)


def _group_alive(pgid: int) -> bool:
    if sys.platform == "win32":
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
