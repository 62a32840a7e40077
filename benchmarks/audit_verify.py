"""`handrail audit verify` on a store of 1,000,000 calls: how long it takes, and building it.

    .venv/bin/python benchmarks/audit_verify.py [--calls 1000000] [--store PATH] [--reps 3]

The store is built once (kept at `--store`, default /tmp/handrail-audit-1m.db, and reused
while it holds that many calls): 100,000 runs of 10 calls each, each call recorded STARTED
and FINISHED with a verdict, an approval, actions, arguments and a structured result: 2.3
facts a call. By default the rows are written directly, the facts' bodies and both chains
computed with the store's own functions; `--via-store` writes the same through the SQLite
store's `write`, 64 runs at a time, as the agent loop would (much slower to build; `verify`
reads the same thing). Building prints its time;
then `verify` of the whole store runs `--reps` times, each in a fresh process (the CLI, as a
user runs it), and the median is printed with facts and rows per second, its CPU time and
the peak resident memory of the verifying process (`ru_maxrss` of the children).
"""


from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CALLS_PER_RUN = 10
CONCURRENT = 64


def _count(path: str) -> int:
    if not os.path.exists(path):
        return -1
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT count(*) FROM calls").fetchone()[0])
    except sqlite3.Error:
        return -1
    finally:
        db.close()


async def _build(path: str, calls: int) -> None:
    import handrail as hr
    from handrail.store import Batch, CallRecord, CallStatus, RunRecord, RunStatus

    policy = hr.Policy.default().layer("app").ask(hr.Act.CALL, "ledger/transfer").to_dict()
    runs = calls // CALLS_PER_RUN
    store = hr.Store.open(path)

    async def one(k: int) -> None:
        now = time.time()
        run = RunRecord(id=f"run-{k:07d}", task=f"move money, batch {k}", agent="bench",
                        policy=policy, model="scripted", workspace="/srv/work",
                        created_at=now, updated_at=now, owner="bench:1:x", lease_until=now + 30)
        await store.write(Batch(run=run))
        for i in range(CALLS_PER_RUN):
            args = json.dumps({"from": f"acct-{k}", "to": f"acct-{i}", "amount": i * 10})
            record = CallRecord(
                id=f"{run.id}:call_{i}", run_id=run.id, call_id=f"call_{i}", turn=i, index=0,
                model_name="ledger--transfer", tool="ledger/transfer", arguments=args,
                arguments_digest="sha256:" + "ab" * 32,
                performed_arguments=json.loads(args),
                actions=[{"act": "call", "target": "ledger/transfer"}],
                verdict={"effect": "ask", "rule": {"act": "call", "pattern": "ledger/transfer",
                                                   "effect": "ask"},
                         "layer": "app", "target": "ledger/transfer"},
                decision={"kind": "approve", "modified": None, "remember": []},
                decided_by="alice", status=CallStatus.STARTED, started_at=time.time())
            await store.write(Batch(run=run, calls=[record]))
            record.status = CallStatus.FINISHED
            record.result = {"content": [{"kind": "text", "text": f"moved {i * 10}"}],
                             "structured": {"ok": True, "id": f"tx-{k}-{i}"}, "is_error": False}
            record.ended_at = time.time()
            run.steps = i + 1
            await store.write(Batch(run=run, calls=[record]))
        run.status = RunStatus.COMPLETED
        run.outcome = {"kind": "completed", "output": "done"}
        run.owner = None
        await store.write(Batch(run=run))

    started = time.perf_counter()
    for first in range(0, runs, CONCURRENT):
        await asyncio.gather(*(one(k) for k in range(first, min(first + CONCURRENT, runs))))
        if first and first % 10_000 == 0:
            print(f"  {first * CALLS_PER_RUN:,} calls, {time.perf_counter() - started:.0f} s",
                  flush=True)
    await store.close()


