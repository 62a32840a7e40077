"""What value conditions and quotas cost: a policy check, and the STARTED transaction.

Run: .venv/bin/python benchmarks/limits.py [--writes N]
     .venv/bin/python benchmarks/limits.py --against /tmp/base/src [--rounds 40]

With `--against SRC`, only the checks: this checkout's handrail and SRC's (another checkout's
`src/`, e.g. `git archive main src | tar -x -C /tmp/base`), each in a process of its own,
asked in turn for rounds of 5,000 checks of each policy; medians over the rounds, and each
figure's difference to SRC's check without conditions (the issue's "over today's").

1. `Policy.check` of `CALL bank/transfer` with its arguments, in microseconds of CPU per
   call (the verdict memo warm, as for an agent calling the same tool again):
   - the policy without value conditions (the same rules, conditions dropped);
   - 10 value conditions on the target, none holding (each one evaluated: the worst case);
   - 10 value conditions, the first holding (the strictest decides at once);
   - 10 value conditions on other tools (the target meets none of them).
   And, for the gate's view, the no-condition case as the gate decides it: a tool's planned
   CALL verdict (no check at all), which a policy with conditions gives up.
2. The STARTED write: a batch marking one call STARTED, alone and with one quota claim, on
   the memory store, a SQLite file and PostgreSQL (tests/pgserver.py; skipped when no server
   binaries), in microseconds per write, medians of repeats.
"""



from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

import handrail as hr
from handrail.policy import Policy
from handrail.store import Batch, CallRecord, CallStatus, RunRecord, Store
from handrail.store.contract import QuotaClaim, QuotaExceeded

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

TRANSFER = hr.Action(hr.Act.CALL, "bank/transfer")
ARGUMENTS = {"target": "acme", "amount": 120, "currency": "EUR", "memo": "invoice 42"}


def median_us(fn: Callable[[], object], *, number: int = 20_000, repeat: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeat):
        # CPU time, not wall time: on a shared machine the time spent waiting for a core is
        # not the check's cost.
        start = time.process_time()
        for _ in range(number):
            fn()
        times.append((time.process_time() - start) / number)
    return statistics.median(times) * 1e6


def _base() -> Policy:
    return (Policy.default().layer("app").allow(hr.Act.CALL, "bank/transfer")
            .allow(hr.Act.CALL, "mail/*").ask(hr.Act.CALL, "ledger/**"))


def policies() -> dict[str, Policy]:
    none_hold = _base().layer("limits")
    first_holds = _base().layer("limits")
    elsewhere = _base().layer("limits")
    for i in range(10):
        none_hold = none_hold.ask(hr.Act.CALL, "bank/transfer", when=f"amount > {1000 + i}")
        first_holds = first_holds.ask(hr.Act.CALL, "bank/transfer",
                                      when=f"amount > {100 if i == 0 else 1000 + i}")
        elsewhere = elsewhere.ask(hr.Act.CALL, f"other{i}/tool", when=f"amount > {1000 + i}")
    return {"no conditions": _base(), "10 conditions, none holds": none_hold,
            "10 conditions, the first holds": first_holds,
            "10 conditions on other tools": elsewhere}


def bench_checks() -> None:
    print("Policy.check(CALL bank/transfer, arguments=...), µs per call (median)")
    results: dict[str, float] = {}
    for name, policy in policies().items():
        results[name] = median_us(lambda p=policy: p.check(TRANSFER, arguments=ARGUMENTS))
    base = results["no conditions"]
    for name, us in results.items():
        print(f"  {name:34} {us:7.2f}   +{us - base:5.2f} µs   x{us / base:4.2f}")


