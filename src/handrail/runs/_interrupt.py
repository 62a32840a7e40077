"""The second Ctrl-C: while a turn's calls are being run or settled, kill everything at once.

The first SIGINT is left to the event loop (asyncio cancels the main task; elsewhere it is a
KeyboardInterrupt): the turn is settled and each program handrail started gets SIGTERM and its
grace period. A second SIGINT while that cleanup is still running SIGKILLs every process group
handrail started (programs of `exec` and `SubprocessTool`, tool controls), then goes on to the
handler that was there before (asyncio's, or Python's default: a KeyboardInterrupt), so the
process exits without waiting out any grace period.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C core; typeshed has no stub
import os
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any

from handrail.approval import kill_running_controls
from handrail.host import kill_all_now

__all__ = ["interrupt_handler_kept", "second_interrupt_kills"]

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_SIGINT = int(signal.SIGINT)
_SIG_IGN = int(signal.SIG_IGN)

_depth = 0  # blocks that keep our handler installed (the outermost installed it)
_armed = 0  # turns in progress: only then does a SIGINT count
_seen = 0
_previous: _Handler = None


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _seen
    if _armed:
        _seen += 1
        if _seen >= 2:
            # Only signals are sent here; each run reaps its own programs as it unwinds.
            kill_all_now()
            kill_running_controls()
    previous = _previous
    if callable(previous):
        previous(signum, frame)
    else:  # SIG_DFL (SIG_IGN is never replaced)
        signal.default_int_handler(signum, frame)


def _install() -> bool:
    """Put our handler in (or share it when it is in already); False where we must not."""
    global _depth, _previous
    # `_signal` rather than `signal`: the latter converts every handler to and from an
    # enum, which made this block a tenth of a memory-store turn's CPU (issue 11).
    if (threading.get_ident() != threading.main_thread().ident
            or (_depth == 0 and _signal.getsignal(_SIGINT) == _SIG_IGN)):
        return False
    if _depth == 0:
        _previous = _signal.getsignal(_SIGINT)
        _signal.signal(_SIGINT, _on_sigint)
    _depth += 1
    return True


def _uninstall() -> None:
    global _depth, _previous
    _depth -= 1
    if _depth == 0:
        _signal.signal(_SIGINT, _previous)
        _previous = None


class _SecondInterruptKills:
    """The context manager `second_interrupt_kills` returns outside a kept handler."""

    __slots__ = ("_armed", "_installed")

    def __init__(self) -> None:
        self._installed = False
        self._armed = False

    def __enter__(self) -> None:
        global _armed, _seen
        if _install():
            self._installed = True
        else:
            return
        if _armed == 0:
            _seen = 0
        _armed += 1
        self._armed = True

    def __exit__(self, *exc: object) -> None:
        global _armed
        if self._armed:
            self._armed = False
            _armed -= 1
        if self._installed:
            self._installed = False
            _uninstall()


class _ArmKept:
    """A turn's block inside a kept handler on the main thread: it arms, nothing else.

    Stateless (the counters are the module's), so one object serves every turn: a run
    enters it every turn, and a new object, its `__init__` and a look-up of the main thread
    were most of the block's cost (issue 38).
    """

    __slots__ = ()

    def __enter__(self) -> None:
        global _armed, _seen
        if _armed == 0:
            _seen = 0
        _armed += 1

    def __exit__(self, *exc: object) -> None:
        global _armed
        _armed -= 1


_ARM_KEPT = _ArmKept()
_main_ident: int | None = threading.main_thread().ident


def _main_thread_changed() -> None:
    # A child forked from another thread has that thread as its main thread (`threading`
    # updates its own at fork first: its hook was registered before this one).
    global _main_ident
    _main_ident = threading.main_thread().ident


os.register_at_fork(after_in_child=_main_thread_changed)


def second_interrupt_kills() -> AbstractContextManager[None]:
    """Within this block, a second SIGINT kills every process group handrail started.

    Nested and concurrent runs share one handler (installed by the outermost block, the one
    before it restored when the last block ends). Outside the main thread it does nothing
    (only the main thread receives signals), nor when the host ignores SIGINT (its choice).
    """
    if _depth > 0 and threading.get_ident() == _main_ident:
        return _ARM_KEPT  # a run keeps the handler in (`interrupt_handler_kept`): no system call
    return _SecondInterruptKills()


class _HandlerKept:
    __slots__ = ("_installed",)

    def __init__(self) -> None:
        self._installed = False

    def __enter__(self) -> None:
        self._installed = _install()

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            self._installed = False
            _uninstall()


def interrupt_handler_kept() -> AbstractContextManager[None]:
    """Keep the handler of `second_interrupt_kills` installed for a whole run (issue 11).

    Installing and restoring a SIGINT handler is two system calls; a run enters
    `second_interrupt_kills` every turn. Inside this block a turn's block only arms the
    handler; between turns it passes every SIGINT straight to the handler that was there
    before, as if it were not installed. Same rules: nested and concurrent blocks share it,
    nothing happens outside the main thread or when the host ignores SIGINT.
    """
    return _HandlerKept()