def _build_direct(path: str, calls: int, version: int = 3) -> None:
    """The same record, written as rows: the bodies and both chains computed with the
    store's own functions (`handrail.store.audit`), in big transactions (a call's fact keeps
    its hash alone, as the store writes it). `version`: the encoding's (3, as a SQLite store
    writes it now; 2, as before its migration 0013, or as PostgreSQL writes it).

    Writing a million calls through `write` (two chained writes each) takes as long as a
    million agent-loop writes; what `verify` reads is the same either way, and
    `--via-store` builds through `write` to show it (at ~100 µs a call that is minutes).
    """
    import hashlib

    import handrail as hr
    from handrail.store import audit
    from handrail.store._sqlite import _CALL_COLUMNS, _RUN_COLUMNS

    store = hr.Store.open(path)  # the schema
    asyncio.run(store.close())
    policy = json.dumps(hr.Policy.default().layer("app").ask(
        hr.Act.CALL, "ledger/transfer").to_dict(), separators=(",", ":"))
    verdict = ('{"effect":"ask","rule":{"act":"call","pattern":"ledger/transfer","effect":'
               '"ask"},"layer":"app","target":"ledger/transfer"}')
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    seq, link = 0, audit.ZERO if version == 2 else audit.ZERO_HASH
    now = time.time()
    db.execute("BEGIN")
    for k in range(calls // CALLS_PER_RUN):
        rid = f"run-{k:07d}"
        run = (rid, f"move money, batch {k}", "bench", "completed", None, policy, None,
               "scripted", "/srv/work", now, now, '{"kind":"completed","output":"done"}', 0,
               0, 0, "[]", CALLS_PER_RUN, None, 0.0, "[]", None, None, 0)
        db.execute(f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({','.join('?' * 23)})", run)
        facts = [("run", rid, audit.run_body(run, version)),
                 ("status", rid, audit.status_body(rid, "running", None, version))]
        for i in range(CALLS_PER_RUN):
            args = json.dumps({"from": f"acct-{k}", "to": f"acct-{i}", "amount": i * 10},
                              separators=(",", ":"))
            row = [f"{rid}:call_{i}", rid, f"call_{i}", i, 0, "ledger--transfer",
                   "ledger/transfer", args, "sha256:" + hashlib.sha256(args.encode()).hexdigest(),
                   args, '[{"act":"call","target":"ledger/transfer"}]', verdict,
                   '{"kind":"approve","modified":null,"remember":[]}', "alice", "started", None,
                   None, None, "[]", None, now, None, None]
            facts.append(("call", row[0], audit.call_body(row, version)))
            row[14], row[21] = "finished", now
            row[15] = (f'{{"content":[{{"kind":"text","text":"moved {i * 10}"}}],"structured":'
                       f'{{"ok":true,"id":"tx-{k}-{i}"}},"is_error":false}}')
            row[22] = '{"output":"untrusted","trusted":[]}'
            facts.append(("call", row[0], audit.call_body(row, version)))
            db.execute(f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES ({','.join('?' * 23)})",
                       row)
        facts.append(("status", rid, audit.status_body(rid, "completed", run[11], version)))
        prev: Any = audit.ZERO if version == 2 else audit.ZERO_HASH
        rows = []
        for n, (kind, ref, body) in enumerate(facts):
            seq += 1
            # (A call's fact keeps its hash alone: its body is the row. Version 3 keeps no
            # `prev`: it is the run's previous hash.)
            if version == 2:
                digest = audit.chain_hash(prev, body)
                link = audit.link_hash(link, digest)
                kept = prev
            else:
                digest = audit.fact_hash(prev, body)
                link = audit.fact_link(link, digest)
                kept = None
            rows.append((seq, rid, n, kind, ref, None if kind == "call" else body, kept,
                         digest, link, now))
            prev = digest
        db.executemany("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        if k % 5000 == 4999:
            db.execute("COMMIT")
            db.execute("BEGIN")
    db.execute("COMMIT")
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--store", default="/tmp/handrail-audit-1m.db")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--verify-only", action="store_true",
                        help="reuse the store whatever it holds (no count check)")
    parser.add_argument("--via-store", action="store_true",
                        help="build through the store's write (slow: as the agent loop)")
    parser.add_argument("--version", type=int, choices=(2, 3), default=3,
                        help="the chain's encoding the rows are built in (not --via-store)")
    args = parser.parse_args()
    if not args.verify_only and _count(args.store) != args.calls:
        for leftover in (args.store, args.store + "-wal", args.store + "-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)
        print(f"building {args.calls:,} calls in {args.store} ...", flush=True)
        started = time.perf_counter()
        if args.via_store:
            asyncio.run(_build(args.store, args.calls))
        else:
            _build_direct(args.store, args.calls, args.version)
        built = time.perf_counter() - started
        print(f"built in {built:.0f} s ({built / args.calls * 1e6:.0f} µs a call, "
              + ("two chained writes each)" if args.via_store else "written as rows)"))
    else:
        print(f"reusing {args.store} ({args.calls:,} calls)")
    size = os.path.getsize(args.store) / 2**20
    times: list[float] = []
    cpus: list[float] = []
    report: dict[str, object] = {}
    for _ in range(args.reps):
        started = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "handrail.cli", "audit", "verify",
                               "--store", args.store, "--json"], capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"verify failed: {proc.stdout[:2000]} {proc.stderr[:2000]}")
        report = json.loads(proc.stdout)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB
    median = statistics.median(times)
    facts, rows = int(report["facts"]), int(report["rows"])  # type: ignore[call-overload]
    cpu = statistics.median(cpus)
    print(f"\n| store | facts | rows | verify wall, median of {args.reps} | CPU | peak memory "
          "| facts/s (wall) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.calls:,} calls, {size:,.0f} MiB | {facts:,} | {rows:,} | {median:.1f} s | "
          f"{cpu:.1f} s | {peak:,.0f} MiB | {facts / median:,.0f} |")
    print("runs (wall, CPU):", ", ".join(f"{t:.1f} s / {c:.1f} s"
                                        for t, c in zip(times, cpus, strict=True)))


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
