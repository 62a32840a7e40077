"""What enforcing deadlines on every touch costs (issue 41: a figure, not a test).

Run: .venv/bin/python benchmarks/pending_touch.py [--repeats N]

A SQLite store with 1,000 open approvals (none due, half with a deadline). Each touch that
enforces expiry (`pending_item`, `pending_page(50)`, `decide` + its item's rewrite, `claim`)
first asks the partial index `pending_deadline` whether anything is due; the same calls with
that look skipped (the store's `_read_pending` replaced by a plain read, `_expire_due` by a
no-op) are the baseline. Medians of repeats, in microseconds per call, and the ratio.
"""



from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from handrail.store import (
    Batch,
    PendingItem,
    RunRecord,
    RunStatus,
    Store,
    _sqlite,
)

CALLS = 300


async def seed(store: Store) -> None:
    now = time.time()
    items = [PendingItem(id=f"p{i}", kind="approval", run_id="r", call_record=f"r:c{i}",
                         payload={"act": "write", "target": f"f{i}.txt"}, created_at=now + i,
                         **({"deadline": now + 3600,
                             "on_expiry": {"kind": "deny", "reason": "x"}} if i % 2 else {}))
             for i in range(1000)]
    await store.write(Batch(run=RunRecord(id="r", task="t", policy={"layers": []},
                                          created_at=now, status=RunStatus.AWAITING_APPROVAL,
                                          outcome={"kind": "awaiting_approval",
                                                   "request_id": "p0"}), pending=items))


async def measure(store: Store, what: str, n: int) -> float:
    start = time.perf_counter()
    for i in range(CALLS):
        if what == "pending_item":
            await store.pending_item(f"p{i}")
        elif what == "pending_page(50)":
            await store.pending_page(50)
        elif what == "claim":
            await store.claim("r", f"h:1:{n}-{i}")
            await store.write(Batch(run=RunRecord(
                id="r", task="t", policy={"layers": []}, created_at=0,
                status=RunStatus.AWAITING_APPROVAL,
                outcome={"kind": "awaiting_approval", "request_id": "p0"})))
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'touch':<20}{'enforced µs':>14}{'baseline µs':>14}{'ratio':>8}")
    for what in ("pending_item", "pending_page(50)", "claim"):
        enforced: list[float] = []
        baseline: list[float] = []
        for n in range(args.repeats):
            for bucket, skip in ((enforced, False), (baseline, True)):
                with tempfile.TemporaryDirectory() as folder:
                    async def go(skip: bool = skip, bucket: list[float] = bucket, what: str = what,
                                 n: int = n, folder: str = folder) -> None:
                        store: Any = Store.open(Path(folder) / "runs.db")
                        if skip:
                            store._read_pending = store._read
                            _sqlite._expire_due = lambda db, now: []
                        try:
                            await seed(store)
                            bucket.append(await measure(store, what, n))
                        finally:
                            _sqlite._expire_due = real_expire
                            await store.close()

                    anyio.run(go)
        a, b = statistics.median(enforced), statistics.median(baseline)
        print(f"{what:<20}{a:>14.1f}{b:>14.1f}{a / b:>8.2f}")


real_expire = _sqlite._expire_due

if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
