"""The inbox's first page with 10, 1,000 and 5,000 pending items (issue 35: a figure, not a test).

Run: .venv/bin/python benchmarks/inbox.py [--repeats N]

The app (`handrail.web.create_app`) over a SQLite store in a temporary folder, driven by
Starlette's test client in this process (no network, no browser): the time of one `GET /` as a
signed-in person, which reads every open item, sorts them, renders fifty. The tests check the
behaviour (fifty a page, newest first, the same store calls for ten items or a thousand:
tests/web/test_inbox_api.py); what it costs is printed here, with the ratio to 10 items.
Medians of repeats, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "web"))  # inbox_agents, the tests' agents

import inbox_agents  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import handrail as hr  # noqa: E402
from handrail.web import create_app  # noqa: E402

TOKEN = "login-token-for-benchmarks-0123456789"


async def seed(db: Path, count: int) -> None:
    store = hr.Store.open(db)
    try:
        now = time.time()
        run = hr.RunRecord(id="bulk", task="bulk", agent="bulk-agent",
                           status=hr.RunStatus.AWAITING_APPROVAL, created_at=now,
                           outcome={"kind": "awaiting_approval", "request_id": "req-0"})
        items = [hr.PendingItem(id=f"req-{i}", kind="approval", run_id="bulk",
                                call_record=f"bulk:c{i}", agent="bulk-agent",
                                tool="workspace/write_file",
                                payload={"act": "write", "target": f"f{i}.txt",
                                         "arguments": {"path": f"f{i}.txt", "content": "x"}},
                                created_at=now - count + i)
                 for i in range(count)]
        await store.write(hr.store.Batch(run=run, pending=items))
    finally:
        await store.close()


def first_page(folder: Path, count: int, repeats: int) -> float:
    db = folder / f"runs-{count}.db"
    asyncio.run(seed(db, count))
    store = hr.Store.open(db)
    app = create_app(store, agent_for=inbox_agents.by_ref, login_tokens=(TOKEN,),
                     default_user="alice")
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        client.post("/login", data={"token": TOKEN, "user": "alice"}, follow_redirects=False)
        client.get("/")  # warm: templates compiled, store opened
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get("/")
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200 and f"{count} pending" in response.text
    return statistics.median(timings) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="handrail-bench-inbox-") as tmp:
        base = None
        print(f"{'pending':>8}  {'GET / ms':>9}  {'ratio':>6}")
        for count in (10, 1000, 5000):
            ms = first_page(Path(tmp), count, args.repeats)
            base = base or ms
            print(f"{count:>8}  {ms:>9.1f}  {ms / base:>6.1f}")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
