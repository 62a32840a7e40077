"""`handrail worker`: a long-running process that resumes runs ready to continue.

    handrail worker [--store URL] [--concurrency N] [--agents MODULE:OBJECT ...]

It holds runs that are ready (a decision, an answer or a recovery arrived; or their driver
died) with `FOR UPDATE SKIP LOCKED` — so any number of workers on any number of machines take
disjoint runs — and resumes each with its agent: the one named in `--agents` (an `hr.Agent`,
or a mapping of agent names to agents) whose name matches the run's agent, else the `ref`
recorded with the run (an Agent, or a factory called with the run's record).

Wake-ups: PostgreSQL `LISTEN/NOTIFY` (a decision notifies at once); a slow poll (`--poll`)
catches what a notification missed (a lapsed lease, a lost connection).

SIGTERM (or SIGINT): stop taking runs; runs being resumed get `--grace` seconds to finish
(pause or complete); then what is left is cancelled — such a run stays RUNNING under this
process, which exits, so another worker takes it over (at once on this machine, after its
lease elsewhere) and its calls in flight come back as `AwaitingRecovery`. Exit code 0.

Each resumed run prints one JSON line on stdout: run id, agent, outcome, duration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from handrail.errors import HandrailError, ResumeRefused, StoreError, UserError

if TYPE_CHECKING:
    from handrail.store import RunRecord

__all__ = ["register"]


def _log(event: str, **fields: Any) -> None:
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields},
                      separators=(",", ":"), default=str)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _Agents:
    """Finds the agent for a run: `--agents` by name first, then the run's recorded ref."""

    def __init__(self, refs: list[str]) -> None:
        from handrail.cli._runs import load_object
        from handrail.runs import Agent

        self._by_name: dict[str, Any] = {}
        for ref in refs:
            obj = load_object(ref)
            if isinstance(obj, Agent):
                self._by_name[str(obj.name)] = obj
            elif isinstance(obj, Mapping) and all(isinstance(a, Agent) for a in obj.values()):
                self._by_name.update({str(k): v for k, v in obj.items()})
            else:
                raise UserError(f"--agents {ref}: expected an hr.Agent or a mapping of agent "
                                f"names to agents, got {type(obj).__name__}")
        self._by_ref: dict[str, Any] = {}

    def for_run(self, run: RunRecord) -> Any:
        from handrail.cli._runs import load_object
        from handrail.runs import Agent

        if run.agent is not None and run.agent in self._by_name:
            return self._by_name[run.agent]
        if not run.agent_ref:
            raise UserError(f"run {run.id} (agent {run.agent!r}) recorded no agent ref and "
                            "none of --agents has that name")
        obj = self._by_ref.get(run.agent_ref)
        if obj is None:
            obj = self._by_ref[run.agent_ref] = load_object(run.agent_ref)
        if not isinstance(obj, Agent) and callable(obj):
            obj = obj(run)
        if not isinstance(obj, Agent):
            raise UserError(f"{run.agent_ref} is not an hr.Agent (nor a factory returning one)")
        return obj


