"""`RunHandle`: a run that can be stopped while it runs (`Agent.start`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from handrail.errors import UserError
from handrail.runs._outcome import RunResult

__all__ = ["RunHandle"]


class RunHandle:
    """A run of an agent, started by `await handle.result()`, stopped by `handle.cancel()`.

    Cancelling settles the turn in progress: every call of it without a result gets an
    "interrupted" error result (not sent; in doubt for a call whose body had started, which
    goes to an operator's recovery on resume), tool subprocesses are killed, and the outcome
    is `hr.Cancelled`. `hr.resume` continues the run. `cancel()` may be called before the
    run starts (it then stops before its first model turn), and from the event loop's
    thread only.
    """

    def __init__(self, run: Callable[..., Awaitable[RunResult]]) -> None:
        self._run = run
        self._event: anyio.Event | None = None
        self._cancelled = False
        self._started = False

    def cancel(self) -> None:
        """Stop the run at once (see the class docstring). Idempotent."""
        self._cancelled = True
        if self._event is not None:
            self._event.set()

    @property
    def cancelled(self) -> bool:
        """Whether `cancel()` was called."""
        return self._cancelled

    async def result(self) -> RunResult:
        """Run it to its outcome (once).

        Raises:
            UserError: awaited a second time.
        """
        if self._started:
            raise UserError("a RunHandle runs once; use hr.resume to continue its run")
        self._started = True
        self._event = anyio.Event()
        if self._cancelled:
            self._event.set()
        result: Any = await self._run(cancel=self._event)
        return result  # type: ignore[no-any-return]
