"""The machine's calibration, printed beside every benchmark's tables (issue 38).

A figure in microseconds describes the machine it ran on: the 2-core VM these benchmarks run
on is 3-4x slower than the one the issues' targets were set on, and its speed moves with the
load other processes put on it. So every benchmark ends with one line measured in its own
run: what the floor's call costs here (`../shared/bench-peers/floor.py`, the least a recorded
tool call can cost in plain Python: a scripted call, pydantic validation, the tool, the three
records as JSON, one loop yield; and the same plus one WAL commit of one row, SQLite
`synchronous=NORMAL`). Divide a µs figure by it to read it in floors, which compare across
machines; the issues' targets are stated as such ratios.

    with calibration.beside():   # in a benchmark's `if __name__ == "__main__":`
        main()

The floor runs in a process of its own, after the benchmark (it neither loads the
benchmark's process nor is loaded by it), as marginal CPU time per call between two run
sizes, the median of a few repeats. A benchmark's own child processes inherit
`CALIBRATED` and print no line of their own (their output is read by their parent).
Where the floor is not beside this checkout, the line says so instead of a figure.

    python benchmarks/calibration.py            # the line alone
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# (agent_loop.py is beside this file, whose folder is on sys.path however it was found:
# not put first again, where it would shadow a package for a script that took it off.)
from agent_loop import FLOOR, _floor

CALIBRATED = "HANDRAIL_BENCH_CALIBRATED"
"""Set in a calibrated benchmark's environment: its children print no calibration."""

CHILD_FLAGS = frozenset({"--child", "--floor-child", "--worker", "--index-rounds"})
"""The flags that start a benchmark's own child (its parent, or a test, reads its output),
or a run for callgrind to count: a process started with one prints no calibration."""

MODES = {"memory": "the floor's call", "one": "with one WAL commit"}
"""floor.py's modes measured, and how the line names them."""


def measure(*, small: int = 200, large: int = 1200, reps: int = 5,
            floor: str | Path | None = None) -> dict[str, float]:
    """CPU µs per floor call in this process, by mode: marginal between `small` and `large`
    calls (a run's fixed cost cancels), the median of `reps` pairs."""
    if not 0 < small < large or reps < 1:
        raise ValueError(f"need 0 < small < large and reps >= 1 (got {small}, {large}, {reps})")
    out: dict[str, float] = {}
    for mode in MODES:
        runs = {n: _floor(n, mode, floor) for n in (small, large)}
        asyncio.run(runs[small]())  # warm: imports, the first database file
        per_call = []
        for _ in range(reps):
            cpu = {}
            for n, run in runs.items():
                start = time.process_time()
                asyncio.run(run())
                cpu[n] = time.process_time() - start
            per_call.append((cpu[large] - cpu[small]) / (large - small) * 1e6)
        out[mode] = statistics.median(per_call)
    return out


def line(figures: dict[str, float] | None, why: str = "") -> str:
    """The calibration line for `figures` (`measure`'s), or for their absence (`why`)."""
    load = os.getloadavg()[0]
    if not figures:
        return (f"calibration: not measured ({why or 'no figures'}); load {load:.1f}. "
                "Read this run's µs as this machine's only.")
    parts = ", ".join(f"{MODES[mode]} {us:.1f} µs" for mode, us in figures.items())
    return (f"calibration (this run, this machine): {parts} of CPU (floor.py, marginal, "
            f"median); load {load:.1f}. A µs figure ÷ the floor's call = floors, comparable "
            "across machines.")


def calibration(floor: str | Path | None = None) -> str:
    """Measure the floor in a fresh process and return its line (never raises)."""
    floor = floor or FLOOR
    if floor is None or not Path(floor).exists():
        return line(None, "../shared/bench-peers/floor.py is not beside this checkout")
    try:
        done = subprocess.run([sys.executable, __file__, "--measure", str(floor)],
                              capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return line(None, f"the floor's process failed: {error}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return line(None, f"the floor's process failed: {last[:200]}")
    return line(json.loads(done.stdout.strip().splitlines()[-1]))


@contextlib.contextmanager
def beside(file: object = None) -> Iterator[None]:
    """Run a benchmark's body, then print the calibration line after its tables.

    Not in a child of a calibrated benchmark (`CALIBRATED`, `CHILD_FLAGS`), and not when
    the body fails.
    """
    if os.environ.get(CALIBRATED) or CHILD_FLAGS.intersection(sys.argv[1:]):
        yield
        return
    os.environ[CALIBRATED] = "1"
    try:
        yield
    finally:
        # (a child started after the body would calibrate again: not one of the body's)
        os.environ.pop(CALIBRATED, None)
    print("\n" + calibration(), file=file or sys.stdout, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(floor=sys.argv[2] if len(sys.argv) > 2 else None)))
    else:
        print(calibration())
