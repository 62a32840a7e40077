"""PostgreSQL specifics: migrations and schema version, the database's clock for leases,
ready runs taken with SKIP LOCKED, NOTIFY on decisions, and the psycopg error map."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import psycopg_pool
import pytest
from loop_ticks import resumed_per_iteration

from handrail.errors import AlreadyDecided, ResumeRefused, SchemaTooNew, StoreError
from handrail.store import (
    Batch,
    CallRecord,
    CallStatus,
    PendingItem,
    RunRecord,
    RunStatus,
    Store,
    _postgres,
)
from handrail.store._postgres import SCHEMA_VERSION, PostgresStore, map_psycopg_error

pytestmark = pytest.mark.anyio


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                            "ORDER BY tablename").fetchall()
    return [r[0] for r in rows]


async def test_an_empty_database_is_migrated_and_reopening_writes_nothing(pg_url: str) -> None:
    async with Store.open(pg_url) as store:
        assert isinstance(store, PostgresStore)
        assert await store.schema_version() == SCHEMA_VERSION
    assert _tables(pg_url) == ["audit", "audit_signatures", "audit_tip", "calls",
                              "handrail_migrations", "messages", "pending", "quota_counts",
                              "run_events", "runs"]
    with psycopg.connect(pg_url) as conn:
        before = conn.execute("SELECT xmin::text, * FROM handrail_migrations").fetchall()
    async with Store.open(pg_url) as store:
        await store.runs()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT xmin::text, * FROM handrail_migrations").fetchall() == before


async def test_a_newer_schema_is_refused_and_never_written_to(pg_url: str) -> None:
    async with Store.open(pg_url) as store:
        await store.runs()
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO handrail_migrations VALUES (99, '0099_future', 0)")
    store = Store.open(pg_url)
    with pytest.raises(SchemaTooNew, match=r"0099_future.*upgrade handrail"):
        await store.write(Batch(run=RunRecord(id="r1", task="t", created_at=time.time())))
    await store.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM handrail_migrations").fetchone() == (
            SCHEMA_VERSION + 1,)


async def test_a_writer_whose_clock_runs_ahead_holds_a_run_only_for_its_lease(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class Ahead:
        """A machine whose clock is an hour ahead of the database's."""

        @staticmethod
        def time() -> float:
            return time.time() + 3600

    async with Store.open(pg_url) as store:
        monkeypatch.setattr(_postgres, "time", Ahead)
        # What a runner on that machine writes: its own now + a 30 s lease.
        await store.write(Batch(run=RunRecord(
            id="r1", task="t", created_at=0, owner="elsewhere:1:x",
            lease_until=Ahead.time() + 30)))
        await store.write(Batch(run=RunRecord(
            id="r2", task="t", created_at=0, owner="elsewhere:1:x",
            lease_until=Ahead.time() - 1)))
        monkeypatch.undo()
        run = await store.run("r1")
        # Stored on the database's clock: 30 s from now, not an hour and 30 s.
        assert time.time() + 20 < run.lease_until < time.time() + 40
        # Its lapsed lease is lapsed for everyone.
        assert (await store.claim("r2", "me")).owner == "me"


def _paused(run_id: str, **kw: Any) -> RunRecord:
    return RunRecord(id=run_id, task="t", created_at=time.time(),
                     status=RunStatus.AWAITING_APPROVAL,
                     outcome={"kind": "awaiting_approval", "request_id": f"{run_id}-p"}, **kw)


def _item(item_id: str, run_id: str, state: str = "decided") -> PendingItem:
    return PendingItem(id=item_id, kind="approval", run_id=run_id, call_record=f"{run_id}:c",
                       created_at=time.time(), state=state,
                       decision={"kind": "approve"} if state == "decided" else None)


