"""`handrail policy what-if` and `suggest` on 100,000 recorded calls (issue 39: under 5 s).

    .venv/bin/python benchmarks/policy_whatif.py [--calls 100000] [--reps 3] [--no-postgres]

Builds a store of recorded calls (1,000 runs of 100 calls by default: reads, writes, exec,
net, MCP-style calls, a sub-agent run every tenth), each call's verdict the recorded policy's
`check` and every ask approved or denied, as the gate records them. Then, per backend, from a
freshly opened store each time, as the command does: read the history (`call_history`),
replay it against a proposed policy, derive the suggested policy (`hr.policy.what_if`,
`hr.policy.suggest`, and the read and the replay apart). Prints medians over
`--reps`, wall and CPU (this process's, all threads: PostgreSQL's server side is not in
it), and checks that reading wrote nothing: the SQLite file (and its WAL) byte for byte,
the log of unfolded writes untouched; on PostgreSQL, the WAL position before and after.
Also times the commands themselves (`handrail policy what-if` and `suggest`, each a new
process) on the SQLite file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

import handrail as hr
from handrail.policy._whatif import _paused_gc
from handrail.store import Batch, CallRecord, CallStatus, RunRecord, RunStatus

HERE = Path(__file__).resolve().parent
RECORDED = (hr.Policy.default().layer("app").deny(hr.Act.WRITE, "src/generated/**")
            .allow(hr.Act.WRITE, "notes/**").allow(hr.Act.CALL, "fx/**")
            .allow(hr.Act.NET, "api.example.com:443").allow(hr.Act.EXEC, "git status"))
PROPOSED = (RECORDED.layer("review").deny(hr.Act.WRITE, "src/**").ask(hr.Act.CALL, "fx/write")
            .allow(hr.Act.NET, "**"))


def _calls_of(run_id: str, n: int, ws: str, rng: random.Random) -> list[CallRecord]:
    out = []
    for i in range(n):
        kind = rng.random()
        folder = rng.choice(("src", "src/pkg", "docs", "notes", "tests", "src/generated"))
        path = f"{folder}/f{rng.randrange(40)}.py"
        if kind < 0.4:
            tool, action = "workspace/read_file", hr.Action(hr.Act.READ, path)
        elif kind < 0.65:
            tool, action = "workspace/write_file", hr.Action(hr.Act.WRITE, path)
        elif kind < 0.75:
            argv = rng.choice((("git", "status"), ("echo", f"hi {i % 7}"), ("ls", "-a")))
            tool, action = "workspace/exec", hr.Action(hr.Act.EXEC, argv)
        elif kind < 0.85:
            host = rng.choice(("api.example.com:443", "example.com:443", "10.0.0.1:80"))
            tool, action = "workspace/fetch", hr.Action(hr.Act.NET, host)
        else:
            tool = rng.choice(("fx/echo", "fx/write", "fx/search"))
            action = hr.Action(hr.Act.CALL, tool)
        verdict = RECORDED.check(action, workspace=ws, mutates=tool != "workspace/read_file")
        decision = None
        status = CallStatus.FINISHED
        if verdict.effect is hr.Effect.ASK:
            decision = {"kind": "approve" if rng.random() < 0.8 else "deny"}
            if decision["kind"] == "deny":
                status = CallStatus.REFUSED
        elif verdict.effect is hr.Effect.DENY:
            status = CallStatus.REFUSED
        target = list(action.target) if isinstance(action.target, tuple) else action.target
        out.append(CallRecord(
            id=f"{run_id}:c{i}", run_id=run_id, call_id=f"c{i}", turn=i // 3, index=i % 3,
            model_name=tool, tool=tool, arguments='{"path": "x"}', arguments_digest="d" * 64,
            performed_arguments={"path": "x"}, actions=[{"act": action.act.value,
                                                         "target": target}],
            verdict=verdict.to_dict(), decision=decision, status=status,
            result={"content": [{"type": "text", "text": "ok"}], "is_error": False},
            started_at=1.0, ended_at=2.0))
    return out


async def fill(store: hr.Store, calls: int, ws: str) -> None:
    rng = random.Random(39)
    per_run = 100
    now = time.time()
    policy = RECORDED.to_dict()
    parent: str | None = None
    for r in range(calls // per_run):
        run_id = f"run{r:05d}"
        child = r % 10 == 9 and parent is not None
        run = RunRecord(id=run_id, task="t", agent="helper" if child else "coder",
                        status=RunStatus.COMPLETED, parent_id=parent if child else None,
                        policy=policy, workspace=ws, created_at=now - 3600 + r,
                        updated_at=now, outcome={"kind": "completed", "output": "done"},
                        depth=1 if child else 0)
        if not child:
            parent = run_id
        await store.write(Batch(run=run, calls=_calls_of(run_id, per_run, ws, rng)),
                          wait=False)
    await store.flush()


def _digest(db: Path) -> dict[str, str]:
    """The file's bytes and its WAL's (an empty WAL, which any reader may create, is none)."""
    out = {}
    for name in (db.name, db.name + "-wal"):
        try:
            data = (db.parent / name).read_bytes()
        except FileNotFoundError:
            continue
        if data:
            out[name] = hashlib.sha256(data).hexdigest()
    return out


async def measure(url: str) -> dict[str, float]:
    async def one() -> dict[str, float]:
        store = hr.Store.open(url)
        try:
            # The API as a user calls it (each reads the record: with the collector paused)...
            c0, t0 = time.process_time(), time.perf_counter()
            report = await hr.policy.what_if(store, PROPOSED)
            c1, t1 = time.process_time(), time.perf_counter()
            suggestion = await hr.policy.suggest(store)
            c2, t2 = time.process_time(), time.perf_counter()
            # ... and its two halves, for where the time goes.
            with _paused_gc():
                history = [pair async for pair in store.call_history(decisions_only=True)]
            t3 = time.perf_counter()
            again = hr.policy.replay(history, PROPOSED)
            t4 = time.perf_counter()
        finally:
            await store.close()
        calls = sum(len(c) for _, c in history)
        assert report.replayed == calls and report.flips, "nothing replayed"
        assert again == report
        # Nothing approved is denied by the suggestion (a target a person denied once and
        # approved another time is allowed: the replay names those as loosenings).
        assert not [f for f in hr.policy.replay(history, suggestion.policy).gating
                    if f.after is hr.Effect.DENY], suggestion.conflicts
        row = {"read": t3 - t2, "replay": t4 - t3, "what-if": t1 - t0, "suggest": t2 - t1,
               "what-if cpu": c1 - c0, "suggest cpu": c2 - c1,
               "calls": float(calls), "flips": float(len(report.flips))}
        print(f"  {url[:40]}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()
                                             if k not in ("calls", "flips")), flush=True)
        return row

    return await one()


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent / "tests"))
    import pgserver

    tmp = Path(tempfile.mkdtemp(prefix="handrail-whatif-"))
    ws = os.path.realpath(tmp)
    print(f"load average at start: {os.getloadavg()[0]:.1f}; {args.calls:,} recorded calls")
    results: dict[str, list[dict[str, float]]] = {}
    checks: dict[str, str] = {}

    db = tmp / "runs.db"
    t = time.perf_counter()

    async def fill_sqlite() -> None:
        store = hr.Store.open(db)
        await fill(store, args.calls, ws)
        await store.close()

    anyio.run(fill_sqlite)
    print(f"sqlite: filled in {time.perf_counter() - t:.1f} s", flush=True)
    before = _digest(db)
    results["sqlite"] = [anyio.run(measure, str(db)) for _ in range(args.reps)]
    checks["sqlite"] = ("file unchanged" if _digest(db) == before else "FILE CHANGED")

    # An unfolded log: a writer still open holds its last writes in the log; reading must
    # neither fold them nor miss them.
    async def with_open_writer() -> str:
        writer = hr.Store.open(db)
        extra = RunRecord(id="zz-open", task="t", agent="coder", status=RunStatus.COMPLETED,
                          outcome={"kind": "completed", "output": "x"}, policy=RECORDED.to_dict(),
                          workspace=ws, created_at=time.time(), updated_at=time.time())
        await writer.write(Batch(run=extra, calls=_calls_of("zz-open", 50, ws,
                                                            random.Random(1))))
        raw = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        logged = raw.execute("SELECT count(*) FROM log").fetchone()[0]
        snapshot = _digest(db)
        row = await measure(str(db))
        after = raw.execute("SELECT count(*) FROM log").fetchone()[0]
        raw.close()
        same = _digest(db) == snapshot and after == logged
        await writer.close()
        return (f"log of {logged} rows left as it was, file unchanged, "
                f"{int(row['calls']):,} calls read" if same else "WROTE WHILE READING")

    checks["sqlite, writer open"] = anyio.run(with_open_writer)

    # The command, a new process (imports included), on the same file.
    proposed = tmp / "proposed.toml"
    PROPOSED.save(proposed)
    command: dict[str, list[float]] = {"what-if": [], "suggest": []}
    for _ in range(args.reps):
        for name, argv, code in (("what-if", ["what-if", str(proposed)], 1),
                                 ("suggest", ["suggest"], 0)):
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "handrail.cli", "policy", *argv,
                                   "--store", str(db), *(["--json"] if code else [])],
                                  capture_output=True, check=False)
            command[name].append(time.perf_counter() - t)
            # The proposal denies approved writes: what-if exits 1.
            assert done.returncode == code, done.stderr
    server = None
    if not args.no_postgres and pgserver.unavailable() is None:
        server = pgserver.start()
        try:
            url = server.create_database()

            async def fill_pg() -> None:
                store = hr.Store.open(url)
                await fill(store, args.calls, ws)
                await store.close()

            t = time.perf_counter()
            anyio.run(fill_pg)
            print(f"postgresql: filled in {time.perf_counter() - t:.1f} s", flush=True)
            # The server writes WAL of its own (autovacuum analysing the new tables): the
            # same time idle, just before, says how much.
            t = time.perf_counter()
            results["postgresql"] = [anyio.run(measure, url) for _ in range(args.reps)]
            took = time.perf_counter() - t
            lsn = _lsn(url)
            results["postgresql"] += [anyio.run(measure, url) for _ in range(args.reps)]
            during = _lsn(url) - lsn
            lsn = _lsn(url)
            time.sleep(took)
            idle = _lsn(url) - lsn
            checks["postgresql"] = (f"WAL written during {args.reps} reads: {during} bytes; "
                                    f"idle for as long: {idle} bytes (READ ONLY transactions)")
        finally:
            pgserver.stop(server)

    print(f"\nmedians over {args.reps} reps (seconds), {args.calls:,} calls:")
    keys = ("read", "replay", "what-if", "suggest", "what-if cpu", "suggest cpu")
    print(f"{'store':<12}" + "".join(f"{k:>15}" for k in keys) + f"{'calls/s (what-if)':>20}")
    for kind, rows in results.items():
        print(f"{kind:<12}" + "".join(f"{median(rows, k):>15.2f}" for k in keys)
              + f"{median(rows, 'calls') / median(rows, 'what-if'):>20,.0f}")
    for name, took in command.items():
        print(f"\nhandrail policy {name} (a new process, SQLite): median "
              f"{statistics.median(took):.2f} s", end="")
    print()
    if len(results) == 2:
        ratio = median(results["postgresql"], "what-if") / median(results["sqlite"], "what-if")
        print(f"postgresql / sqlite (what-if): {ratio:.2f}x")
    print("\nread without writing:")
    for kind, said in checks.items():
        print(f"  {kind}: {said}")


def _lsn(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row: Any = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
                                ).fetchone()
        return int(row[0])


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