class Worker:
    """Takes ready runs from a PostgreSQL store and resumes them, `concurrency` at a time."""

    def __init__(self, store: Any, agents: _Agents, *, concurrency: int, poll: float,
                 grace: float, url: str = "") -> None:
        from handrail.store.contract import new_owner

        self.store = store
        self.url = url
        """The store's URL, as given (said, without its password, when the worker starts)."""
        self.agents = agents
        self.concurrency = concurrency
        self.poll = poll
        self.grace = grace
        self.owner = new_owner()
        self.active: set[str] = set()
        self.refused: set[str] = set()
        self.retry_at: dict[str, float] = {}
        """Runs whose resume met a store error: not taken again before then (monotonic)."""
        self.stopping = anyio.Event()
        self.wake = anyio.Event()
        self.idle = anyio.Event()
        self.resumed = 0
        self.next_orphan_scan = 0.0
        self.notifications = 0
        """Notifications received (each one a wake-up of this process)."""
        self.claims = 0
        """Claim statements sent (`claim_ready`)."""
        self.empty_claims = 0
        """Claims that took nothing: another worker was faster, or nothing was ready."""

    async def serve(self) -> None:
        """Run until `stopping` is set; then finish (or give up) within the grace period."""
        from handrail.store.contract import redacted_url

        _log("worker_started", worker=self.owner, concurrency=self.concurrency,
             store=redacted_url(str(getattr(self.store, "url", None) or self.url)))
        async with anyio.create_task_group() as runs:
            async with anyio.create_task_group() as helpers:
                helpers.start_soon(self._listen)
                helpers.start_soon(self._signals)
                await self._claim_loop(runs)
                helpers.cancel_scope.cancel()
            with anyio.move_on_after(self.grace):
                while self.active:
                    self.idle = anyio.Event()
                    await self.idle.wait()
            # Still going after the grace period: cancelled. Each stays RUNNING under this
            # process, which exits: another worker takes it over, its calls in doubt.
            abandoned = sorted(self.active)
            runs.cancel_scope.cancel()
        _log("worker_stopped", worker=self.owner, resumed=self.resumed, abandoned=abandoned,
             notifications=self.notifications, claims=self.claims,
             empty_claims=self.empty_claims)

    async def _claim_loop(self, runs: anyio.abc.TaskGroup) -> None:
        while not self.stopping.is_set():
            self.wake = anyio.Event()
            free = self.concurrency - len(self.active)
            taken: list[RunRecord] = []
            if free > 0:
                try:
                    # Never a run this worker is resuming now (its own runs are not orphans).
                    # Runs of dead processes of this machine: looked for once per poll
                    # interval, not at every claim (one more query).
                    scan = time.monotonic() >= self.next_orphan_scan
                    if scan:
                        self.next_orphan_scan = time.monotonic() + self.poll
                        # Deadlines too: an expired item's run becomes READY, claimed below.
                        await self.store.expire_due()
                    now = time.monotonic()
                    for run_id in [r for r, at in self.retry_at.items() if at <= now]:
                        del self.retry_at[run_id]
                    self.claims += 1
                    taken = await self.store.claim_ready(
                        self.owner, free,
                        frozenset(self.refused | self.active | self.retry_at.keys()),
                        orphans=scan)
                    self.empty_claims += not taken
                except HandrailError as exc:
                    _log("claim_failed", worker=self.owner, error=str(exc))
            for run in taken:
                self.active.add(run.id)
                # Said before resuming: a worker killed mid-resume leaves a trace of what it
                # held, though its run_resumed line never comes.
                _log("run_claimed", worker=self.owner, run_id=run.id)
                runs.start_soon(self._resume, run)
            if taken and len(taken) == free:
                continue  # maybe more ready: ask again once a slot frees (or at once)
            with anyio.move_on_after(self.poll):
                await self.wake.wait()

    async def _signals(self) -> None:
        import signal

        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                _log("worker_stopping", worker=self.owner, signal=signal.Signals(signum).name,
                     active=len(self.active))
                self.stopping.set()
                self.wake.set()
                return

    async def _listen(self) -> None:
        """Wake the claim loop on a notification; on a lost connection, rely on the poll.

        Only a worker with a free slot claims: a busy one claims when a run of its own ends
        (`_resume` wakes the loop then), so a notification does not make it send a claim
        that could take nothing.
        """
        try:
            conn = await self.store.listen()
        except HandrailError as exc:
            _log("listen_failed", worker=self.owner, error=str(exc))
            return
        try:
            async for _ in conn.notifies():
                self.notifications += 1
                if len(self.active) < self.concurrency:
                    self.wake.set()
        except Exception as exc:  # a dropped connection: the slow poll still finds work
            _log("listen_failed", worker=self.owner, error=str(exc))
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def _resume(self, run: RunRecord) -> None:
        from handrail.runs import resume

        started = time.monotonic()
        fields: dict[str, Any] = {"worker": self.owner, "run_id": run.id, "agent": run.agent,
                                  "status_before": run.status.value}
        try:
            agent = self.agents.for_run(run)
            result = await resume(self.store, run.id, agent=agent)
            self.resumed += 1
            fields["outcome"] = result.outcome.kind
        except Exception as exc:  # top-level boundary: one run's failure must not stop the worker
            # Refused (finished or taken meanwhile, a manifest change) or not resumable here (no
            # agent): give it back (a no-op when someone else holds it now) for a worker or an
            # operator who can, and do not take it again in this process. A store error (the
            # database overloaded, a connection lost) passes: taken again after a poll.
            if isinstance(exc, StoreError):
                self.retry_at[run.id] = time.monotonic() + self.poll
            else:
                self.refused.add(run.id)
            refused = isinstance(exc, ResumeRefused)
            fields.update(outcome="refused" if refused else "error",
                          error=f"{type(exc).__name__}: {exc}")
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                try:
                    await self.store.release(run.id, self.owner)
                except HandrailError:
                    pass
        finally:
            self.active.discard(run.id)
            self.idle.set()
            self.wake.set()
        fields["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
        _log("run_resumed", **fields)


def _cmd_worker(args: argparse.Namespace) -> int:
    from handrail.cli._runs import DEFAULT_STORE

    if args.concurrency < 1:
        raise UserError("--concurrency is at least 1")
    url = str(getattr(args, "store", None) or os.environ.get("HANDRAIL_STORE")
              or DEFAULT_STORE)
    agents = _Agents(args.agents or [])

    async def main() -> int:
        from handrail.store import Store

        store = Store.open(url)
        try:
            if not hasattr(store, "claim_ready"):
                raise UserError(
                    "handrail worker needs a store shared by many processes: "
                    "--store postgresql://... (a SQLite file is resumed by `handrail resume`)"
                )
            if args.lease is not None:
                store.lease_seconds = args.lease
            worker = Worker(store, agents, concurrency=args.concurrency, poll=args.poll,
                            grace=args.grace, url=url)
            await worker.serve()
        finally:
            with anyio.CancelScope(shield=True):
                await store.close()
        return 0

    return anyio.run(main)


def register(sub: Any) -> None:
    """Add `handrail worker` to the `handrail` parser."""
    p = sub.add_parser("worker", help="resume runs that are ready, from a PostgreSQL store",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    from handrail.cli._runs import add_store_option

    add_store_option(p, "the run store (default: $HANDRAIL_STORE); postgresql://...")
    p.add_argument("--concurrency", type=int, default=4,
                   help="runs resumed at once by this process (default 4)")
    p.add_argument("--agents", nargs="+", metavar="MODULE:OBJECT",
                   help="agents by name (an hr.Agent or a mapping name -> agent); default: "
                        "the ref each run recorded")
    p.add_argument("--poll", type=float, default=5.0,
                   help="seconds between polls when no notification arrives (default 5)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds runs get to finish after SIGTERM (default 30)")
    p.add_argument("--lease", type=float, default=None,
                   help="seconds a run's lease lasts without renewal (default: the store's)")
    # A long-running server of many runs: the collector is tuned for it (cli.main).
    p.set_defaults(func=_cmd_worker, many_runs=True)