async def test_only_runs_ready_to_continue_are_taken(pg_url: str) -> None:
    async with Store.open(pg_url) as store:
        assert isinstance(store, PostgresStore)
        await store.write(Batch(run=_paused("decided"), pending=[_item("p1", "decided")]))
        await store.write(Batch(run=_paused("open"), pending=[_item("p2", "open", "open")]))
        await store.write(Batch(run=_paused("half"), pending=[
            _item("p3", "half"), _item("p4", "half", "open")]))
        await store.write(Batch(run=RunRecord(id="done", task="t", created_at=0,
                                              status=RunStatus.COMPLETED,
                                              outcome={"kind": "completed", "output": "x"})))
        await store.write(Batch(run=RunRecord(id="ready", task="t", created_at=0,
                                              status=RunStatus.READY)))
        await store.write(Batch(run=RunRecord(id="live", task="t", created_at=0,
                                              owner="elsewhere:1:x",
                                              lease_until=time.time() + 60)))
        await store.write(Batch(run=RunRecord(id="lapsed", task="t", created_at=0,
                                              owner="elsewhere:1:x",
                                              lease_until=time.time() - 1)))
        assert await store.ready_count() == 3
        taken = await store.claim_ready("w1", limit=10)
        assert sorted(r.id for r in taken) == ["decided", "lapsed", "ready"]
        assert all(r.owner == "w1" for r in taken)
        # Held: nobody else takes them while the lease lives; released, they are ready again.
        assert await store.claim_ready("w2", limit=10) == []
        assert await store.release("decided", "w1")
        assert not await store.release("decided", "w1")
        assert [r.id for r in await store.claim_ready("w2", limit=10)] == ["decided"]
        # Deciding the last open item makes a run ready.
        await store.decide("p4", {"kind": "approve"}, "me")
        assert [r.id for r in await store.claim_ready("w3", limit=10)] == ["half"]


async def test_concurrent_workers_take_disjoint_runs(pg_url: str) -> None:
    async with Store.open(pg_url) as setup:
        for i in range(40):
            await setup.write(Batch(run=_paused(f"r{i}"), pending=[_item(f"p{i}", f"r{i}")]))
    stores = [Store.open(pg_url) for _ in range(4)]
    taken: dict[str, list[str]] = {f"w{i}": [] for i in range(4)}

    async def work(store: Any, owner: str) -> None:
        while runs := await store.claim_ready(owner, limit=3):
            taken[owner].extend(r.id for r in runs)

    async with anyio.create_task_group() as tg:
        for i, store in enumerate(stores):
            tg.start_soon(work, store, f"w{i}")
    for store in stores:
        await store.close()
    every = [run_id for ids in taken.values() for run_id in ids]
    assert sorted(every) == sorted(f"r{i}" for i in range(40))  # each once, none lost


async def test_a_decision_is_announced_to_listeners(pg_url: str) -> None:
    async with Store.open(pg_url) as store:
        assert isinstance(store, PostgresStore)
        await store.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1", "open")]))
        conn = await store.listen()
        try:
            await store.decide("p1", {"kind": "approve"}, "me")
            with anyio.fail_after(10):
                async for note in conn.notifies():
                    assert (note.channel, note.payload) == ("handrail_ready", "")
                    break
        finally:
            await conn.close()


async def _notifications_until_sentinel(conn: Any, url: str) -> int:
    """How many notifications `conn` received before a sentinel sent now (commit order)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
        await other.execute("NOTIFY handrail_ready, 'sentinel'")
    received = 0
    with anyio.fail_after(30):
        async for note in conn.notifies():
            if note.payload == "sentinel":
                return received
            received += 1
    raise AssertionError("unreachable")


async def test_the_decisions_of_one_group_commit_wake_a_worker_once(pg_url: str) -> None:
    """Fifty decisions arriving together wake each listening worker once, not fifty times.

    Each notification is a wake-up of every listening worker and of its server backend, and
    a claim from every idle worker: with a notification per decision, four workers cost a
    fifth more CPU per resume than one (issue 15). PostgreSQL delivers identical notifications
    of one transaction once; decisions queued together commit in one transaction.
    """
    async with Store.open(pg_url) as store:
        assert isinstance(store, PostgresStore)
        await store.write(Batch(run=_paused("r0")))
        for i in range(50):
            await store.write(Batch(run=_paused(f"r{i}"), pending=[_item(f"p{i}", f"r{i}",
                                                                        "open")]))
        conn = await store.listen()
        try:
            async with anyio.create_task_group() as tg:  # queued together: one group
                for i in range(50):
                    tg.start_soon(store.decide, f"p{i}", {"kind": "approve"}, "me")
            received = await _notifications_until_sentinel(conn, pg_url)
        finally:
            await conn.close()
        assert 1 <= received <= 2, received
        assert len(await store.claim_ready("w", limit=100)) == 50  # every one is ready


async def _transactions(url: str, table: str) -> int:
    """How many transactions wrote the rows of `table` (rows of one share its xmin)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(
            f"SELECT count(DISTINCT xmin::text) FROM {table}")).fetchone()
    assert row is not None
    return int(row[0])


