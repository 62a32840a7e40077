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
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any

from handrail.approval import kill_running_controls
from handrail.host import kill_all_now

__all__ = ["second_interrupt_kills"]

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_SIGINT = int(signal.SIGINT)
_SIG_IGN = int(signal.SIG_IGN)

_depth = 0
_seen = 0
_previous: _Handler = None


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _seen
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


class _SecondInterruptKills:
    """The context manager `second_interrupt_kills` returns (a class: entered every turn)."""

    __slots__ = ("_installed",)

    def __init__(self) -> None:
        self._installed = False

    def __enter__(self) -> None:
        global _depth, _seen, _previous
        # `_signal` rather than `signal`: the latter converts every handler to and from an
        # enum, which made this block a tenth of a memory-store turn's CPU (issue 11).
        if (threading.current_thread() is not threading.main_thread()
                or (_depth == 0 and _signal.getsignal(_SIGINT) == _SIG_IGN)):
            return
        if _depth == 0:
            _previous = _signal.getsignal(_SIGINT)
            _seen = 0
            _signal.signal(_SIGINT, _on_sigint)
        _depth += 1
        self._installed = True

    def __exit__(self, *exc: object) -> None:
        global _depth, _previous
        if not self._installed:
            return
        self._installed = False
        _depth -= 1
        if _depth == 0:
            _signal.signal(_SIGINT, _previous)
            _previous = None


def second_interrupt_kills() -> AbstractContextManager[None]:
    """Within this block, a second SIGINT kills every process group handrail started.

    Nested and concurrent runs share one handler (installed by the outermost block, the one
    before it restored when the last block ends). Outside the main thread it does nothing
    (only the main thread receives signals), nor when the host ignores SIGINT (its choice).
    """
    return _SecondInterruptKills()
