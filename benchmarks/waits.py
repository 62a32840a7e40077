"""Two waits the tests check by behaviour, as figures (issue 35: no timed test).

Run: nice -n 10 .venv/bin/python benchmarks/waits.py [--repeats N]

- **Loop lag while a SQLite write waits for another connection's lock.** Another connection
  holds the write lock for `HOLD` seconds; a store write waits for it (on the store's thread).
  Meanwhile a task on the loop sleeps 1 ms at a time: its longest gap is how long the loop was
  held (tests/store/test_group_commit.py checks the loop's connection never waits:
  `busy_timeout` 0). The figure beside it: the write's own wait (about `HOLD`).
- **Cancel to tree gone.** A `SubprocessTool` call whose program and child ignore SIGTERM is
  cancelled (grace 0.5 s): the time until the call returns, the tree killed (about the grace;
  tests/host/test_subprocess.py checks the order: SIGTERM first, then the kill, within the
  shielded bound). And a program that ends on SIGTERM: no grace waited.

Medians of repeats, in milliseconds.
"""



from __future__ import annotations

import argparse
import sqlite3
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import handrail as hr
from handrail.store import Batch, RunRecord, Store

HOLD = 0.2
GRACE = 0.5
STUBBORN = """#!/bin/sh
trap '' TERM
sh -c 'trap "" TERM; exec sleep 1000' &
echo ready
while :; do sleep 1; done
"""
POLITE = "#!/bin/sh\necho ready\nexec sleep 1000\n"


async def lock_wait(folder: Path, i: int) -> tuple[float, float]:
    path = folder / f"lock{i}.db"
    async with Store.open(path) as store:
        await store.write(Batch(run=RunRecord(id="r0", task="t", created_at=time.time())))
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        lag = 0.0
        done = anyio.Event()

        async def ticker() -> None:
            nonlocal lag
            last = time.perf_counter()
            while not done.is_set():
                await anyio.sleep(0.001)
                now = time.perf_counter()
                lag = max(lag, now - last)
                last = now

        async def release() -> None:
            await anyio.sleep(HOLD)
            other.execute("COMMIT")

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(release)
            start = time.perf_counter()
            await store.write(Batch(run=RunRecord(id="r1", task="t", created_at=time.time())))
            waited = time.perf_counter() - start
            done.set()
        other.close()
    return lag * 1000, waited * 1000


async def cancel_to_gone(folder: Path, body: str) -> float:
    prog = folder / "prog"
    prog.write_text(body)
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    tool = hr.SubprocessTool("t", [str(prog)], {"type": "object"}, "T.", grace=GRACE,
                             timeout=60, cwd=folder)
    handler = hr.ToolHandler(tool, sandbox="off")
    elapsed = 0.0

    async def call() -> None:
        await handler.step(hr.Invoke("c1", {}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.sleep(0.3)  # the program has started (a benchmark may sleep)
        start = time.perf_counter()
        tg.cancel_scope.cancel()
    elapsed = time.perf_counter() - start
    return elapsed * 1000


async def main(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lags, waits, stubborn, polite = [], [], [], []
        for i in range(repeats):
            lag, waited = await lock_wait(folder, i)
            lags.append(lag)
            waits.append(waited)
            stubborn.append(await cancel_to_gone(folder, STUBBORN))
            polite.append(await cancel_to_gone(folder, POLITE))
    print(f"{'what':58} {'median ms':>10}")
    print(f"{'loop lag while a write waits for the lock (' + str(int(HOLD * 1000)) + ' ms)':58} "
          f"{statistics.median(lags):10.1f}")
    print(f"{'the write waited':58} {statistics.median(waits):10.1f}")
    print(f"{'cancel -> returned, tree ignoring SIGTERM (grace ' + str(GRACE) + ' s)':58} "
          f"{statistics.median(stubborn):10.1f}")
    print(f"{'cancel -> returned, program ending on SIGTERM':58} "
          f"{statistics.median(polite):10.1f}")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--repeats", type=int, default=5)
        anyio.run(main, parser.parse_args().repeats)