async def test_concurrent_writes_of_many_runs_commit_in_one_transaction(pg_url: str) -> None:
    """Group commit (issue 24): writes that arrive together share a transaction."""
    async with Store.open(pg_url) as store:
        await store.runs()  # opened: the schema is there before the writes queue

        async def one(i: int) -> None:
            await store.write(Batch(run=RunRecord(id=f"r{i}", task="t", created_at=i),
                                    messages=[(f"r{i}", 0, {"role": "user", "n": i})]))

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
        assert len(await store.runs(limit=100)) == 50
        assert await _transactions(pg_url, "runs") <= 2
        assert await _transactions(pg_url, "messages") <= 2


async def test_a_group_resumes_its_writers_a_few_per_loop_iteration(pg_url: str) -> None:
    """Issue 24: the runs sharing a commit do not all take their next turn in one iteration.

    Released at once, 100 runs' group made one loop iteration ~46 ms of CPU (a timer on the
    loop waited that long); the store resumes at most `RELEASE_PER_ITERATION` per iteration,
    the rest in the next ones, as the SQLite store does.
    """
    from handrail.store._postgres import RELEASE_PER_ITERATION

    async with Store.open(pg_url) as store:
        await store.runs()  # opened: the schema is there before the writes queue

        async def write(i: int, mark: Callable[[], None]) -> None:
            await store.write(Batch(run=RunRecord(id=f"r{i}", task="t", created_at=i)))
            mark()

        per_iteration = await resumed_per_iteration(
            [functools.partial(write, i) for i in range(40)])
        assert len(await store.runs(limit=100)) == 40
    assert sum(per_iteration) == 40
    assert max(per_iteration) <= RELEASE_PER_ITERATION, per_iteration


async def test_compare_and_swap_holds_inside_a_group(pg_url: str) -> None:
    """Ten deciders of one item in a group with other writes and decisions: one wins, the
    other nine get AlreadyDecided, and everything else in the group commits with it."""
    async with Store.open(pg_url) as store:
        for name in ("a", "b"):
            await store.write(Batch(run=_paused(name), pending=[_item(f"p{name}", name,
                                                                     "open")]))
        outcomes: dict[str, Any] = {}

        async def decide(who: str, item: str) -> None:
            try:
                outcomes[who] = await store.decide(item, {"kind": "approve"}, who)
            except AlreadyDecided as exc:
                outcomes[who] = exc

        async def write(i: int) -> None:
            await store.write(Batch(run=RunRecord(id=f"w{i}", task="t", created_at=i)))

        async with anyio.create_task_group() as tg:  # queued together: one group
            for i in range(10):
                tg.start_soon(decide, f"d{i}", "pa")
                tg.start_soon(write, i)
            tg.start_soon(decide, "other", "pb")
        won = [who for who, got in outcomes.items() if who != "other" and
               isinstance(got, PendingItem)]
        assert len(won) == 1 and len(outcomes) == 11, outcomes
        assert all(isinstance(outcomes[f"d{i}"], AlreadyDecided)
                   for i in range(10) if f"d{i}" not in won)
        assert (await store.pending_item("pa")).decided_by == won[0]
        assert (await store.pending_item("pb")).decided_by == "other"
        assert {r.id for r in await store.runs(limit=100)} >= {f"w{i}" for i in range(10)}
        # The writes queued with the deciders committed together (a decision's rows carry
        # its savepoint's own transaction id, so only the plain writes are counted).
        assert await _transactions(pg_url, "runs WHERE id LIKE 'w%'") <= 2


