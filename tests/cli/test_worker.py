"""`handrail worker` on a real PostgreSQL: workers resume decided runs, exactly once.

Side effects are counted in a file the tools append to (`worker_agents.py`), never by the
store's own word. Workers are real processes; one is SIGKILLed mid-way.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.store import RunStatus, Store

# Every test here starts worker processes: under load (other suites on the 2 cores) their
# start alone can take many seconds. The waits inside the tests are the deadlines that
# matter (generous: a slow machine is not what they check); the per-test timeout is above
# them, so a failure says which wait ran out, not that pytest lost patience.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).parent
HANDRAIL = [sys.executable, "-m", "handrail.cli"]
RUNS = int(os.environ.get("HANDRAIL_WORKER_TEST_RUNS", "1000"))
"""Runs in the 4-worker test (1,000 by default; see docs/postgres.md for its time)."""


def _env(effects: Path) -> dict[str, str]:
    env = {**os.environ, "EFFECTS": str(effects), "PYTHONPATH": str(HERE)}
    env.pop("HANDRAIL_STORE", None)
    return env


def _start_worker(url: str, effects: Path, log: Path, *extra: str,
                  env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*HANDRAIL, "worker", "--store", url, "--poll", "1", "--grace", "20", *extra],
            cwd=HERE, env={**_env(effects), **(env or {})}, stdout=out,
            stderr=subprocess.STDOUT)


def _log_lines(log: Path) -> list[dict[str, Any]]:
    lines = []
    for text in log.read_text().splitlines():
        if text.startswith("{"):
            lines.append(json.loads(text))
    return lines


async def _start_runs(url: str, tasks: list[str]) -> dict[str, str]:
    """Start one run per task (each pauses); returns run id -> task."""
    from worker_agents import AGENT

    started: dict[str, str] = {}
    limit = anyio.Semaphore(50)
    async with Store.open(url) as store:

        async def one(task: str) -> None:
            async with limit:
                result = await AGENT.run(task, store=store)
            assert result.outcome.kind in ("awaiting_approval", "awaiting_answer"), result
            started[result.run_id] = task

        async with anyio.create_task_group() as tg:
            for task in tasks:
                tg.start_soon(one, task)
    return started


def _effects(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


async def _settle(url: str, effects: Path, task_of: dict[str, str], deadline: float
                  ) -> dict[str, str]:
    """Wait until every run is finished, as an operator: recoveries are decided by looking
    at the world; a call retried after a crash may ask again (its question, its approval)."""
    recovered: dict[str, str] = {}
    expected = len(task_of)
    async with Store.open(url) as store:
        while True:
            for item in await store.pending():
                if item.kind != "recovery":
                    assert item.run_id in recovered, f"asked again without a crash: {item}"
                    await _decide_items(store, [item], task_of)
                    continue
                call = await store.call(item.call_record)
                key = json.loads(call.arguments)["key"]
                seen = _effects(effects)
                landed = seen[f"act {key}"] + sum(
                    n for line, n in seen.items() if line.startswith(f"ask {key} "))
                recovery = (hr.Recovery.completed(f"{key} happened") if landed
                            else hr.Recovery.retry())
                await store.decide(item.id, recovery.to_dict(), "operator")
                recovered[item.run_id] = "completed" if landed else "retry"
            runs = await store.runs(limit=expected + 10)
            failed = [(r.id, r.outcome) for r in runs if r.status is RunStatus.FAILED]
            assert not failed, f"runs failed: {failed[:3]}"
            if len(runs) == expected and all(r.status is RunStatus.COMPLETED for r in runs):
                return recovered
            if time.monotonic() > deadline:
                counts = Counter(r.status.value for r in runs)
                stuck = [(r.id, r.status.value, r.owner, r.lease_until - time.time())
                         for r in runs if r.status is not RunStatus.COMPLETED][:5]
                raise AssertionError(f"runs not finished in time: {counts}; e.g. {stuck}")
            await anyio.sleep(0.2)


@pytest.mark.timeout(1500)
def test_four_workers_resume_every_decided_run_exactly_once_despite_a_sigkill(
        tmp_path: Path, pg_url: str) -> None:
    started_at = time.monotonic()
    effects = tmp_path / "effects"
    rng = random.Random(15)
    kinds = ["approve", "deny", "answer"]
    tasks = [f"{kinds[i % 3]}:k{i}" for i in range(RUNS)]
    runs = anyio.run(_start_runs, pg_url, tasks)
    assert len(runs) == RUNS
    task_of = dict(runs)

    logs = [tmp_path / f"worker{i}.log" for i in range(4)]
    workers = [_start_worker(pg_url, effects, log, "--concurrency", "8",
                             env={"DIE_AFTER_EFFECTS": "3"} if i == 0 else None)
               for i, log in enumerate(logs)]
    try:
        # All four take part from the first decision: a worker slow to start (its imports,
        # on a loaded machine) must not find the work done, nor worker 0 miss its kill.
        for log in logs:
            _wait_for(log, "worker_started")
        async def decide() -> None:
            async with Store.open(pg_url) as store:
                items = await store.pending()
                assert len(items) == RUNS
                rng.shuffle(items)
                # Worker 0 SIGKILLs itself inside its 3rd call, right after the effect landed
                # (DIE_AFTER_EFFECTS), with more runs in hand; the others must take over.
                await _decide_items(store, items, task_of)

        anyio.run(decide)
        # Generous waits: under heavy load (other suites on the 2 cores) this test has taken
        # several times its quiet 25-55 s; a slow machine is not what it checks.
        assert workers[0].wait(timeout=300) == -signal.SIGKILL, logs[0].read_text()[-2000:]
        settle = float(os.environ.get("HANDRAIL_WORKER_TEST_SETTLE", "600"))
        try:
            recovered = anyio.run(_settle, pg_url, effects, task_of,
                                  time.monotonic() + settle)
        except AssertionError as exc:  # say what each worker was doing
            tails = "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for log in logs)
            raise AssertionError(f"{exc}\n{tails}") from exc
    finally:
        if workers[0].poll() is None:  # the test failed before it died: leave nothing behind
            workers[0].kill()
            workers[0].wait()
        for w in workers[1:]:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=300) for w in workers[1:]]
    assert codes == [0, 0, 0], [log.read_text()[-2000:] for log in logs[1:]]

    seen = _effects(effects)
    expected: Counter[str] = Counter()
    for task in tasks:
        kind, _, key = task.partition(":")
        if kind == "approve":
            expected[f"act {key}"] = 1
        elif kind == "answer":
            expected[f"ask {key} yes"] = 1
    assert seen == expected, (
        f"doubled: {[k for k, n in seen.items() if n > 1][:10]}; "
        f"missing: {[k for k in expected if k not in seen][:10]}; "
        f"unexpected: {[k for k in seen if k not in expected][:10]}")
    resumed = [e for log in logs[1:] for e in _log_lines(log) if e["event"] == "run_resumed"]
    assert all({"run_id", "outcome", "duration_ms"} <= e.keys() for e in resumed)
    lines0 = _log_lines(logs[0])
    logged = {e["run_id"] for e in resumed if e["outcome"] == "completed"} | {
        e["run_id"] for e in lines0
        if e["event"] == "run_resumed" and e["outcome"] == "completed"}
    # Every completion is in a log, except where the SIGKILL cut worker 0 off between a
    # run's final commit and its log line (other tasks of that process were scheduled after
    # the killing call's): such a run was claimed by worker 0 and by nobody after it.
    claimed0 = {e["run_id"] for e in lines0 if e["event"] == "run_claimed"}
    claimed_by_others = {e["run_id"] for log in logs[1:] for e in _log_lines(log)
                         if e["event"] == "run_claimed"}
    unlogged = set(runs) - logged
    assert unlogged <= claimed0 - claimed_by_others, sorted(unlogged)[:5]
    for log in logs[1:]:
        assert _log_lines(log)[-1]["event"] == "worker_stopped"
    # The call cut off by the kill came back in doubt and an operator settled it (landed).
    assert "completed" in recovered.values(), recovered
    print(f"{RUNS} runs, 4 workers (one SIGKILLed), {len(recovered)} recoveries, "
          f"{len(unlogged)} completions the kill kept from the log: "
          f"{time.monotonic() - started_at:.1f} s")


async def _decide_items(store: Store, items: list[Any], task_of: dict[str, str]) -> None:
    for item in items:
        if item.kind == "question":
            decision: dict[str, Any] = {"answer": "yes"}
        elif task_of[item.run_id].startswith("deny:"):
            decision = hr.Decision.deny("not today").to_dict()
        else:
            decision = hr.Decision.approve().to_dict()
        await store.decide(item.id, decision, "tester")


def test_cli_decides_without_resume_and_a_worker_finishes_then_exits_on_sigterm(
        tmp_path: Path, pg_url: str) -> None:
    effects = tmp_path / "effects"
    runs = anyio.run(_start_runs, pg_url, ["approve:a", "answer:b", "deny:c"])
    env = _env(effects)
    pending = subprocess.run([*HANDRAIL, "pending", "--json"], cwd=HERE, capture_output=True,
                             text=True, env={**env, "HANDRAIL_STORE": pg_url}, timeout=60)
    items = {i["run_id"]: i for i in json.loads(pending.stdout)}
    assert set(items) == set(runs)
    by_task = {task: items[run_id]["id"] for run_id, task in runs.items()}
    for args in (["approve", by_task["approve:a"]], ["answer", by_task["answer:b"], "yes"],
                 ["deny", by_task["deny:c"], "--reason", "no"]):
        done = subprocess.run([*HANDRAIL, *args, "--no-resume", "--store", pg_url], cwd=HERE,
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
    assert _effects(effects) == Counter()  # recorded only: the workers perform

    log = tmp_path / "worker.log"
    worker = _start_worker(pg_url, effects, log, "--agents", "worker_agents:AGENT")
    try:
        anyio.run(_settle, pg_url, effects, runs, time.monotonic() + 60)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0, log.read_text()
    assert _effects(effects) == Counter({"act a": 1, "ask b yes": 1})
    lines = _log_lines(log)
    resumed = {e["run_id"]: e for e in lines if e["event"] == "run_resumed"}
    assert set(resumed) == set(runs)
    assert {e["outcome"] for e in resumed.values()} == {"completed"}
    assert lines[-1]["event"] == "worker_stopped"
    # What it did to take them: each claim that took nothing was a wasted round trip.
    stopped = lines[-1]
    assert stopped["resumed"] == 3 and stopped["claims"] >= 1
    assert 0 <= stopped["empty_claims"] < stopped["claims"] and stopped["notifications"] >= 0
    listed = subprocess.run([*HANDRAIL, "runs", "--json"], cwd=HERE, capture_output=True,
                            text=True, env={**env, "HANDRAIL_STORE": pg_url}, timeout=60)
    assert sorted(r["status"] for r in json.loads(listed.stdout)) == ["completed"] * 3


def test_a_worker_refuses_a_store_other_processes_cannot_share(tmp_path: Path) -> None:
    out = subprocess.run([*HANDRAIL, "worker", "--store", str(tmp_path / "runs.db")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "postgresql://" in out.stderr


def _wait_for(path: Path, text: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.02)


def test_sigterm_lets_a_run_in_progress_finish_within_the_grace_period(
        tmp_path: Path, pg_url: str) -> None:
    effects, go = tmp_path / "effects", tmp_path / "go"
    runs = anyio.run(_start_runs, pg_url, ["slow:s1"])
    log = tmp_path / "worker.log"
    worker = _start_worker(pg_url, effects, log, env={"GO": str(go)})
    try:
        _wait_for(log, "worker_started")
        anyio.run(_decide_all_pending, pg_url, runs)
        _wait_for(effects, "slow-start s1")  # the call is in progress
        worker.send_signal(signal.SIGTERM)
        _wait_for(log, "worker_stopping")
        go.touch()  # the call may now finish: within the grace period
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert _effects(effects) == Counter({"slow-start s1": 1, "slow s1": 1})
    (done,) = [e for e in _log_lines(log) if e["event"] == "run_resumed"]
    assert done["outcome"] == "completed"


def test_a_run_still_going_when_the_grace_ends_is_left_for_another_worker_in_doubt(
        tmp_path: Path, pg_url: str) -> None:
    effects, go = tmp_path / "effects", tmp_path / "go"
    runs = anyio.run(_start_runs, pg_url, ["slow:s1"])
    first = _start_worker(pg_url, effects, tmp_path / "w1.log", "--grace", "0.5",
                          env={"GO": str(go)})
    try:
        _wait_for(tmp_path / "w1.log", "worker_started")
        anyio.run(_decide_all_pending, pg_url, runs)
        _wait_for(effects, "slow-start s1")
    finally:
        first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0
    stopped = _log_lines(tmp_path / "w1.log")[-1]
    assert stopped["event"] == "worker_stopped" and stopped["abandoned"] == list(runs)
    # Another worker takes the run over; the call cut off comes back in doubt, never re-run.
    second = _start_worker(pg_url, effects, tmp_path / "w2.log", env={"GO": str(go)})
    try:
        _wait_for(tmp_path / "w2.log", "awaiting_recovery")
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    assert _effects(effects) == Counter({"slow-start s1": 1})


async def _decide_all_pending(url: str, runs: dict[str, str]) -> None:
    async with Store.open(url) as store:
        await _decide_items(store, await store.pending(), runs)


def test_a_run_the_worker_cannot_rebuild_is_logged_released_and_left_ready(
        tmp_path: Path, pg_url: str) -> None:
    effects = tmp_path / "effects"
    runs = anyio.run(_start_runs, pg_url, ["approve:a"])
    anyio.run(_decide_all_pending, pg_url, runs)
    env = _env(effects)
    env.pop("PYTHONPATH")  # the run's ref, worker_agents:AGENT, cannot be imported here
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([*HANDRAIL, "worker", "--store", pg_url, "--poll", "1"],
                                  cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, "run_resumed")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    (line,) = [e for e in _log_lines(log) if e["event"] == "run_resumed"]
    assert line["outcome"] == "error" and "worker_agents" in line["error"]

    async def check() -> None:
        async with Store.open(pg_url) as store:
            (run,) = await store.runs()
            # Decided, not continued: READY, released, and still counted as ready.
            assert (run.status, run.owner) == (RunStatus.READY, None)
            assert await store.ready_count() == 1  # type: ignore[attr-defined]

    anyio.run(check)
    assert not effects.exists()


def _other_machine() -> list[str] | None:
    """A command prefix running a process under another host name (a UTS namespace), or None."""
    prefix = ["unshare", "--uts", "sh", "-c", 'hostname machine-a && exec "$0" "$@"']
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run([*prefix, "hostname"], capture_output=True, text=True, timeout=30)
    return prefix if probe.stdout.strip() == "machine-a" else None


def test_a_stalled_worker_on_another_machine_loses_its_run_and_changes_nothing(
        tmp_path: Path, pg_url: str) -> None:
    """Worker A (another host name) stalls mid-call past its lease; B takes the run over and
    finds the call in doubt. When A wakes, its tool finishes (it had started: one effect) but
    A writes nothing more: the run stays as B left it, the call for an operator to settle."""
    other = _other_machine()
    if other is None:
        pytest.skip("needs `unshare --uts` (root) to run a worker under another host name")
    effects, go = tmp_path / "effects", tmp_path / "go"
    runs = anyio.run(_start_runs, pg_url, ["slow:s1"])
    (run_id,) = runs
    anyio.run(_decide_all_pending, pg_url, runs)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    with open(log_a, "wb") as out:
        a = subprocess.Popen(
            [*other, *HANDRAIL, "worker", "--store", pg_url, "--poll", "1", "--lease", "1"],
            cwd=HERE, env={**_env(effects), "GO": str(go)}, stdout=out,
            stderr=subprocess.STDOUT)
    b: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(effects, "slow-start s1")  # A is inside the call
        a.send_signal(signal.SIGSTOP)  # stalled: no heartbeat, the lease lapses

        async def lapsed() -> None:
            async with Store.open(pg_url) as store:
                with anyio.fail_after(60):
                    # The database's clock decides (no event crosses machines): polled.
                    while await store.ready_count() == 0:  # type: ignore[attr-defined]  # noqa: ASYNC110
                        await anyio.sleep(0.05)

        anyio.run(lapsed)
        b = _start_worker(pg_url, effects, log_b, env={"GO": str(go)})
        _wait_for(log_b, "awaiting_recovery")  # B took it over: the call is in doubt
        go.touch()
        a.send_signal(signal.SIGCONT)
        _wait_for(log_a, "run_resumed")
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
    assert _effects(effects) == Counter({"slow-start s1": 1, "slow s1": 1})
    (line,) = [e for e in _log_lines(log_a) if e["event"] == "run_resumed"]
    assert line["outcome"] == "refused" and "taken over" in line["error"], line

    async def check() -> None:
        async with Store.open(pg_url) as store:
            run = await store.run(run_id)
            assert run.status is RunStatus.AWAITING_RECOVERY, run
            (call,) = await store.calls(run_id)
            assert call.status.value == "in_doubt"
            (item,) = await store.pending()
            assert item.kind == "recovery"

    anyio.run(check)


def test_a_store_error_is_retried_after_a_poll_and_a_refusal_is_not(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume that met the database failing (overloaded, a dropped connection) is given
    back and taken again after a poll; a run this worker cannot resume is left to others."""
    import handrail.runs
    from handrail.cli._worker import Worker, _Agents
    from handrail.errors import StoreError, UserError

    monkeypatch.setenv("EFFECTS", str(tmp_path / "effects"))
    runs = anyio.run(_start_runs, pg_url, ["approve:a", "approve:b"])
    by_task = {task: run_id for run_id, task in runs.items()}
    anyio.run(_decide_all_pending, pg_url, runs)
    real = handrail.runs.resume
    failures = {by_task["approve:a"]: [StoreError("the database is overloaded")],
                by_task["approve:b"]: [UserError("no agent here"), UserError("again")]}
    attempts: Counter[str] = Counter()

    async def flaky(store: Any, run_id: str, **kw: Any) -> Any:
        attempts[run_id] += 1
        if failures[run_id]:
            raise failures[run_id].pop(0)
        return await real(store, run_id, **kw)

    monkeypatch.setattr(handrail.runs, "resume", flaky)

    async def main() -> None:
        async with Store.open(pg_url) as store:
            worker = Worker(store, _Agents(["worker_agents:AGENT"]), concurrency=2, poll=0.2,
                            grace=5)
            refused = by_task["approve:b"]
            # Claims sent once `a` is done and `b` refused: `b` is still READY in the store,
            # so each is a chance to take it again. Counted, not timed: three of them.
            after: list[tuple[frozenset[str], list[str]]] = []
            enough = anyio.Event()
            real_claim = store.claim_ready

            async def claim(owner: str, limit: int, exclude: frozenset[str] = frozenset(),
                            **kw: Any) -> Any:
                settled = worker.resumed >= 1 and refused in worker.refused
                taken = await real_claim(owner, limit, exclude, **kw)
                if settled:
                    after.append((exclude, [r.id for r in taken]))
                    if len(after) >= 3:
                        enough.set()
                return taken

            store.claim_ready = claim

            async def until_done() -> None:
                with anyio.fail_after(60):
                    await enough.wait()
                worker.stopping.set()
                worker.wake.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(until_done)
                await worker.serve()
            assert (await store.run(refused)).status is RunStatus.READY
            assert all(refused in exclude and refused not in taken
                       for exclude, taken in after), after

    anyio.run(main)
    assert attempts == Counter({by_task["approve:a"]: 2, by_task["approve:b"]: 1})
    assert _effects(tmp_path / "effects") == Counter({"act a": 1})


