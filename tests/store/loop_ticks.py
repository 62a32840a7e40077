"""How many writers a store resumes per event-loop iteration (issues 11 and 24).

Every waiter a store resumes takes its run's next turn in that loop iteration, and anything
else on the loop waits for the whole iteration: the stores pace their releases. The tests of
each store count, with a ticker task, the iteration in which each write returned.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel


class Ticks:
    """Loop iterations counted by a ticker task (`counting_iterations`)."""

    count = 0


@contextlib.asynccontextmanager
async def counting_iterations() -> AsyncIterator[Ticks]:
    """Count the loop's iterations while the block runs (a ticker task, one tick each)."""
    ticks = Ticks()
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks.count += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.lowlevel.checkpoint()  # the ticker is running
        try:
            yield ticks
        finally:
            done.set()


Job = Callable[[Callable[[], None]], Awaitable[None]]
"""A writer: it calls the `mark` it is given each time one of its writes has returned."""


async def resumed_per_iteration(jobs: Sequence[Job]) -> list[int]:
    """Run `jobs` at once beside a ticker; how many marks fell in each iteration that had any."""
    iteration = 0
    resumed_at: list[int] = []
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal iteration
        while not done.is_set():
            iteration += 1
            await anyio.lowlevel.checkpoint()  # one tick per loop iteration

    def mark() -> None:
        resumed_at.append(iteration)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with anyio.create_task_group() as writers:
            for job in jobs:
                writers.start_soon(job, mark)
        done.set()
    return [resumed_at.count(t) for t in sorted(set(resumed_at))]