async def test_an_unreachable_server_is_a_clear_store_error(tmp_path: Path) -> None:
    store = Store.open(f"postgresql://nobody@/db?host={tmp_path}&port=1&connect_timeout=2")
    with pytest.raises(StoreError, match="cannot reach the PostgreSQL store"):
        await store.runs()
    await store.close()


def test_the_psycopg_error_map_is_complete() -> None:
    # Every psycopg error class, and the pool's timeout, becomes a StoreError.
    def subclasses(cls: type) -> set[type]:
        found = {cls}
        for sub in cls.__subclasses__():
            found |= subclasses(sub)
        return found

    for cls in subclasses(psycopg.Error):
        try:
            exc = cls("boom")
        except TypeError:
            continue
        assert isinstance(map_psycopg_error("u", exc), StoreError), cls
    assert isinstance(map_psycopg_error("u", psycopg_pool.PoolTimeout("t")), StoreError)
    other = ValueError("not a driver error")
    assert map_psycopg_error("u", other) is other


def test_a_store_serves_the_event_loop_it_was_first_used_on(pg_url: str) -> None:
    store = Store.open(pg_url)

    async def use() -> None:
        await store.runs()

    anyio.run(use)
    with pytest.raises(StoreError, match="one store per event loop"):
        anyio.run(use)


async def test_a_password_never_appears_in_messages() -> None:
    store = Store.open("postgresql://u:s3cret@127.0.0.1:1/db?connect_timeout=2")
    with pytest.raises(StoreError) as info:
        await store.runs()
    assert "s3cret" not in str(info.value)
    await store.close()