async def _writes(store: Store, n: int, claim: bool) -> list[float]:
    run = RunRecord(id=f"r-{claim}-{time.time_ns()}", task="t", created_at=1.0,
                    updated_at=1.0)
    await store.write(Batch(run=run))
    times = []
    for i in range(n):
        record = CallRecord(id=f"{run.id}:c{i}", run_id=run.id, call_id=f"c{i}", turn=i,
                            index=0, model_name="mail_send", tool="mail/send",
                            status=CallStatus.STARTED, started_at=time.time())
        batch = Batch(calls=[record])
        if claim:
            # A limit high enough never to be reached: the statement's cost, not a refusal.
            batch.claims = [QuotaClaim(call_record=record.id, counter=f"call:mail/send|1d|"
                                       f"agent={run.id}", window=1, limit=10**9)]
        start = time.perf_counter()
        try:
            await store.write(batch)
        except QuotaExceeded:  # pragma: no cover - the limit is never reached
            raise
        times.append(time.perf_counter() - start)
    return times


async def bench_store(label: str, opener: Callable[[], Store], n: int) -> None:
    store = opener()
    try:
        await _writes(store, 50, False)  # warm up (schema, connections)
        await _writes(store, 50, True)
        plain, claimed = [], []
        for _ in range(5):  # interleaved rounds: a drift of the machine hits both alike
            plain += await _writes(store, n // 5, False)
            claimed += await _writes(store, n // 5, True)
    finally:
        await store.close()
    a, b = statistics.median(plain) * 1e6, statistics.median(claimed) * 1e6
    print(f"  {label:12} {a:8.1f} {b:12.1f}   +{b - a:6.1f} µs   x{b / a:4.2f}")


def _worker() -> None:
    """Answer each line on stdin with one round: µs per check of each policy, in order."""
    checks = list(policies().values())
    for policy in checks:
        policy.check(TRANSFER, arguments=ARGUMENTS)
    for _ in sys.stdin:
        out = []
        for policy in checks:
            start = time.process_time()
            for _ in range(5000):
                policy.check(TRANSFER, arguments=ARGUMENTS)
            out.append((time.process_time() - start) / 5000 * 1e6)
        print(" ".join(f"{us:.4f}" for us in out), flush=True)


def against(src: str, rounds: int) -> None:
    """The checks, this checkout beside `src`, interleaved round by round."""
    import os
    import subprocess

    here = str(Path(__file__).resolve().parents[1] / "src")
    workers = {}
    for label, path in (("against", src), ("this", here)):
        env = {**os.environ, "PYTHONPATH": path}
        workers[label] = subprocess.Popen(
            [sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env)
    results: dict[str, list[list[float]]] = {label: [] for label in workers}
    try:
        for n in range(rounds):
            order = list(workers.items())
            for label, worker in order if n % 2 == 0 else reversed(order):
                assert worker.stdin is not None and worker.stdout is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
                results[label].append([float(x) for x in worker.stdout.readline().split()])
    finally:
        for worker in workers.values():
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()
    base = statistics.median(r[0] for r in results["against"])
    print(f"Policy.check(CALL bank/transfer, arguments=...), µs CPU per call, medians of "
          f"{rounds} interleaved rounds of 5,000")
    print(f"  {'policy':34} {'against':>8} {'this':>8}   this over against's 'no conditions'")
    for i, name in enumerate(policies()):
        a = statistics.median(r[i] for r in results["against"])
        b = statistics.median(r[i] for r in results["this"])
        print(f"  {name:34} {a:8.2f} {b:8.2f}   {b - base:+6.2f} µs")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--against", help="another checkout's src/: the checks beside it")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker()
        return
    if args.against:
        against(args.against, args.rounds)
        return
    bench_checks()
    print()
    print("A STARTED write, µs per write (median): alone, and with one quota claim")
    print(f"  {'store':12} {'alone':>8} {'with claim':>12}")
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(bench_store, "memory", Store.memory, args.writes)
        anyio.run(bench_store, "SQLite", lambda: Store.open(Path(folder) / "runs.db"),
                  args.writes)
        import pgserver

        why = pgserver.unavailable()
        if why is not None:
            print(f"  PostgreSQL   skipped: {why}")
            return
        server = pgserver.start()
        try:
            url = server.create_database()
            anyio.run(bench_store, "PostgreSQL", lambda: Store.open(url), args.writes)
        finally:
            pgserver.stop(server)


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
