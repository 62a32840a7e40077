"""The cyclic garbage collector in a process that runs many agents on one event loop.

CPython's collector stops the event loop for each pass. Young passes are short (0.05-1 ms),
but a full pass walks every tracked object of the process: everything imported (~38,000
objects with the agent core loaded) plus every live run's history, 15-100 ms at 100
concurrent runs and 0.3-1.3 s at 1,000 on a 2-core machine, which is the loop's worst lag
(issue 11: 100 runs, p99 19-75 ms with the collector as it comes). `tune_for_many_runs` is the
setting measured for that case (`benchmarks/concurrency.py --gc tuned`,
benchmarks/README.md). It is process-wide, so handrail applies it only in the processes it
owns (`handrail serve`, `handrail worker`, `handrail inbox`); a host calls it itself, once its
start-up is done, if it wants it.
"""

from __future__ import annotations

import gc

__all__ = ["FULL_PASS_EVERY", "tune_for_many_runs"]

FULL_PASS_EVERY = 100
"""Middle-generation passes between two full passes (CPython's default: 10)."""


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

    Calling it again freezes what was created since, and sets the same thresholds.
    """
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_PASS_EVERY)
