"""`handrail runs` / `pending` / `show` on a store of 10,000 runs: wall time of each command.

Builds (once, cached in a temporary folder per run of this script) a SQLite store of R runs,
each with four messages and two calls, one run in ten paused on an approval; then times each
command as a user runs it (a fresh process: interpreter, imports, open, query, print),
median over the repeats, next to `python -c pass` (the interpreter alone), wall and CPU time
(the child's user + system time: steadier on a shared machine). `--against DIR` runs every
command from another build too, interleaved (`PYTHONPATH=DIR`).

    .venv/bin/python benchmarks/cli_store.py [--runs 10000] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


async def build(path: Path, runs: int) -> str:
    from handrail.store import (
        Batch,
        CallRecord,
        CallStatus,
        PendingItem,
        RunRecord,
        RunStatus,
        Store,
    )

    now = time.time()
    store = Store.open(path)
    last = ""

    async def one(i: int) -> None:
        nonlocal last
        run_id = f"run-{i:06d}"
        paused = i % 10 == 0
        run = RunRecord(id=run_id, task=f"task {i}", agent="bench", created_at=now - runs + i,
                        updated_at=now, policy={"layers": []},
                        status=RunStatus.AWAITING_APPROVAL if paused else RunStatus.COMPLETED,
                        # The store checks that status and outcome agree.
                        outcome={"kind": "awaiting_approval" if paused else "completed"})
        # A user message, then the model's turns (each with the call `show` draws under it).
        messages = [(run_id, 0, {"kind": "user", "text": f"task {i}: add one and one"}),
                    *((run_id, k, {"kind": "assistant",
                                   "parts": [{"kind": "text", "text": f"turn {k} of run {i}"}]})
                      for k in range(1, 4))]
        calls = [CallRecord(id=f"{run_id}:c{k}", run_id=run_id, call_id=f"c{k}", turn=k, index=0,
                            model_name="add", tool="local/add", arguments='{"a": 1}',
                            actions=[{"act": "read", "target": f"data/{i}.csv"}],
                            verdict={"effect": "allow", "reason": "layer app: read:data/**"},
                            status=CallStatus.FINISHED,
                            result={"content": [{"kind": "text", "text": "2"}]})
                 for k in range(2)]
        # What an approval's payload holds (what `pending` prints of each item).
        payload = {"act": "write", "target": f"out/{i}.csv",
                   "actions": [{"act": "write", "target": f"out/{i}.csv"}],
                   "verdict_reason": "layer app: ask write:out/**",
                   "arguments": {"path": f"out/{i}.csv", "text": "a,b\n1,2\n" * 20}}
        pending = [PendingItem(id=f"req-{i:06d}", kind="approval", run_id=run_id,
                               call_record=calls[-1].id, agent="bench", tool="local/add",
                               payload=payload, created_at=now - runs + i)] if paused else []
        await store.write(Batch(run=run, messages=messages, calls=calls, pending=pending))
        last = run_id

    for start in range(0, runs, 500):
        await asyncio.gather(*(one(i) for i in range(start, min(runs, start + 500))))
    await store.close()
    return last


async def store_side(path: Path, last: str, reps: int) -> dict[str, float]:
    """The store's share of each command, in this process: open, query, close."""
    from handrail.store import Store

    samples: dict[str, list[float]] = {}

    def note(label: str, t0: float) -> float:
        now = time.perf_counter()
        samples.setdefault(label, []).append(1e3 * (now - t0))
        return now

    for _ in range(reps):
        t = time.perf_counter()
        store = Store.open(path)
        t = note("Store.open", t)
        await store.runs(limit=50)
        t = note("runs(limit=50)", t)
        await store.pending()
        t = note(f"pending() ({args_runs(path)} open items)", t)
        if hasattr(store, "pending_page"):  # not in a build before issue 11's third round
            await store.pending_page(50)
            t = note("pending_page(50)", t)
        await store.run(last)
        await store.calls(last)
        await store.messages(last)
        t = note("run + calls + messages (show)", t)
        await store.close()
        note("close", t)
    return {k: statistics.median(v) for k, v in samples.items()}


def args_runs(path: Path) -> int:
    import sqlite3

    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT count(*) FROM pending WHERE state = 'open'").fetchone()[0])
    finally:
        db.close()


def timed_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One command: (wall ms, CPU ms of the child process, user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 1e3 * wall, 1e3 * cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--db", default="",
                        help="the store to use; built there (R runs) when it does not exist")
    parser.add_argument("--against", default="",
                        help="a src folder of another build (say main's): each command also "
                             "runs from it, interleaved, in a 'before' column")
    args = parser.parse_args()
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "runs.db"
    if path.exists():
        last = f"run-{args.runs - 1:06d}"
    else:
        t0 = time.perf_counter()
        last = asyncio.run(build(path, args.runs))
        print(f"built {args.runs:,} runs in {time.perf_counter() - t0:.1f} s "
              f"({os.path.getsize(path) / 1e6:.1f} MB)", file=sys.stderr)
    # As a user runs it: with the bytecode cache. PYTHONDONTWRITEBYTECODE (set in some shells
    # and CI images) would have every command compile handrail's sources again, ~90 ms that
    # no installed handrail pays; one untimed warm-up per build writes the caches.
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    envs: dict[str, dict[str, str]] = {"": base}
    if args.against:
        envs = {"before": {**base, "PYTHONPATH": os.path.abspath(args.against)},
                "after": base}
    cli = [sys.executable, "-m", "handrail.cli"]
    rows = [
        ("python -c pass (the interpreter alone)", [sys.executable, "-c", "pass"]),
        ("handrail --help", [*cli, "--help"]),
        ("handrail runs", [*cli, "runs", "--store", str(path)]),
        ("handrail runs --json", [*cli, "runs", "--json", "--store", str(path)]),
        ("handrail pending", [*cli, "pending", "--store", str(path)]),
        (f"handrail show {last}", [*cli, "show", last, "--store", str(path)]),
    ]
    print(f"\n## CLI on a store of {args.runs:,} runs: median ms over {args.reps} "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
          + (f"; before = {args.against}, interleaved" if args.against else "") + ")\n")
    names = [k or "" for k in envs]
    print("| command | " + " | ".join(f"wall ms {k}".strip() for k in names) + " | "
          + " | ".join(f"CPU ms {k}".strip() for k in names) + " |")
    print("|---" * (1 + 2 * len(envs)) + "|")
    for env in envs.values():
        for _, argv in rows:
            subprocess.run(argv, check=True, capture_output=True, env=env)
    for label, argv in rows:
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in envs}
        for _ in range(args.reps):
            for k, env in envs.items():
                samples[k].append(timed_once(argv, env))
        walls = [statistics.median(w for w, _ in samples[k]) for k in envs]
        cpus = [statistics.median(c for _, c in samples[k]) for k in envs]
        print(f"| `{label}` | " + " | ".join(f"{w:,.0f}" for w in walls) + " | "
              + " | ".join(f"{c:,.0f}" for c in cpus) + " |", flush=True)
    print("\nThe store's share, in-process (median ms):\n")
    print("| operation | ms |")
    print("|---|---|")
    for label, ms in asyncio.run(store_side(path, last, args.reps)).items():
        print(f"| {label} | {ms:,.1f} |")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
