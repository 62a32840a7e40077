"""The cyclic garbage collector in a process that runs many agents on one event loop.

CPython's collector stops the event loop for each pass. Young passes are short (0.05-1 ms),
but a full pass walks every tracked object of the process: everything imported (~40,000
objects with the agent core and pydantic loaded) plus every live run's objects, 15-25 ms at
100 concurrent runs on a 2-core machine, which was the loop's worst lag (issues 11 and 24:
100 runs, p99 19-26 ms with the collector as it comes; 2.5-3.1 ms with start-up frozen).

So handrail freezes start-up once: at the first run of the process (`Agent.run`, `resume`),
what exists then (modules, classes, functions, the agents and their tools) is moved to the
permanent generation (`gc.freeze()`), which no pass walks. Before it, the young and middle
generations are collected (~2 ms: the garbage of the set-up just before the run), not the
whole heap: a full pass costs 25-40 ms at start-up's ~35,000 objects, most of a first run's
fixed cost, to find a few hundred unreachable objects (310 with the agent core loaded). Cyclic
garbage that is in the old generation at the first run is frozen with the rest (a host that
made much of it can `gc.collect()` before its first run, or call `leave_alone()`). Only a collector
left as it comes is touched: disabled, re-tuned or already frozen by the host, it is left
alone, and `leave_alone()` opts out before the first run. Nothing else changes: thresholds
stay, every later object is collected as usual, a frozen object dropped is still freed by
reference counting; only a reference cycle among start-up objects, made after the freeze,
is never collected (start-up objects live as long as the process anyway).

`tune_for_many_runs` goes further for a server of hundreds of runs (full passes 10x rarer,
`benchmarks/concurrency.py --gc tuned`, benchmarks/README.md): `handrail serve`, `handrail
worker` and `handrail inbox` apply it in their own processes; a host calls it itself.
"""

from __future__ import annotations

import gc

__all__ = ["FULL_PASS_EVERY", "freeze_start_up", "leave_alone", "tune_for_many_runs"]

FULL_PASS_EVERY = 100
"""Middle-generation passes between two full passes (CPython's default: 10)."""

_DEFAULT_THRESHOLD = (700, 10, 10)
"""CPython's thresholds (3.8-3.13): a host that changed them manages its collector itself."""

_untouched = True
"""No run has started in this process yet, and nobody said `leave_alone()`."""


def leave_alone() -> None:
    """Never let handrail touch the collector in this process.

    Call it before the first run (at start-up) if your process manages its own collector,
    or must collect every cycle however it was made. Runs work the same; a full pass of the
    collector then walks start-up's objects too (15-25 ms with 100 runs on one loop).
    """
    global _untouched
    _untouched = False


def freeze_start_up() -> bool:
    """Freeze start-up's objects once, at the first run; True if this call froze them.

    Called by handrail at the start of every run (after the first, one global check). The
    first call collects the heap once (so no garbage is pinned) and calls `gc.freeze()`,
    unless `leave_alone()` was called or the collector is not as it comes (disabled, other
    thresholds, something already frozen): a host that set it up keeps its setting.
    """
    global _untouched
    if not _untouched:
        return False
    _untouched = False
    if (not gc.isenabled() or gc.get_threshold() != _DEFAULT_THRESHOLD
            or gc.get_freeze_count()):
        return False
    gc.collect(1)
    gc.freeze()
    return True


def tune_for_many_runs() -> None:
    """Take start-up's objects out of every collection and make full passes rarer.

    Call it once start-up is over (imports done, agents and tools built):

    - `gc.freeze()`: what exists now (modules, classes, functions, the agents) moves to the
      permanent generation, which no pass walks; it lives as long as the process anyway.
      Refcounting still frees a frozen object that is dropped; only a reference cycle among
      frozen objects is never collected.
    - a full pass after `FULL_PASS_EVERY` middle-generation passes instead of 10: the young
      and middle passes, which collect what a turn leaves behind, run as before; the pass
      over every live run's history comes 10x less often. Cyclic garbage that survived two
      passes waits longer to be freed.

    Calling it again freezes what was created since, and sets the same thresholds. It
    replaces the freeze handrail makes at the first run (`freeze_start_up`).
    """
    global _untouched
    _untouched = False
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_PASS_EVERY)
