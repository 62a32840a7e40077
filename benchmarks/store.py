"""The stores side by side: calls recorded per second, and resume throughput and latency.

Part 1, calls/s: R concurrent runs (R = 1, 10, 100) on one event loop, 20 calls each (scripted
model, one trivial tool call per turn), against the memory store, a SQLite file and a
PostgreSQL database (a throwaway server with its default durability: fsync on).

Part 2, resume: M runs each paused on an approval, then resumed by workers. Reported: runs
resumed per second and the latency to each run's action (p50/p99; the tool stamps the time it
performed). PostgreSQL: W `handrail worker` processes (W = 1, 4), each resuming one run at a
time (`--concurrency 1`; `--worker-concurrency` changes it), in two modes (`--modes`):

- backlog: every run is decided first, while a stand-in owner holds them all; then one
  statement releases them at once (and notifies). Runs/s from that moment to the last action:
  the workers' throughput alone, what "4 workers >= 3x one worker" is about. Latency is from
  the release.
- stream: the runs are decided while the workers run (50 deciders at a time). Runs/s from the
  first decision to the last action: the deciding process's pace counts too (it can be the
  bottleneck); latency is decision -> action.

Memory and SQLite have no worker (one process owns them): W resumer tasks in the deciding
process, stream mode.

Figures are medians over `--reps` repeats. For PostgreSQL it also reports the CPU each
resume costs, measured from /proc over the resume phase: the workers' CPU, the database
server's (every backend, reaped ones included) and the deciding process's (stream mode), per
run resumed. On a machine with C cores the runs resumed per second can never exceed
C / (total CPU per resume): the ceiling the 4-worker figure is held against. And what taking
the runs cost, from the workers' `worker_stopped` lines: notifications received, claims sent
and claims that took nothing, per run resumed (a worker of an older tree does not say).

    .venv/bin/python benchmarks/store.py [--reps 3] [--runs 1,10,100] [--resume-runs 200]
        [--stores memory,sqlite,postgresql] [--no-calls] [--action-ms 0,20]
        [--modes backlog,stream] [--worker-concurrency 1] [--history N]

Another tree's code (the workers and this process's handrail): run it with
`PYTHONPATH=OTHER/src`; the workers inherit it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, Turn, UserMessage, call, reply

CALLS_PER_RUN = 20
HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------- the resumed agent


@hr.tool(server="bench", name="act")
async def act(key: str) -> str:
    """Wait like a call to another service ($BENCH_ACTION_MS), perform once, stamp when."""
    wait_ms = float(os.environ.get("BENCH_ACTION_MS", "0"))
    if wait_ms:
        await anyio.sleep(wait_ms / 1000)
    fd = os.open(os.environ["BENCH_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {time.time()}\n".encode())
    finally:
        os.close(fd)
    return "done"


def _act_turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    first = next(m for m in messages if isinstance(m, UserMessage))
    return call("bench/act", {"key": first.text})


AGENT = hr.Agent(Scripted([_act_turn, reply("done")]), [act], policy=hr.Policy.default(),
                 name="bench-resume", ref="store:AGENT")
"""Pauses on an approval for bench/act; `handrail worker` rebuilds it from `store:AGENT`."""

# ---------------------------------------------------------------- part 1: calls/s


async def _calls_per_second(url: str, runs: int) -> float:
    @hr.tool(mutates=False)
    async def add(a: int) -> int:
        return a + 1

    def turn(n: int) -> Any:
        return call("add", {"a": n}) if n < CALLS_PER_RUN else reply("done")

    agent = hr.Agent(Scripted([turn(i) for i in range(CALLS_PER_RUN + 1)]), [add],
                     policy=hr.Policy.default(), max_steps=CALLS_PER_RUN + 5)
    async with hr.Store.open(url) as store:
        await agent.run("warm up", store=store)
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(lambda i=i: agent.run(f"run {i}", store=store))
        elapsed = time.perf_counter() - started
    return runs * CALLS_PER_RUN / elapsed


# ---------------------------------------------------------------- part 2: resume


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _pause_runs(store: hr.Store, count: int) -> list[str]:
    limit = anyio.Semaphore(50)
    items: list[str] = []

    async def one(i: int) -> None:
        async with limit:
            result = await AGENT.run(f"k{i}", store=store)
        items.append(result.outcome.request_id)  # type: ignore[union-attr]

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    return items


async def _decide(store: hr.Store, items: list[str]) -> dict[str, float]:
    """Decide every item, 50 at a time (as many people or an inbox would, concurrently)."""
    decided: dict[str, float] = {}
    approve = hr.Decision.approve().to_dict()
    limit = anyio.Semaphore(50)

    async def one(item_id: str) -> None:
        async with limit:
            item = await store.decide(item_id, approve, "bench")
            decided[item.run_id] = time.time()

    async with anyio.create_task_group() as tg:
        for item_id in items:
            tg.start_soon(one, item_id)
    return decided


def _effects(path: Path) -> dict[str, float]:
    stamps: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, stamp = line.split()
            stamps[key] = float(stamp)
    return stamps


def _summary(decided: dict[str, float], tasks: dict[str, str], effects: Path
             ) -> tuple[float, float, float]:
    stamps = _effects(effects)
    latencies = [stamps[tasks[run_id]] - at for run_id, at in decided.items()]
    span = max(stamps.values()) - min(decided.values())
    return len(decided) / span, _quantile(latencies, 0.5) * 1000, _quantile(latencies, 0.99) * 1000


async def _resume_in_process(url: str, count: int, resumers: int, effects: Path
                             ) -> tuple[float, float, float]:
    os.environ["BENCH_EFFECTS"] = str(effects)
    async with hr.Store.open(url) as store:
        items = await _pause_runs(store, count)
        tasks = {r.id: r.task for r in await store.runs(limit=count + 10)}
        decided = await _decide(store, items)
        queue = list(decided)

        async def resumer() -> None:
            while queue:
                await hr.resume(store, queue.pop(), agent=AGENT)

        async with anyio.create_task_group() as tg:
            for _ in range(resumers):
                tg.start_soon(resumer)
    return _summary(decided, tasks, effects)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int, *, reaped: bool = False) -> float:
    """Seconds of CPU `pid` has used (with `reaped`: plus its reaped children's)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICK


def _server_cpu(server: Any) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster, its live and its reaped backends."""
    postmaster = int((server.root / "data" / "postmaster.pid").read_text().split()[0])
    total = _cpu(postmaster, reaped=True)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rpartition(")")[2].split()[1])
            except OSError:
                continue
            if ppid == postmaster:
                total += _cpu(int(entry))
    return total


CPU: dict[str, float] = {}
"""The last PostgreSQL resume's CPU per run resumed, in seconds: workers, server, decider."""
WAKES: dict[str, float] = {}
"""The last PostgreSQL resume's notifications received, claims and empty claims per run
resumed, all workers together (from their `worker_stopped` lines)."""


GATE = "bench:gate"
"""The owner that holds every run in backlog mode until the gate opens."""


def _sql(url: str, *statements: str) -> None:
    """Run `statements` in one transaction (the benchmark's own, not the store's)."""
    import psycopg

    with psycopg.connect(url) as conn:
        for statement in statements:
            conn.execute(statement.encode())


def _history(url: str, finished: int) -> None:
    """A store that has been used: `finished` completed runs with a decided item each, and
    a tenth as many runs waiting for a person (an open item), older than the benchmark's."""
    waiting = finished // 10
    _sql(url,
         "INSERT INTO runs (id, task, status, created_at, updated_at, outcome) SELECT "
         f"'old' || g, 't', 'completed', g, g, '{{}}' FROM generate_series(1, {finished}) g",
         "INSERT INTO pending (id, kind, run_id, call_record, payload, created_at, state) "
         "SELECT 'pold' || g, 'approval', 'old' || g, 'c', '{}', g, 'decided' "
         f"FROM generate_series(1, {finished}) g",
         "INSERT INTO runs (id, task, status, created_at, updated_at, outcome) SELECT "
         f"'wait' || g, 't', 'awaiting_approval', g, g, '{{}}' "
         f"FROM generate_series(1, {waiting}) g",
         "INSERT INTO pending (id, kind, run_id, call_record, payload, created_at, state) "
         "SELECT 'pwait' || g, 'approval', 'wait' || g, 'c', '{}', g, 'open' "
         f"FROM generate_series(1, {waiting}) g",
         "ANALYZE")


def _resume_with_workers(url: str, count: int, workers: int, concurrency: int,
                         effects: Path, server: Any, *, backlog: bool = False,
                         history: int = 0) -> tuple[float, float, float]:
    """Resume `count` decided runs with `workers` worker processes; see `main` for modes."""
    async def prepare() -> tuple[list[str], dict[str, str]]:
        async with hr.Store.open(url) as store:
            items = await _pause_runs(store, count)
            return items, {r.id: r.task for r in await store.runs(limit=count + 10)}

    items, tasks = anyio.run(prepare)
    if history:
        _history(url, history)
    if backlog:  # held by nobody's worker: deciding makes no run ready until the gate opens
        _sql(url, f"UPDATE runs SET owner = '{GATE}', lease_until = 1e12")
    # PYTHONPATH kept after ours: `PYTHONPATH=OTHER/src` runs the workers on that code.
    env = {**os.environ, "BENCH_EFFECTS": str(effects),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE),
                                                       os.environ.get("PYTHONPATH")]))}
    # `--agents`: the agent is built before the worker says it started, as a long-running
    # worker's would have been long before; its import is not a resume's cost.
    # Each worker logs to a file: a pipe nobody drains fills at 64 KB (two lines per run)
    # and then blocks the worker's event loop on its next log line.
    logs = [effects.with_name(f"{effects.name}.worker{i}.log") for i in range(workers)]
    procs = []
    for log in logs:
        with open(log, "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "handrail.cli", "worker", "--store", url,
                 "--concurrency", str(concurrency), "--poll", "1", "--agents", "store:AGENT"],
                cwd=HERE, env=env, stdout=out, stderr=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + 120
        for p, log in zip(procs, logs, strict=True):  # each worker is listening once it says so
            while "worker_started" not in log.read_text():
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a worker did not start: {log.read_text()[-2000:]}")
                time.sleep(0.02)

        async def decide() -> dict[str, float]:
            async with hr.Store.open(url) as store:
                return await _decide(store, items)

        if backlog:
            anyio.run(decide)
        cpu_workers = sum(_cpu(p.pid) for p in procs)
        cpu_server, cpu_me = _server_cpu(server), time.process_time()
        if backlog:
            opened = time.time()
            _sql(url, f"UPDATE runs SET owner = NULL, lease_until = 0 WHERE owner = '{GATE}'",
                 "NOTIFY handrail_ready")
            decided = dict.fromkeys(tasks, opened)
        else:
            decided = anyio.run(decide)
        cpu_me = time.process_time() - cpu_me
        deadline = time.monotonic() + 300
        while len(_effects(effects)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(_effects(effects))} of {count} resumed")
            time.sleep(0.05)
        CPU.update(workers=(sum(_cpu(p.pid) for p in procs) - cpu_workers) / count,
                   server=(_server_cpu(server) - cpu_server) / count, decider=cpu_me / count)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
    # What the workers say they did (a worker of an older tree may not count them).
    WAKES.clear()
    for log in logs:
        for line in log.read_text().splitlines():
            if '"worker_stopped"' in line:
                stopped = json.loads(line)
                for key in ("notifications", "claims", "empty_claims"):
                    if key in stopped:
                        WAKES[key] = WAKES.get(key, 0) + stopped[key] / count
    return _summary(decided, tasks, effects)


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--runs", default="1,10,100")
    parser.add_argument("--resume-runs", type=int, default=200)
    parser.add_argument("--worker-concurrency", type=int, default=1)
    parser.add_argument("--action-ms", default="0,20",
                        help="how long each resumed action waits (I/O), comma-separated")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--stores", default="memory,sqlite,postgresql",
                        help="which stores, comma-separated")
    parser.add_argument("--no-calls", action="store_true", help="skip part 1 (calls/s)")
    parser.add_argument("--history", type=int, default=0,
                        help="PostgreSQL: completed runs (each with a decided item) already "
                             "in the store, and a tenth as many waiting for a person")
    parser.add_argument("--modes", default="backlog,stream",
                        help="PostgreSQL resume modes, comma-separated: backlog (every run "
                             "decided, then released to the workers at once: the workers' "
                             "throughput) and stream (decided while the workers run: "
                             "decision -> action latency, the decider included)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent / "tests"))
    import pgserver

    server = None
    if not args.no_postgres and pgserver.unavailable() is None:
        server = pgserver.start(durable=True)
    tmp = Path(tempfile.mkdtemp(prefix="handrail-bench-"))
    try:
        def url(kind: str) -> str:
            if kind == "memory":
                return "memory://"
            if kind == "sqlite":
                return str(tmp / f"runs-{time.perf_counter_ns()}.db")
            assert server is not None
            return server.create_database()

        wanted = args.stores.split(",")
        kinds = [k for k in ["memory", "sqlite"] if k in wanted] + (
            ["postgresql"] if server and "postgresql" in wanted else [])
        print(f"load average at start: {os.getloadavg()[0]:.1f}; "
              f"{os.cpu_count()} cores; handrail from {hr.__file__}\n")
        if not args.no_calls:
            print(f"calls recorded per second ({CALLS_PER_RUN} calls per run, median of "
                  f"{args.reps})\n")
            print("| concurrent runs | " + " | ".join(kinds) + " |")
            print("|---|" + "---|" * len(kinds))
        for runs in ([] if args.no_calls else [int(r) for r in args.runs.split(",")]):
            cells = []
            for kind in kinds:
                rates = [anyio.run(_calls_per_second, url(kind), runs) for _ in range(args.reps)]
                cells.append(f"{statistics.median(rates):,.0f}")
            print(f"| {runs} | " + " | ".join(cells) + " |", flush=True)

        print(f"\nresume: {args.resume_runs} paused runs decided at once (median of "
              f"{args.reps})\n")
        print("| store | action waits | workers | runs resumed/s | decision -> action p50 ms "
              "| p99 ms | CPU µs per resume: workers + server + decider = total | ceiling "
              "runs/s on these cores | notifications / claims / empty claims per resume "
              "| load |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        rates: dict[tuple[str, str, int], float] = {}
        for action_ms in args.action_ms.split(","):
            os.environ["BENCH_ACTION_MS"] = action_ms
            for kind in [k for k in kinds if k != "postgresql"] + [
                    f"postgresql {mode}" for mode in args.modes.split(",")
                    if "postgresql" in kinds]:
                for workers in (1, 4):
                    results = []
                    cpus: list[dict[str, float]] = []
                    wakes: list[dict[str, float]] = []
                    loads = []
                    for _ in range(args.reps):
                        effects = tmp / f"effects-{time.perf_counter_ns()}"
                        loads.append(os.getloadavg()[0])
                        if kind.startswith("postgresql"):
                            results.append(_resume_with_workers(
                                url("postgresql"), args.resume_runs, workers,
                                args.worker_concurrency, effects, server,
                                backlog=kind.endswith("backlog"), history=args.history))
                            cpus.append(dict(CPU))
                            wakes.append(dict(WAKES))
                        else:
                            results.append(anyio.run(_resume_in_process, url(kind),
                                                     args.resume_runs, workers, effects))
                    rate = statistics.median(r[0] for r in results)
                    rates[kind, action_ms, workers] = rate
                    p50 = statistics.median(r[1] for r in results)
                    p99 = statistics.median(r[2] for r in results)
                    label = (f"{workers} process{'es' if workers > 1 else ''}"
                             if kind.startswith("postgresql")
                             else f"{workers} task{'s' if workers > 1 else ''}")
                    cpu_cell = ceiling = wake_cell = "-"
                    if wakes and all(wakes):
                        wake_cell = " / ".join(
                            f"{statistics.median(w[k] for w in wakes):.2f}"
                            for k in ("notifications", "claims", "empty_claims"))
                    if cpus:
                        part = {k: statistics.median(c[k] for c in cpus) * 1e6
                                for k in ("workers", "server", "decider")}
                        total = sum(part.values())
                        cpu_cell = (f"{part['workers']:,.0f} + {part['server']:,.0f} + "
                                    f"{part['decider']:,.0f} = {total:,.0f}")
                        ceiling = f"{(os.cpu_count() or 1) / total * 1e6:,.0f}"
                    print(f"| {kind} | {action_ms} ms | {label} | {rate:,.0f} | {p50:,.1f} | "
                          f"{p99:,.1f} | {cpu_cell} | {ceiling} | {wake_cell} | "
                          f"{statistics.median(loads):.1f} |", flush=True)
        print()
        for (kind, action_ms, workers), rate in rates.items():
            if workers == 4:
                print(f"{kind}, action {action_ms} ms: 4 workers / 1 worker = "
                      f"{rate / rates[kind, action_ms, 1]:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            pgserver.stop(server)


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        os.environ.setdefault("BENCH_EFFECTS", os.devnull)
        main()
