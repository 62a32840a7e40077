"""Helpers of the notification tests."""

from __future__ import annotations


class Clock:
    """A clock a test moves (`store.clock = clock`): deadlines pass without waiting."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