def test_the_example_of_docs_postgres_runs(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    docs = Path(__file__).resolve().parents[2] / "docs" / "postgres.md"
    blocks = re.findall(r"```python\n(.*?)```", docs.read_text(), flags=re.S)
    assert blocks
    monkeypatch.setenv("HANDRAIL_STORE", pg_url)
    for block in blocks:
        exec(compile(block, str(docs), "exec"), {"__name__": "docs_postgres"})


async def test_a_failing_write_fails_alone_and_is_reported_once(pg_url: str) -> None:
    async with Store.open(pg_url) as store:
        good = Batch(run=RunRecord(id="r1", task="t", created_at=0))
        bad = Batch(messages=[("no-such-run", 0, {"k": 1})])  # a foreign key refuses it
        outcomes: dict[str, BaseException | None] = {}

        async def write(name: str, batch: Batch) -> None:
            try:
                await store.write(batch)
                outcomes[name] = None
            except StoreError as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:  # one group: both queued together
            tg.start_soon(write, "bad", bad)
            tg.start_soon(write, "good", good)
        assert outcomes["good"] is None and isinstance(outcomes["bad"], StoreError)
        assert (await store.run("r1")).id == "r1"  # the waiter was told; nobody else is
        await store.write(bad, wait=False)
        with pytest.raises(StoreError, match="earlier write"):
            await store.runs()
        assert [r.id for r in await store.runs()] == ["r1"]


# ---------------------------------------------------------------- the owner fence
#
# Another machine takes a RUNNING run over once its lease lapses (a stalled process, a
# heartbeat starved under load). The stalled driver is still alive: when it wakes it must
# change nothing, above all not mark a call STARTED and run its tool after the new driver
# found that call not started and ran it (the action performed twice). Two stores on one
# database are the two machines; owners name other hosts, so only leases decide.


def _started(run_id: str) -> CallRecord:
    return CallRecord(id=f"{run_id}:c1", run_id=run_id, call_id="c1", turn=0, index=0,
                      model_name="world/act", tool="world/act", arguments="{}",
                      status=CallStatus.STARTED, started_at=time.time())


async def test_a_driver_whose_run_was_taken_over_writes_nothing_more(pg_url: str) -> None:
    async with Store.open(pg_url) as a, Store.open(pg_url) as b:
        await a.write(Batch(run=RunRecord(id="r1", task="t", created_at=0,
                                          status=RunStatus.READY)))
        await a.write(Batch(run=RunRecord(id="other", task="t", created_at=0,
                                          status=RunStatus.READY)))
        a.lease_seconds = 0  # A's lease lapses at once: as if A stalled past it
        held = await a.claim("r1", "machine-a:1:x")
        assert held.owner == "machine-a:1:x"
        taken = await b.claim("r1", "machine-b:2:y")  # B: lapsed, so the run is B's now
        assert taken.owner == "machine-b:2:y"

        with pytest.raises(ResumeRefused, match="taken over"):
            await a.write(Batch(calls=[_started("r1")]))  # the STARTED mark before the tool
        finished = dataclasses.replace(held, status=RunStatus.COMPLETED, owner=None,
                                       outcome={"kind": "completed", "output": "x"})
        with pytest.raises(ResumeRefused, match="held by machine-b:2:y"):
            await a.write(Batch(run=finished, messages=[("r1", 0, {"kind": "user"})]))
        # A heartbeat nobody waits for is dropped alone: A's other operations go on.
        await a.write(Batch(run=held), wait=False)
        await a.flush()
        await a.claim("other", "machine-a:1:z")

        assert await b.calls("r1") == [] and await b.messages("r1") == []
        run = await b.run("r1")
        assert (run.status, run.owner) == (RunStatus.RUNNING, "machine-b:2:y")
        await b.write(Batch(calls=[_started("r1")]))  # the new driver writes as usual
        assert [c.status for c in await b.calls("r1")] == [CallStatus.STARTED]


async def test_a_worker_whose_hold_lapsed_cannot_claim_the_run_another_took(
        pg_url: str) -> None:
    async with Store.open(pg_url) as a, Store.open(pg_url) as b:
        assert isinstance(a, PostgresStore) and isinstance(b, PostgresStore)
        await a.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1")]))
        a.lease_seconds = 0
        assert [r.id for r in await a.claim_ready("worker-a")] == ["r1"]
        assert [r.id for r in await b.claim_ready("worker-b")] == ["r1"]  # A's hold lapsed
        # B holds it now (and may have driven it on to a pause): a paused run is
        # claimable, but not by A any more.
        with pytest.raises(ResumeRefused, match="hold lapsed"):
            await a.claim("r1", "machine-a:1:x")
        assert (await b.claim("r1", "machine-b:2:y")).owner == "machine-b:2:y"


# ---------------------------------------------------------------- a resume's round trips


async def test_a_write_is_all_or_nothing_without_an_explicit_transaction(pg_url: str) -> None:
    """Write-only groups commit as the pipeline's implicit transaction: a failing statement
    (here the batch's last) takes every statement of its write with it."""
    async with Store.open(pg_url) as store:
        await store.write(Batch(run=RunRecord(id="r1", task="t", created_at=0)))
        half = Batch(run=RunRecord(id="r1", task="t", created_at=0, steps=7),
                     messages=[("r1", 0, {"kind": "user"}), ("no-such-run", 0, {"k": 1})])
        with pytest.raises(StoreError):
            await store.write(half)
        assert (await store.run("r1")).steps == 0
        assert await store.messages("r1") == []


async def test_what_a_claim_read_ahead_is_never_served_past_a_write(pg_url: str) -> None:
    """A worker's claim reads the run's messages, calls and settled items in its
    transaction; a resume reads them from there, until this store writes the run again."""
    async with Store.open(pg_url) as store, Store.open(pg_url) as other:
        assert isinstance(store, PostgresStore)
        await store.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1")],
                                messages=[("r1", 0, {"kind": "user", "text": "hi"})]))
        assert [r.id for r in await store.claim_ready("worker")] == ["r1"]
        assert (await store.run("r1")).status is RunStatus.AWAITING_APPROVAL  # as held
        claimed = await store.claim("r1", "vm-test:1:x")
        assert (claimed.status, claimed.owner) == (RunStatus.RUNNING, "vm-test:1:x")
        assert await store.messages("r1") == [{"kind": "user", "text": "hi"}]
        assert (await store.pending_item("p1")).state == "decided"
        # Another process cannot change them (the fence), but this store's writes do.
        await store.write(Batch(messages=[("r1", 1, {"kind": "assistant"})],
                                calls=[_started("r1")],
                                pending=[dataclasses.replace(_item("p1", "r1"),
                                                             state="spent")]))
        assert [m["kind"] for m in await store.messages("r1")] == ["user", "assistant"]
        assert [c.status for c in await store.calls("r1")] == [CallStatus.STARTED]
        assert (await store.pending_item("p1")).state == "spent"
        assert await other.messages("r1") == await store.messages("r1")


