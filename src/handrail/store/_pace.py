"""`Pacer`: writers yield to the event loop a few per iteration, so no iteration runs them all.

A store's write yields to the loop once (a run that never yields holds every other task on
the loop). With `anyio.lowlevel.checkpoint()` (`sleep(0)`) every yielding run is ready again in
the next iteration, and asyncio runs every ready callback of an iteration before it looks at
its timers: 100 concurrent runs made each iteration 100 segments of a turn (~10-35 ms), and a
timer, or any other task on the loop (a web request, a heartbeat), waited that long. A pacer
lets at most `per_iteration` writers (x2 at the edge of a window, below) resume per
iteration; the others wait in a queue, in arrival order, and resume in the next iterations.
Uncontended, a write yields exactly as `checkpoint()` does: one iteration, no future.

The SQLite store paces the waiters of its commits the same way (`RELEASE_PER_ITERATION`).
"""

from __future__ import annotations

import asyncio
import collections

import anyio.lowlevel

__all__ = ["Pacer"]


class Pacer:
    """Resume at most about `per_iteration` yielding writers per event-loop iteration.

    Args:
        per_iteration: Writers resumed per iteration. Each resumed writer does its run's next
            segment of work (up to its next write) in that iteration, so this, times a
            segment's CPU, bounds an iteration.
    """

    __slots__ = ("_loop", "_queue", "_slots", "_ticking", "per_iteration")

    def __init__(self, per_iteration: int) -> None:
        self.per_iteration = per_iteration
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self._slots = 0
        self._ticking = False

    async def yield_(self) -> None:
        """Yield to the event loop; resume within the pace (a cancellation point).

        A cancellation while waiting raises here, before the caller's change: like
        `checkpoint()`, nothing is half done.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): a plain checkpoint
            await anyio.lowlevel.checkpoint()
            return
        if loop is not self._loop:
            self._rebind(loop)
        if not self._ticking:
            self._ticking = True
            self._slots = self.per_iteration
            loop.call_soon(self._tick)
        if self._slots > 0 and not self._queue:
            self._slots -= 1
            # What anyio's checkpoint does on asyncio (its cancel scopes cancel the task, which
            # raises here), without looking the backend up again.
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = loop.create_future()
        self._queue.append(waiter)
        await waiter

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Pace the writers of a new loop from now on.

        A store reused across `anyio.run` calls, or used from another thread's loop: writers
        still waiting on the old loop resume there, unpaced, never left waiting for a tick
        that will not come.
        """
        old, waiting = self._loop, self._queue
        self._loop, self._queue, self._ticking = loop, collections.deque(), False
        if old is not None and waiting:
            try:
                old.call_soon_threadsafe(_wake, waiting)
            except RuntimeError:  # that loop is closed: its tasks are gone with it
                pass

    def _tick(self) -> None:
        """Once per iteration while writers yield: open the next window, resume the oldest.

        The writers resumed here and those that yield later in this iteration (which take
        what is left of the window) run in the next iteration: at most `per_iteration`, plus
        those that yielded earlier in this iteration on the last window's leftover.
        """
        queue = self._queue
        if not queue and self._slots == self.per_iteration:
            self._ticking = False  # a whole window went unused: idle until the next yield
            return
        self._slots = self.per_iteration
        while queue and self._slots > 0:
            waiter = queue.popleft()
            if not waiter.done():  # done: its writer was cancelled while it waited
                waiter.set_result(None)
                self._slots -= 1
        assert self._loop is not None
        self._loop.call_soon(self._tick)


def _wake(waiting: collections.deque[asyncio.Future[None]]) -> None:
    for waiter in waiting:
        if not waiter.done():
            waiter.set_result(None)
