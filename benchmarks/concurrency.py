"""Many runs at once on one store and one event loop: calls per second, and the loop's lag.

R concurrent runs (R = 1, 10, 100, 1,000), 40 calls each (scripted model, one trivial async
tool call per turn), all on one asyncio loop, against the memory store, a SQLite file
(`durability="process"`, the default), a SQLite file with `durability="fsync"` and PostgreSQL
(a throwaway local server, `tests/pgserver.py`, a fresh database per child; left out with the
reason when the server binaries are missing). Each store x R
runs in a fresh process, after a warm-up run; figures are medians over the repeats.

Reported per row:
- calls/s: tool calls completed per second of wall time, all runs together;
- CPU µs/call: the process's CPU time (all threads, kernel included) per call: steadier than
  wall time on a shared machine, where other processes take the CPU;
- loop lag p50/p99: how late a 5 ms timer fires while the runs go (what any other task on the
  loop, a web request say, would wait); "steady" counts only the samples taken once every run
  has made a call and before the first one ends (not the launch, where `gather` starts every
  run in one iteration);
- iteration CPU p99: the loop iteration a timer falls into at p99 (iterations weighted by
  their length), in CPU time of the loop's thread: the lag without the other processes of a
  shared machine, which stretch wall-clock lag 2-5x under load;
- turn gap p50/p99: from a tool's return to the next model request of the same run (the
  gate's record stage, the store's commit, the scheduling of the next turn).

    .venv/bin/python benchmarks/concurrency.py [--reps 3] [--runs 1,10,100,1000]
        [--gc default,freeze,tuned] [--waves 1] [--against OLD/src]

`--waves W` keeps R runs going W times over (a new run as soon as one ends): R x W x 40 calls.
The default (one wave) measures R runs started together; the SQLite store folds its log every
`CHECKPOINT_EVERY` writes (16,384), which a wave of 100 x 40 never reaches: `--runs 100
--waves 30` includes seven folds, the throughput a busy server keeps up.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

CALLS_PER_RUN = 40
STORES = ("memory", "sqlite", "sqlite_fsync", "postgresql")
LABELS = {"memory": "memory", "sqlite": "SQLite (process)", "sqlite_fsync": "SQLite (fsync)",
          "postgresql": "PostgreSQL"}
PG_URL = "HANDRAIL_BENCH_PG_URL"
"""The environment variable that hands a child its PostgreSQL database (one per child)."""


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _weighted_p99(stretches: Sequence[float]) -> float:
    """The iteration a timer falls into at p99: iterations weighted by their length."""
    ordered = sorted(stretches)
    total = sum(ordered)
    seen = 0.0
    for value in ordered:
        seen += value
        if seen >= 0.99 * total:
            return value
    return float("nan")


async def _session(store_kind: str, runs: int, tmp: str, waves: int = 1) -> dict[str, Any]:
    import handrail as hr
    from handrail.models import Scripted, Turn, UserMessage, call, reply

    returned: dict[int, float] = {}
    gaps: list[float] = []
    calls = 0
    # The steady state: from the moment every run has made a call to the first run's end.
    # Before it, the launch: `gather` starts every run in one loop iteration (each run's set-up
    # before its first write, ~0.3-0.5 ms, times R), a burst a server spreads over time.
    called: set[int] = set()
    steady: list[float] = []

    @hr.tool(mutates=False)
    async def add(run: int, a: int) -> int:
        nonlocal calls
        calls += 1
        returned[run] = time.perf_counter()
        if not steady:
            called.add(run)
            if len(called) == runs:
                steady.append(time.perf_counter())
        return a + 1

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            first = messages[0]
            assert isinstance(first, UserMessage)
            run = int(first.text.rsplit(maxsplit=1)[-1])
            if run in returned:
                gaps.append(time.perf_counter() - returned.pop(run))
            return call("add", {"run": run, "a": n}) if n < CALLS_PER_RUN else reply("done")

        return make

    agent = hr.Agent(Scripted([turn(i) for i in range(CALLS_PER_RUN + 1)]), [add],
                     policy=hr.Policy.default(), max_steps=CALLS_PER_RUN + 5)

    def open_store() -> Any:
        if store_kind == "memory":
            return hr.Store.memory()
        if store_kind == "postgresql":
            # A fresh database per child (made by the driver), on a throwaway local server
            # started with fsync on (tests/pgserver.py): every commit is durable.
            return hr.Store.open(os.environ[PG_URL])
        path = os.path.join(tmp, f"runs-{time.perf_counter_ns()}.db")
        # The option only when asked for: the same script measures builds without it.
        options = {"durability": "fsync"} if store_kind == "sqlite_fsync" else {}
        return hr.Store.open(path, **options)

    lags: list[float] = []
    steady_lags: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        period = 0.005
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(period)
            lags.append(time.perf_counter() - t0 - period)
            if len(steady) == 1:
                steady_lags.append(lags[-1])

    # The loop's busy stretches in CPU time of its thread: what a timer waits for, without
    # the other processes of a shared machine (which stretch wall-clock lag 2-5x under load).
    loop = asyncio.get_running_loop()
    stretches: list[float] = []
    run_once = loop._run_once  # type: ignore[attr-defined]

    def timed_run_once() -> None:
        c0 = time.thread_time()
        run_once()
        if len(steady) == 1:
            stretches.append(time.thread_time() - c0)

    async def one(k: int) -> Any:
        # `waves` runs one after the other in this slot: R runs at a time, a new one as soon
        # as one ends, as a server sees them (and long enough for the SQLite store's folds).
        for _ in range(waves):
            result = await agent.run(f"add things, run {k}", store=store)
            if len(steady) == 1:
                steady.append(time.perf_counter())  # the first run's end closes the window
            if result.output != "done":
                break
        return result

    store = open_store()
    probe_task = asyncio.create_task(probe())
    loop._run_once = timed_run_once  # type: ignore[attr-defined]
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        results = await asyncio.gather(*(one(k) for k in range(runs)))
    finally:
        del loop._run_once  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    stop.set()
    await probe_task
    await store.close()
    assert all(r.output == "done" for r in results), [r.outcome for r in results][:3]
    assert calls == runs * CALLS_PER_RUN * waves, calls
    return {"calls_per_s": calls / elapsed, "cpu_us_per_call": 1e6 * cpu / calls,
            "lag_p50_ms": 1e3 * _quantile(lags, 0.5), "lag_p99_ms": 1e3 * _quantile(lags, 0.99),
            "gap_p50_ms": 1e3 * _quantile(gaps, 0.5), "gap_p99_ms": 1e3 * _quantile(gaps, 0.99),
            "steady_lag_p50_ms": 1e3 * _quantile(steady_lags, 0.5),
            "steady_lag_p99_ms": 1e3 * _quantile(steady_lags, 0.99),
            "iter_cpu_p99_ms": 1e3 * _weighted_p99(stretches),
            "iter_cpu_max_ms": 1e3 * max(stretches, default=float("nan"))}


BEFORE = " (before)"
"""The suffix of a row run from the `--against` build."""
GC_MODES = {"freeze": " + gc.freeze()", "tuned": " + tune_for_many_runs()"}
"""`--gc` modes other than the collector as it comes, and the suffix of their rows."""


def child(store_kind: str, runs: int, waves: int = 1) -> None:
    """One store x one concurrency in this process: warm up, then measure one session."""
    tmp = tempfile.mkdtemp()
    loop = asyncio.new_event_loop()
    kind, mode = store_kind, ""
    for name, suffix in GC_MODES.items():
        if suffix in kind:
            kind, mode = kind.replace(suffix, ""), name
    kind = kind.removesuffix(BEFORE)
    loop.run_until_complete(_session(kind, 2, tmp))
    # handrail froze start-up at the warm-up's first run (`collector.freeze_start_up`; a build
    # from before it did not): "freeze" freezes again after the warm-up (what the warm-up
    # built too), "tuned" is the host's opt-in for hundreds of runs.
    if mode == "freeze":
        # Everything allocated so far (imports, the agent) leaves the collector's
        # generations for good.
        gc.freeze()
    elif mode == "tuned":
        try:
            from handrail.collector import tune_for_many_runs
        except ImportError:  # an --against build from before it existed: the same setting
            gc.freeze()
            gc.set_threshold(gc.get_threshold()[0], gc.get_threshold()[1], 100)
        else:
            tune_for_many_runs()
    try:
        print(json.dumps(loop.run_until_complete(_session(kind, runs, tmp, waves))))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a file of 10-100 MB a child


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--runs", default="1,10,100,1000")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--against", default="",
                        help="a src folder of another build (say main's): every row also "
                             "runs from it, interleaved process by process, as '(before)'")
    parser.add_argument("--gc", default="default",
                        help="comma-separated collector settings, each row run with each: "
                             "'default' (as it comes: handrail freezes start-up at its "
                             "first run), 'freeze' (gc.freeze() again after the warm-up), "
                             "'tuned' (handrail.collector.tune_for_many_runs() "
                             "after the warm-up; the --against build must have it)")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="the same as --gc default,freeze")
    parser.add_argument("--waves", type=int, default=1,
                        help="runs one after the other in each of the R slots (default 1): "
                             "R at a time, R x WAVES in all; with 30 at R=100, 120,000 calls, "
                             "long enough to include the SQLite store's folds of its log")
    parser.add_argument("--child", nargs=3, metavar=("STORE", "RUNS", "WAVES"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    if args.waves < 1:
        parser.error(f"--waves must be 1 or more, not {args.waves}")
    levels = [int(x) for x in args.runs.split(",")]
    stores = args.stores.split(",")
    unknown = set(["default", "freeze"] if args.gc_freeze else args.gc.split(",")) - {
        "default", *GC_MODES}
    if unknown:
        parser.error(f"unknown --gc setting(s) {sorted(unknown)}: use default, freeze, tuned")
    strange = set(stores) - set(STORES)
    if strange:
        parser.error(f"unknown store(s) {sorted(strange)}: use {', '.join(STORES)}")
    server = None
    if "postgresql" in stores:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests"))
        import pgserver

        why = pgserver.unavailable()
        if why is None:
            server = pgserver.start(durable=True)
        else:
            print(f"PostgreSQL left out: {why}", file=sys.stderr)
            stores = [s for s in stores if s != "postgresql"]
    try:
        _drive(args, levels, stores, server)
    finally:
        if server is not None:
            pgserver.stop(server)


def _drive(args: argparse.Namespace, levels: list[int], stores: list[str],
           server: Any) -> None:
    """Every store x concurrency x repeat, each in a fresh child process; then the table."""
    if args.against:
        stores = [k for s in stores for k in (s + BEFORE, s)]
    modes = ["default", "freeze"] if args.gc_freeze else args.gc.split(",")
    stores = [s + ("" if m == "default" else GC_MODES[m]) for s in stores for m in modes]
    env_before = {**os.environ, "PYTHONPATH": os.path.abspath(args.against)}

    def env_for(kind: str) -> dict[str, str] | None:
        env = env_before if BEFORE in kind else None
        if kind.startswith("postgresql"):
            env = {**(env or os.environ), PG_URL: server.create_database()}
        return env
    rows: dict[tuple[str, int], list[dict[str, float]]] = {}
    for rep in range(args.reps):
        for runs in levels:
            for kind in stores:
                proc = subprocess.run([sys.executable, __file__, "--child", kind, str(runs),
                                       str(args.waves)],
                                      capture_output=True, text=True, check=False,
                                      env=env_for(kind))
                if proc.returncode:
                    raise SystemExit(f"{kind} x {runs} failed:\n{proc.stderr}")
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.setdefault((kind, runs), []).append(row)
                print(f"rep {rep} {kind:30s} runs={runs:5d} {row['calls_per_s']:9,.0f} calls/s "
                      f"lag p99 {row['lag_p99_ms']:6.2f} ms", file=sys.stderr, flush=True)

    def med(kind: str, runs: int, key: str) -> float:
        return statistics.median(r[key] for r in rows[(kind, runs)])

    waves = "" if args.waves == 1 else f", {args.waves} runs one after another per slot"
    print(f"\n## {CALLS_PER_RUN} calls per run{waves}, one event loop: medians over "
          f"{args.reps} repeats (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)\n")
    print("| store | runs | calls/s | × memory | × own 1-run | CPU µs/call | "
          "loop lag p50 / p99 ms | steady lag p50 / p99 ms | iteration CPU p99 ms | "
          "turn gap p50 / p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in stores:
        for runs in levels:
            cps = med(kind, runs, "calls_per_s")
            suffix = kind.removeprefix(kind.split(" ")[0])
            vs_memory = (f"{cps / med('memory' + suffix, runs, 'calls_per_s'):.2f}"
                         if ("memory" + suffix, runs) in rows else "-")
            vs_one = (f"{cps / med(kind, levels[0], 'calls_per_s'):.2f}"
                      if levels[0] == 1 else "-")
            label = LABELS.get(kind.split(" ")[0], kind) + suffix
            print(f"| {label} | {runs:,} | {cps:,.0f} | {vs_memory} | {vs_one} | "
                  f"{med(kind, runs, 'cpu_us_per_call'):.0f} | "
                  f"{med(kind, runs, 'lag_p50_ms'):.2f} / {med(kind, runs, 'lag_p99_ms'):.2f} | "
                  f"{med(kind, runs, 'steady_lag_p50_ms'):.2f} / "
                  f"{med(kind, runs, 'steady_lag_p99_ms'):.2f} | "
                  f"{med(kind, runs, 'iter_cpu_p99_ms'):.2f} | "
                  f"{med(kind, runs, 'gap_p50_ms'):.2f} / {med(kind, runs, 'gap_p99_ms'):.2f} |")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