async def test_a_claim_never_reads_what_an_earlier_claim_read_ahead(pg_url: str) -> None:
    """A run read ahead at one claim, then driven elsewhere (this store never wrote it:
    its resume failed early), is read afresh at its next claim, whichever way it comes."""
    async with Store.open(pg_url) as store, Store.open(pg_url) as other:
        assert isinstance(store, PostgresStore)
        await store.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1")]))
        await store.claim_ready("worker")
        store.lease_seconds = 0  # then this machine stalls: its lease lapses
        await store.claim("r1", "machine-a:1:x")
        assert await store.messages("r1") == []
        await other.claim("r1", "machine-b:2:y")  # taken over, driven on, released
        await other.write(Batch(run=_paused("r1"), messages=[("r1", 0, {"kind": "user"})]))
        await store.claim("r1", "machine-a:1:z")  # not held: claimed the slow way
        assert await store.messages("r1") == [{"kind": "user"}]


async def test_a_worker_claims_a_run_it_read_ahead_with_the_runs_first_write(
        pg_url: str) -> None:
    """Held with `orphans=False`, a run's reads come with the hold; claiming it sends
    nothing: the claim goes out at the head of the run's next write (a round trip less
    per resume), and any read of the database sends it first."""
    async with Store.open(pg_url) as store, Store.open(pg_url) as other:
        assert isinstance(store, PostgresStore)
        await store.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1")],
                                messages=[("r1", 0, {"kind": "user", "text": "hi"})]))
        await store.write(Batch(run=_paused("r2"), pending=[_item("p2", "r2")]))
        held = await store.claim_ready("worker", limit=2, orphans=False)
        assert sorted(r.id for r in held) == ["r1", "r2"]
        claimed = await store.claim("r1", "vm-test:1:x")
        assert (claimed.status, claimed.owner) == (RunStatus.RUNNING, "vm-test:1:x")
        assert claimed.lease_until > time.time()
        assert await store.messages("r1") == [{"kind": "user", "text": "hi"}]
        assert (await store.pending_item("p1")).state == "decided"
        assert (await other.run("r1")).owner == "worker"  # not sent yet: still held
        await store.write(Batch(calls=[_started("r1")]))
        seen = await other.run("r1")
        assert (seen.status, seen.owner) == (RunStatus.RUNNING, "vm-test:1:x")
        assert seen.lease_until > time.time()
        # A read sends a waiting claim before it reads.
        await store.claim("r2", "vm-test:1:y")
        assert (await store.run("r2")).owner == "vm-test:1:y"
        assert (await other.run("r2")).status is RunStatus.RUNNING


async def test_a_claim_sent_with_the_write_changes_nothing_if_the_hold_lapsed(
        pg_url: str) -> None:
    """The claim a worker sends with its first write is conditional: if its hold lapsed
    and another worker took the run, that write fails whole (`ResumeRefused`): no STARTED
    mark, so no action performed on a claim that did not hold."""
    async with Store.open(pg_url) as a, Store.open(pg_url) as b:
        assert isinstance(a, PostgresStore)
        await a.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1")]))
        a.lease_seconds = 0
        assert [r.id for r in await a.claim_ready("worker-a", orphans=False)] == ["r1"]
        assert [r.id for r in await b.claim_ready("worker-b")] == ["r1"]  # A's hold lapsed
        claimed = await a.claim("r1", "machine-a:1:x")
        with pytest.raises(ResumeRefused, match="held by worker-b"):
            await a.write(Batch(run=claimed, calls=[_started("r1")]))
        run = await b.run("r1")
        assert (run.status, run.owner) == (RunStatus.AWAITING_APPROVAL, "worker-b")
        assert await b.calls("r1") == []
        with pytest.raises(ResumeRefused):  # and it stays refused
            await a.write(Batch(calls=[_started("r1")]))
        assert (await b.claim("r1", "machine-b:2:y")).owner == "machine-b:2:y"


