"""`Pacer`: writers yield to the event loop a few per iteration, so no iteration runs them all.

A store's write yields to the loop once (a run that never yields holds every other task on
the loop). With `anyio.lowlevel.checkpoint()` (`sleep(0)`) every yielding run is ready again in
the next iteration, and asyncio runs every ready callback of an iteration before it looks at
its timers: 100 concurrent runs made each iteration 100 segments of a turn (~10-35 ms), and a
timer, or any other task on the loop (a web request, a heartbeat), waited that long. A pacer
lets at most `per_iteration` writers (x2 at the edge of a window, below) resume per
iteration; the others wait in a queue, in arrival order, and resume in the next iterations.
Uncontended, a write yields exactly as `checkpoint()` does: one iteration, no future.

A yield lets the loop run what else is ready or due; when nothing is (no other callback ready,
no timer due, no cancellation on its way: anyio delivers one through a ready callback) and
this writer resumed from its last yield less than `HOLD_SECONDS` ago, a write does not yield:
the iteration it would end has nothing else in it, and the loop polls for I/O at least every
`HOLD_SECONDS` plus one segment. A lone run on a memory store skipped ~2.5 µs a write (an
iteration, its poll and handle: issue 11); with anything else on the loop, nothing changes.
This reads two private attributes of asyncio's own loop (`_ready`, `_scheduled`); a loop
without them (uvloop) always yields.

Each event loop has its own pace (its own queue and window), touched only from the loop's
thread: a store written from two threads' loops at once paces each, and no writer waits on
another loop's tick.

The SQLite store paces the waiters of its commits the same way (`RELEASE_PER_ITERATION`).
"""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import types
import weakref

import anyio.lowlevel

__all__ = ["HOLD_SECONDS", "Pacer", "nothing_else_to_run"]

HOLD_SECONDS = 0.0005
"""How long a writer may go on without yielding when nothing else on the loop is ready."""


def nothing_else_to_run(loop: asyncio.AbstractEventLoop, resumed_at: float) -> bool:
    """Whether a yield now would end an empty loop iteration, so a write may skip it.

    True when no callback is ready (a task, anyio's delivery of a cancellation), no timer is
    due, and the writer resumed from its last yield (`resumed_at`, `loop.time()`) less than
    `HOLD_SECONDS` ago, so the loop still polls for I/O at least that often. False on a loop
    whose queues cannot be read (uvloop): there a write always yields. The memory store's
    pacer and the SQLite store's idle write share this rule.
    """
    ready = getattr(loop, "_ready", None)
    if type(ready) is not collections.deque or ready:
        return False
    now = loop.time()
    if now - resumed_at >= HOLD_SECONDS:
        return False
    scheduled = getattr(loop, "_scheduled", None)
    if type(scheduled) is not list:
        return False
    return not scheduled or scheduled[0].when() > now


@types.coroutine
def _sleep0() -> collections.abc.Generator[None, None, None]:
    """`asyncio.sleep(0)` without its coroutine: one bare yield to the task (asyncio's own)."""
    yield


class Pacer:
    """Resume at most about `per_iteration` yielding writers per event-loop iteration.

    Args:
        per_iteration: Writers resumed per iteration. Each resumed writer does its run's next
            segment of work (up to its next write) in that iteration, so this, times a
            segment's CPU, bounds an iteration.
    """

    __slots__ = ("_last", "_paces", "per_iteration")

    def __init__(self, per_iteration: int) -> None:
        self.per_iteration = per_iteration
        self._paces: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPace] = (
            weakref.WeakKeyDictionary())
        # The last loop and its pace, as one tuple: read and replaced whole, so a thread
        # never pairs its loop with another loop's pace.
        self._last: tuple[asyncio.AbstractEventLoop, _LoopPace] | None = None

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
        last = self._last
        if last is not None and last[0] is loop:
            pace = last[1]
        else:
            found = self._paces.get(loop)
            if found is None:
                found = self._paces[loop] = _LoopPace(loop, self.per_iteration)
            pace = found
            self._last = (loop, pace)
        if pace.slots > 0 and not pace.queue:
            if nothing_else_to_run(loop, pace.resumed_at):
                return  # the yield would be an empty iteration
            pace.slots -= 1
            # What anyio's checkpoint does on asyncio (its cancel scopes cancel the task, which
            # raises here), without looking the backend up again.
            if pace.ticking:
                await _sleep0()
                pace.resumed_at = loop.time()
                return
            # The pace is idle: this writer ticks it. A tick scheduled now would sit right
            # before this writer's resumption in the next iteration's queue (nothing else is
            # scheduled in between), so the writer runs the tick itself when it resumes,
            # cancelled or not: the same work at the same point, without a callback and its
            # handle (~1 µs of a lone run's write, issue 11).
            pace.ticking = True
            try:
                await _sleep0()
            finally:
                pace.tick()
            pace.resumed_at = loop.time()
            return
        if not pace.ticking:
            pace.start()
        waiter: asyncio.Future[None] = loop.create_future()
        pace.queue.append(waiter)
        await waiter
        pace.resumed_at = loop.time()


class _LoopPace:
    """One event loop's pace: its waiting writers and what is left of this iteration's window."""

    __slots__ = ("loop", "per_iteration", "queue", "resumed_at", "slots", "ticking")

    def __init__(self, loop: asyncio.AbstractEventLoop, per_iteration: int) -> None:
        self.loop = loop
        self.resumed_at = float("-inf")  # when a writer last resumed from a yield (loop.time)
        self.per_iteration = per_iteration
        self.queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self.slots = per_iteration
        self.ticking = False

    def start(self) -> None:
        self.ticking = True
        self.loop.call_soon(self.tick)

    def tick(self) -> None:
        """Once per iteration while writers yield: open the next window, resume the oldest.

        The writers resumed here and those that yield later in this iteration (which take
        what is left of the window) run in the next iteration: at most `per_iteration`, plus
        those that yielded earlier in this iteration on the last window's leftover.
        """
        queue = self.queue
        self.slots = self.per_iteration
        if not queue:
            # Nobody waits: the next window is open and idle until the next yield, which
            # starts the tick again (for the next iteration, as a tick scheduled now would
            # be). One tick per uncontended write, not two (issue 11).
            self.ticking = False
            return
        while queue and self.slots > 0:
            waiter = queue.popleft()
            if not waiter.done():  # done: its writer was cancelled while it waited
                waiter.set_result(None)
                self.slots -= 1
        self.loop.call_soon(self.tick)
