"""The second-Ctrl-C handler is kept for a whole run and armed per turn (issue 11).

Installing a SIGINT handler and restoring it are two system calls a turn; a run now keeps it
installed and each turn only arms it. Between turns it must behave as if it were not there:
every SIGINT goes to the handler before it, and none is counted towards a second Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest

from handrail.runs import _interrupt
from handrail.runs._interrupt import interrupt_handler_kept, second_interrupt_kills


def test_only_a_turn_counts_and_the_previous_handler_is_back_after_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[str] = []
    monkeypatch.setattr(_interrupt, "kill_all_now", lambda: killed.append("programs"))
    monkeypatch.setattr(_interrupt, "kill_running_controls", lambda: killed.append("controls"))
    passed_on: list[int] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        passed_on.append(signum)

    before = signal.signal(signal.SIGINT, previous)
    try:
        with interrupt_handler_kept():
            ours = signal.getsignal(signal.SIGINT)
            assert ours is not previous
            assert callable(ours)
            ours(signal.SIGINT, None)  # between turns (a model request): passed on only
            ours(signal.SIGINT, None)
            assert killed == []
            with second_interrupt_kills():
                ours(signal.SIGINT, None)  # the first of the turn
                assert killed == []
                ours(signal.SIGINT, None)  # the second: everything is killed
                assert killed == ["programs", "controls"]
            with second_interrupt_kills():  # a new turn counts from zero
                killed.clear()
                ours(signal.SIGINT, None)
                assert killed == []
            assert signal.getsignal(signal.SIGINT) is ours
        assert signal.getsignal(signal.SIGINT) is previous
        assert passed_on == [signal.SIGINT] * 5
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_turn_outside_a_run_installs_and_restores_the_handler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_interrupt, "kill_all_now", lambda: None)
    monkeypatch.setattr(_interrupt, "kill_running_controls", lambda: None)

    def previous(signum: int, frame: FrameType | None) -> None:
        pass

    before = signal.signal(signal.SIGINT, previous)
    try:
        with second_interrupt_kills():
            assert signal.getsignal(signal.SIGINT) is not previous
        assert signal.getsignal(signal.SIGINT) is previous
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_turn_disarms_at_its_end_and_a_turn_off_the_main_thread_never_arms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 38: inside a kept handler a turn's block is one shared object that only counts
    # turns; it must still disarm at the turn's end, and a turn driven in another thread
    # (only the main thread receives signals) must not arm the main thread's handler.
    killed: list[str] = []
    monkeypatch.setattr(_interrupt, "kill_all_now", lambda: killed.append("programs"))
    monkeypatch.setattr(_interrupt, "kill_running_controls", lambda: None)
    before = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        with interrupt_handler_kept():
            ours = signal.getsignal(signal.SIGINT)
            assert callable(ours)
            with second_interrupt_kills():
                pass
            ours(signal.SIGINT, None)  # between turns: not counted
            ours(signal.SIGINT, None)
            assert killed == []
            entered, signalled = threading.Event(), threading.Event()

            def turn_in_a_thread() -> None:
                with second_interrupt_kills():
                    entered.set()
                    assert signalled.wait(5)

            thread = threading.Thread(target=turn_in_a_thread)
            thread.start()
            assert entered.wait(5)
            ours(signal.SIGINT, None)
            ours(signal.SIGINT, None)
            signalled.set()
            thread.join(5)
            assert killed == []
            with second_interrupt_kills():  # and a turn on the main thread still arms
                ours(signal.SIGINT, None)
                ours(signal.SIGINT, None)
            assert killed == ["programs"]
    finally:
        signal.signal(signal.SIGINT, before)