async def test_a_held_run_released_before_its_claim_was_sent_is_left_unclaimed(
        pg_url: str) -> None:
    async with Store.open(pg_url) as store, Store.open(pg_url) as other:
        await store.write(Batch(run=_paused("r1"), pending=[_item("p1", "r1")]))
        assert [r.id for r in await store.claim_ready("worker", orphans=False)] == ["r1"]
        await store.claim("r1", "vm-test:1:x")
        assert await store.release("r1", "worker")  # e.g. its agent could not be built
        # Held again by the same worker: the claim given up is never sent.
        assert [r.id for r in await store.claim_ready("worker", orphans=False)] == ["r1"]
        await store.runs()
        run = await other.run("r1")
        assert (run.status, run.owner) == (RunStatus.AWAITING_APPROVAL, "worker")


def _rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows the plan node and its children read from `relation` (EXPLAIN ANALYZE, JSON):
    those they returned and those their filter removed."""
    read = int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
    own = (read * int(plan.get("Actual Loops", 1))
           if plan.get("Relation Name") == relation else 0)
    return own + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


async def test_a_claim_reads_the_runs_that_may_be_ready_not_the_history(pg_url: str) -> None:
    """Issue 15: a worker's claim looked at every decided item ever recorded (PostgreSQL
    hashed them all to test "paused with everything decided", at every claim): 12-20 ms per
    claim with 20,000 of them, more than the rest of a resume. It now reads the runs that may
    be ready and their open items; the history of decided items is not read."""
    async with Store.open(pg_url) as store:
        await store.runs()  # migrated
    with psycopg.connect(pg_url) as conn:
        conn.execute(
            "INSERT INTO runs (id, task, status, created_at, updated_at, outcome) SELECT "
            "'f' || g, 't', 'completed', g, g, '{}' FROM generate_series(1, 5000) g")
        conn.execute(
            "INSERT INTO pending (id, kind, run_id, call_record, payload, created_at, state) "
            "SELECT 'pf' || g, 'approval', 'f' || g, 'c', '{}', g, 'decided' "
            "FROM generate_series(1, 5000) g")
        conn.execute(
            "INSERT INTO runs (id, task, status, created_at, updated_at, outcome) SELECT "
            "'a' || g, 't', 'awaiting_approval', g, g, '{}' FROM generate_series(1, 50) g")
        conn.execute(
            "INSERT INTO pending (id, kind, run_id, call_record, payload, created_at, state) "
            "SELECT 'pa' || g, 'approval', 'a' || g, 'c', '{}', g, 'open' "
            "FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO runs (id, task, status, created_at, updated_at) "
                     "SELECT 'r' || g, 't', 'ready', g, g FROM generate_series(1, 10) g")
        conn.commit()
        conn.execute("ANALYZE")
        conn.commit()
        row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {_postgres._TAKE_PAUSED}",
                           ("w", 30, [], 1)).fetchone()
        conn.rollback()
        ready = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM runs r "
                             f"WHERE {_postgres.READY_WHERE}").fetchone()
        conn.execute("UPDATE runs SET owner = 'w' WHERE id IN ('r1', 'r2')")
        held = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {_postgres._HELD_BY}",
                            ("w", [])).fetchone()
        conn.rollback()
    assert row is not None and held is not None and ready is not None
    plan = row[0][0]["Plan"]
    assert _rows_read(plan, "pending") < 1000, _rows_read(plan, "pending")
    # The same for what a worker's poll looks for (RUNNING runs whose driver is gone too).
    assert _rows_read(ready[0][0]["Plan"], "pending") < 1000, ready
    # What a claim reads ahead is found by its owner: not the 50 waiting, not the history.
    assert _rows_read(held[0][0]["Plan"], "runs") <= 10, held
    async with Store.open(pg_url) as store:  # and it takes what is ready, oldest first
        taken = await store.claim_ready("w", limit=3, orphans=False)
        assert sorted(r.id for r in taken) == ["r1", "r2", "r3"]