def test_a_worker_resumes_no_more_runs_at_once_than_its_concurrency(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--concurrency 2` with five runs decided: two resumes at a time, and no claim asks
    for more runs than the slots free when it is sent."""
    import handrail.runs
    from handrail.cli._worker import Worker, _Agents

    monkeypatch.setenv("EFFECTS", str(tmp_path / "effects"))
    runs = anyio.run(_start_runs, pg_url, [f"approve:k{i}" for i in range(5)])
    anyio.run(_decide_all_pending, pg_url, runs)
    real = handrail.runs.resume
    in_flight: list[str] = []
    most = 0

    async def main() -> None:
        go, two, done = anyio.Event(), anyio.Event(), anyio.Event()
        finished: list[str] = []

        async def held(store: Any, run_id: str, **kw: Any) -> Any:
            nonlocal most
            in_flight.append(run_id)
            most = max(most, len(in_flight))
            if len(in_flight) == 2:
                two.set()
            try:
                await go.wait()  # the first two stay in progress until both are
                result = await real(store, run_id, **kw)
                finished.append(run_id)
                if len(finished) == 5:
                    done.set()
                return result
            finally:
                in_flight.remove(run_id)

        monkeypatch.setattr(handrail.runs, "resume", held)
        async with Store.open(pg_url) as store:
            worker = Worker(store, _Agents(["worker_agents:AGENT"]), concurrency=2, poll=0.2,
                            grace=5)
            claims: list[tuple[int, int]] = []  # (runs asked for, runs being resumed then)
            real_claim = store.claim_ready

            async def claim(owner: str, limit: int, exclude: frozenset[str] = frozenset(),
                            **kw: Any) -> Any:
                claims.append((limit, len(worker.active)))
                return await real_claim(owner, limit, exclude, **kw)

            store.claim_ready = claim

            async def drive() -> None:
                with anyio.fail_after(120):
                    await two.wait()
                    go.set()
                    await done.wait()
                worker.stopping.set()
                worker.wake.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                await worker.serve()
            assert claims and all(limit + active <= 2 for limit, active in claims), claims

    anyio.run(main)
    assert most == 2
    assert _effects(tmp_path / "effects") == Counter({f"act k{i}": 1 for i in range(5)})


def test_a_worker_needs_a_concurrency_of_at_least_one() -> None:
    out = subprocess.run([*HANDRAIL, "worker", "--store", "postgresql://nobody@/x",
                          "--concurrency", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--concurrency is at least 1" in out.stderr, out.stderr
