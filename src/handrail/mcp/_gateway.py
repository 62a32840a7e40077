"""The governed MCP gateway behind `handrail serve`: one toolset, every call through the gate.

Each client session is a run in the store (`handrail runs` lists it); each `tools/call` is one
turn of that run, driven by the same `Gate` an `Agent` uses, so the manifest, the policy, the
approvals and the records are the ones a Python agent gets.

A call the policy asks about is deferred (a pending request in the store, as for any run) and
waits up to `approval_timeout` for a decision made elsewhere (`handrail approve`, the inbox):
the store is the only thing the two processes share, so the wait reads it. Past the timeout
the client gets an `isError` result "awaiting approval: request <id>"; the same call (same
tool, same argument digest) made again later re-enters the paused call through the gate's
resume path (`drive_turn` with its record), so once approved it is performed exactly once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import time
import uuid
import weakref
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio

from handrail.approval import ResponderNone
from handrail.errors import NotFound, UserError
from handrail.gate import Gate, Governance, PausedOnQuestion, PausedOnRequest, RunScope
from handrail.manifest import check_against, refusals
from handrail.mcp._approve import ClientApprover, client_acts
from handrail.mcp._carry import READ_TOOL, Carried, client_names, keeps_names, read_tools
from handrail.mcp._content import to_mcp_dict
from handrail.mcp._json import strict_text
from handrail.mcp._relay import RELAY, Relay
from handrail.models import AssistantMessage, ToolCall, dump_messages
from handrail.otel import Telemetry, telemetry_from
from handrail.policy import Policy
from handrail.store import Batch, CallRecord, PendingItem, RunRecord, RunStatus, Store
from handrail.store.contract import new_owner
from handrail.tools import Toolbox, ToolResult, ToolSpec

if TYPE_CHECKING:
    import mcp_types
    from mcp.server.lowlevel import Server

    from handrail.approval import Responder
    from handrail.manifest import Manifest
    from handrail.mcp._serve_link import LinkRelay

__all__ = ["DEFAULT_APPROVAL_TIMEOUT", "Gateway", "GatewaySession"]

DEFAULT_APPROVAL_TIMEOUT = 30.0
"""Seconds a call that needs approval waits for a decision before the client is told so."""
POLL_SECONDS = 0.1
"""How often a waiting call reads the store for a decision made by another process."""
WAIT_PROGRESS_SECONDS = 5.0
"""How often a call waiting for a person tells its client so (a progress notification)."""
SESSION_EVENT = "mcp_session"
"""The first event after `governance` of every gateway run: it is an MCP client's session.

The inbox reads it (a call of a live session goes on by itself once decided; one of an ended
session is offered no resume), and `expire_orphans` looks for it."""
MAX_SESSIONS = 1024
"""Clients (runs) one server keeps open at once; past it, the idlest session's run ends."""

IDLE_SECONDS = 1800.0
"""A client's run ends after this long without a call in flight (`Gateway(idle_seconds=)`).

The MCP SDK's own limit for an HTTP session (`session_idle_timeout`, 30 minutes): after it
the session's id answers 404 and its client starts a new session, so the run of the old one
would otherwise stay open until the server stops. A client that calls again after it starts
a new run."""

_SAFE_NAME = re.compile(r"[^A-Za-z0-9 ._@+:/-]")
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def argument_digest(arguments: Any) -> str:
    """The digest that makes two calls "the same call": canonical JSON (sorted keys), SHA-256."""
    return "sha256:" + hashlib.sha256(_CANONICAL.encode(arguments).encode()).hexdigest()


def client_key(ctx: Any, connection: Any, single_client: bool = False) -> tuple[Any, ...]:
    """Which client a request comes from, i.e. which run its calls are recorded in.

    - `single_client` (stdio: one process serves one client): the one client.
    - A session-era client over HTTP: its `Mcp-Session-Id` (the SDK's, from the handshake).
    - Any other session-era connection (an in-process client): the connection.
    - A stateless-era client (2026-07-28), which has no handshake and sends each request on
      its own: the `Mcp-Session-Id` header when it sends one, else its bearer token with the
      client name and version it declares. Only a digest is kept (never the token), and the
      token is always part of it: a client cannot join a run opened with another token.
    """
    if single_client:
        return ("stdio",)
    session_id = getattr(connection, "session_id", None)
    if isinstance(session_id, str) and session_id:
        return ("session", session_id)
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    modern = getattr(connection, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS
    if not modern and getattr(connection, "has_standalone_channel", True):
        # A session-era connection (an `initialize` handshake): the connection is the
        # session. (Stateless-era requests each come on a connection of their own.)
        return ("connection", id(connection))
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    token = given = ""
    if headers is not None:
        token = str(headers.get("authorization") or "")
        given = str(headers.get("mcp-session-id") or "")
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    parts = [token, given, "" if given else str(getattr(info, "name", "") or ""),
             "" if given else str(getattr(info, "version", "") or "")]
    digest = hashlib.sha256("\0".join(p[:4096] for p in parts).encode()).hexdigest()
    return ("stateless", digest)


@dataclass
class _Parked:
    """A call waiting for a person: the turn it was, and its pending request."""

    turn: int
    call: ToolCall
    request_id: str
    lock: anyio.Lock
    """Held while the call is re-entered, so two identical retries drive it once."""
    what: str = "approval: request"
    """What it waits for, as the client is told: `awaiting <what> <id>`."""
    gate: Gate | None = None
    """The gate it goes through: None, the session's tools; else its resource reads'."""


class GatewaySession:
    """One client's session: a run in the store, one turn per `tools/call`."""

    def __init__(self, gateway: Gateway, run: RunRecord, scope: RunScope) -> None:
        self.gateway = gateway
        self.run = run
        self.gate = Gate(scope)
        self._reads: Gate | None = None  # `read_asked`'s, made at the first
        self._turn = 0
        self._seq = 0  # the next message's position in the run's transcript
        self._parked: dict[tuple[str, str], _Parked] = {}
        self._run_written_at = time.monotonic()  # `open_session` wrote the run just now
        self._events_written = len(run.events)
        self.busy = 0
        """Calls in flight (a busy session's run is not ended to make room)."""
        self.last_active = time.monotonic()
        """When a call last started or ended (`Gateway.end_idle`)."""

    @property
    def run_id(self) -> str:
        """The run this session's calls are recorded in."""
        return self.run.id

    async def _expire_parked(self, why: str) -> None:
        """The session ends: a parked call nobody approved yet expires, recorded.

        Nothing would resume it (a new session is a new run; `handrail resume` has no agent
        for a gateway's run), so its request is denied "expired" and the call re-entered
        once through the gate, which records the refusal (NOT_SENT) and the run can complete.
        A request already decided but not yet re-entered stays as it is.
        """
        from handrail.approval import Decision
        from handrail.errors import AlreadyDecided

        store = self.gateway.store
        for key, parked in list(self._parked.items()):
            if not parked.what.startswith("approval") or parked.lock.locked():
                continue  # a question (an answer is a person's text), or being re-entered
            reason = (f"expired: {why} before anyone decided (the call was not run; "
                      "make it again in a new session)")
            try:
                await store.decide(parked.request_id, Decision.deny(reason).to_dict(),
                                   "handrail serve (the session ended)")
            except (AlreadyDecided, NotFound):
                continue
            self.run.events.append({"kind": "mcp_call_expired", "at": time.time(),
                                    "request_id": parked.request_id,
                                    "tool": parked.call.name, "why": why})
            records = {r.call_id: r for r in await store.calls(self.run_id)
                       if r.turn == parked.turn}
            with anyio.CancelScope(shield=True):
                await self._drive(key, parked.turn, parked.call, records, parked.gate)

    def use_tools(self, toolbox: Toolbox, change: dict[str, Any]) -> None:
        """From the next call on, resolve against `toolbox`; the change joins the run's events."""
        self.gate.use_toolbox(toolbox)
        self.run.events.append({"kind": "tools_changed", "at": time.time(), **change})

    async def call(self, name: str, arguments: dict[str, Any] | None) -> ToolResult:
        """Pass one client call through the gate; see the module docstring.

        `name` is the name the client was shown (the tool's model-facing name). Each call is
        a turn: an upstream server's changed tool list is read again first.
        """
        return await self._busy(name, arguments, None)

    async def read_asked(self, server: str, uri: str) -> ToolResult:
        """A client's `resources/read` the policy asks about, as a call: asked like one.

        It goes through a gate of its own whose one tool reads `uri` of the upstream
        `server` (`Gateway.read_tools`; no manifest grant: the read's action is decided by
        the policy): a pending request, the wait, in-band approval, the identical retry,
        expiry, and a call record, all as for a `tools/call`.
        """
        return await self._busy(READ_TOOL, {"server": server, "uri": uri}, self.reads_gate())

    def reads_gate(self) -> Gate:
        """The session's gate for asked resource reads (`read_asked`), made at the first."""
        if self._reads is None:
            self._reads = Gate(dataclasses.replace(
                self.gate.scope, toolbox=self.gateway.read_tools(), manifest=None))
        return self._reads

    async def _busy(self, name: str, arguments: dict[str, Any] | None,
                    gate: Gate | None) -> ToolResult:
        self.busy += 1
        self.last_active = time.monotonic()
        try:  # the call itself here, not in a coroutine of its own: one frame less a call
            await self.gateway.refresh_tools()
            arguments = arguments if arguments is not None else {}
            try:
                text = strict_text(arguments)
                # The digest only matters when a call waits for a person (most sessions never).
                key = (name, argument_digest(arguments)) if self._parked else None
            except (TypeError, ValueError, RecursionError):
                return ToolResult.error("The arguments are not JSON (or are nested too deeply).")
            parked = self._parked.get(key) if key is not None else None
            if key is not None and parked is not None:
                async with parked.lock:
                    if self._parked.get(key) is parked:  # else a twin retry finished it first
                        return await self._wait(key, parked)
            # A new call (two identical ones arriving together are two calls, each decided).
            turn = self._turn
            self._turn += 1
            call = ToolCall(id=f"call-{turn + 1}", name=name, arguments=text)
            return await self._drive(key, turn, call, {}, gate)
        finally:
            self.busy -= 1
            self.last_active = time.monotonic()

    async def _drive(self, key: tuple[str, str] | None, turn: int, call: ToolCall,
                     existing: dict[str, CallRecord], via: Gate | None = None) -> ToolResult:
        store = self.gateway.store
        gate = self.gate if via is None else via
        first = Batch()
        if not existing:
            # The transcript `handrail show` reads: each call is a turn of the client's.
            first.messages.extend(self._transcript([AssistantMessage([call])]))
        try:
            outcome = await gate.drive_turn(turn, [call], existing, first)
        except BaseException:
            await self._record_interrupted(gate)
            raise
        if self._run_due():
            outcome.final.run = self._update()
        outcome.final.messages.extend(self._transcript(outcome.results))
        pause = outcome.pause
        # Committed before the client is shown the result (or told the call waits: another
        # process decides it). A call that changes nothing was not marked STARTED first
        # (`RunScope.mark_reads`), so this is its one commit.
        await store.write(outcome.final)
        if pause is None:
            if key is not None:
                self._parked.pop(key, None)
            return outcome.results[0].result
        if key is None:
            key = (call.name, argument_digest(json.loads(call.arguments)))
        if isinstance(pause, PausedOnRequest | PausedOnQuestion):
            request_id = (pause.request_id if isinstance(pause, PausedOnRequest)
                          else pause.question_id)
            parked = self._parked.get(key)
            if parked is not None and parked.request_id == request_id:
                return await self._wait(key, parked)  # re-entered under its lock already
            what = ("approval: request" if isinstance(pause, PausedOnRequest)
                    else "an answer: question")
            parked = _Parked(turn, call, request_id, anyio.Lock(), what, via)
            self._parked[key] = parked
            async with parked.lock:
                return await self._wait(key, parked)
        return ToolResult.error(f"the call is paused ({pause.kind}); see `handrail show "
                                f"{self.run_id}`")

    async def _record_interrupted(self, gate: Gate) -> None:
        """Record a call the client cancelled (or the server's shutdown cut off), settled.

        Shielded and bounded: it runs while the cancellation unwinds. A call cut off while
        its body ran is IN_DOUBT in the record (not silently STARTED forever, nor missing);
        one stopped before it ran is NOT_SENT.
        """
        settled = gate.take_interrupted()
        if settled is None:
            return
        with anyio.move_on_after(10, shield=True):
            batch = settled.final
            if settled.pause is None:
                batch.messages.extend(self._transcript(settled.results))
            batch.run = self._update()
            await self.gateway.store.write(batch)

    async def _wait(self, key: tuple[str, str], parked: _Parked) -> ToolResult:
        """Wait for the parked call's decision; then re-enter it through the gate, once.

        While it waits, the client's request (when it gave a progress token) gets a progress
        notification every `WAIT_PROGRESS_SECONDS`, naming what is waited for and where a
        person decides it: a desktop client shows it instead of a silent hang.
        """
        store = self.gateway.store
        started = anyio.current_time()
        deadline = started + self.gateway.approval_timeout
        relay = RELAY.get()
        told = -WAIT_PROGRESS_SECONDS
        while True:
            try:
                item = await store.pending_item(parked.request_id)
            except NotFound:
                item = None
            if item is None or item.state != "open":
                break
            now = anyio.current_time()
            if now >= deadline:
                return ToolResult.error(f"awaiting {parked.what} {parked.request_id}")
            if relay is not None and now - started - told >= WAIT_PROGRESS_SECONDS:
                told = now - started
                with contextlib.suppress(Exception):  # boundary: a client gone is not told
                    await relay.progress(round(told, 1), None, _waiting_message(parked))
            await anyio.sleep(POLL_SECONDS)
        records = {r.call_id: r for r in await store.calls(self.run_id)
                   if r.turn == parked.turn}
        return await self._drive(key, parked.turn, parked.call, records, parked.gate)

    async def write_events(self) -> None:
        """Write the run's row now (its events: a resource read is not a turn)."""
        await self.gateway.store.write(Batch(run=self._update()))

    async def call_event(self, kind: str, record: bool, **detail: Any) -> None:
        """A tool's event: kept in the session's run when asked (written with the turn)."""
        if record:
            self.run.events.append({"kind": kind, "at": time.time(), **detail})

    def _transcript(self, messages: Sequence[Any]) -> list[tuple[str, int, dict[str, Any]]]:
        run_id, seq = self.run.id, self._seq
        entries = []
        for dumped in dump_messages(list(messages)):  # a loop: no comprehension's frame
            entries.append((run_id, seq, dumped))
            seq += 1
        self._seq = seq
        return entries

    def _run_due(self) -> bool:
        """Whether this turn writes the run's row: its lease is a third spent, or it changed.

        The row's step count and times trail by at most a third of the lease (10 s by
        default); one UPDATE less per call. `close` writes it last.
        """
        return (time.monotonic() >= self._run_written_at + self.gateway.store.lease_seconds / 3
                or len(self.run.events) != self._events_written
                or len(self.gate.scope.remembered) != len(self.run.remembered))

    def _update(self) -> RunRecord:
        run = self.run
        self._run_written_at = time.monotonic()
        self._events_written = len(run.events)
        now = time.time()
        run.updated_at = now
        run.lease_until = now + self.gateway.store.lease_seconds
        run.steps = self._turn
        run.remembered = [r.to_dict() for r in self.gate.scope.remembered]
        return run

    async def close(self, why: str = "the MCP client disconnected") -> None:
        """End the session's run: completed, unless a call still waits for a person.

        Args:
            why: What ended the session, recorded as the run's outcome.
        """
        from handrail.runs import AwaitingApproval, Completed, outcome_to_dict

        await self._expire_parked(why)
        if self._parked:
            parked = next(iter(self._parked.values()))
            self.run.status = RunStatus.AWAITING_APPROVAL
            self.run.outcome = outcome_to_dict(AwaitingApproval(parked.request_id))
        else:
            self.run.status = RunStatus.COMPLETED
            self.run.outcome = outcome_to_dict(Completed(why))
        self.run.owner = None
        await self.gateway.store.write(Batch(run=self._update()))


class Gateway:
    """A governed toolset served over MCP (`handrail serve`); see the module docstring.

    Args:
        toolbox: Every tool that may be served (Python tools and connected MCP toolsets).
        store: Where sessions' runs and pending requests are kept.
        manifest: Only its grants are listed and callable, with its descriptions.
        policy: The policy; default the manifest's, else `Policy.default()`.
        workspace: The directory paths are confined to.
        approval_timeout: Seconds a call waits for a decision before the client is told.
        responder: Answers tools' questions; default nobody (the call pauses).
        name: The agent name runs are recorded under.
        telemetry: Where each call reports an `execute_tool` span and the call metrics
            (docs/observability.md): None (default) follows the global OpenTelemetry providers,
            looked up when a client's session starts; a `hr.Telemetry` names them; False never.
        idle_seconds: A client's run ends after this long without a call in flight
            (default `IDLE_SECONDS`, 30 minutes, the MCP SDK's HTTP session limit; None:
            only when the client leaves or the server stops). See `end_idle`.
        governance: The whole governance every session's run is under
            (`handrail.runs.governance_for` derives it from a served agent, the manifest and
            the flags); when given, `policy` and `workspace` must not be (it has them), and
            its manifest must be `manifest`. Default: from `policy`, `workspace` and
            `manifest`, no control, sandbox "auto".
        client_approval: The acts (`{"write", "call"}`) whose asks may be put to the MCP
            client's own user, in the call, when the client declared `elicitation`
            (`handrail.mcp._approve`); default none: every ask waits for a person in the
            queue.
    """

    def __init__(self, toolbox: Toolbox, *, store: Store, manifest: Manifest | None = None,
                 policy: Policy | None = None, workspace: str | os.PathLike[str] = ".",
                 approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
                 responder: Responder | None = None, name: str | None = None,
                 deps: Any = None, telemetry: Telemetry | Literal[False] | None = None,
                 idle_seconds: float | None = IDLE_SECONDS,
                 governance: Governance | None = None,
                 client_approval: Collection[str] | None = None) -> None:
        if not approval_timeout >= 0:
            raise UserError("approval_timeout must be a non-negative number of seconds")
        if idle_seconds is not None and (isinstance(idle_seconds, bool) or not (
                isinstance(idle_seconds, int | float) and 0 < idle_seconds < float("inf"))):
            raise UserError(f"idle_seconds must be a positive number of seconds (or None: "
                            f"never), not {idle_seconds!r}")
        self.idle_seconds = None if idle_seconds is None else float(idle_seconds)
        self.client_approval = client_acts(client_approval)
        self.telemetry: Telemetry | None = telemetry_from(telemetry)
        self.toolbox = toolbox
        self.store = store
        self.manifest = manifest
        if governance is not None and policy is not None:
            raise UserError("Gateway(governance=...) carries the policy: pass policy= or "
                            "governance=, not both")
        if manifest is not None:
            check_against(toolbox, manifest)
            if manifest.policy is not None:
                policy = manifest.policy if policy is None else manifest.policy.contain(policy)
            name = name or manifest.agent.name
        if governance is not None:
            if governance.manifest is not manifest:
                raise UserError("Gateway(governance=...) carries the manifest: pass the same "
                                "manifest= (or none on either)")
            self.governance = governance
        else:
            self.governance = Governance(
                policy=policy if policy is not None else Policy.default(),
                workspace=Path(workspace).resolve(), manifest=manifest)
        self.policy = self.governance.policy
        self.workspace = self.governance.workspace
        self.approval_timeout = float(approval_timeout)
        self.responder = responder
        self.name = name or "mcp-gateway"
        self.deps = deps
        self.sessions: list[GatewaySession] = []
        # Clients' sessions by `client_key`, least recently used first.
        self._by_client: collections.OrderedDict[tuple[Any, ...], GatewaySession] = (
            collections.OrderedDict())
        self._owners: dict[tuple[Any, ...], Any] = {}  # connection-keyed: the connection
        self._opening: dict[Hashable, anyio.Lock] = {}  # clients whose first call opens a run
        # Session-era connections, told of a changed list; weakly held (a connection the SDK
        # has let go of is forgotten, not told).
        self._clients: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._subscriptions: Any = None  # stateless-era listeners (`subscriptions/listen`)
        with contextlib.suppress(ImportError):
            from mcp.server.subscriptions import InMemorySubscriptionBus

            self._subscriptions = InMemorySubscriptionBus()
        self._check = (None if manifest is None else
                       functools.partial(refusals, manifest=manifest))
        self._watch(toolbox)
        self.client_names(strict=True)  # two tools shown by one name: refused at start

    def _watch(self, toolbox: Toolbox) -> None:
        """Be told when an upstream MCP server announces `tools/list_changed`."""
        for member in toolbox.changing():
            watch = getattr(member, "watch", None)
            if callable(watch):
                watch(self._upstream_changed)

    async def _upstream_changed(self) -> None:
        await self.refresh_tools()

    async def refresh_tools(self) -> dict[str, Any] | None:
        """Read upstream servers' changed tool lists again; tell sessions and clients.

        A tool that appeared is listed and callable only if the manifest admits it (the
        check the gateway ran at start, `Toolbox.refreshed`); a removed or redefined one is
        no longer listed, and a call to it is refused with the reason. Every session's run
        records the change, and every connected client gets `notifications/tools/list_changed`.
        Returns the change, or None when nothing changed.
        """
        current = self.toolbox
        box, change = await current.refreshed(self._check)
        if change is None or self.toolbox is not current:
            return None  # nothing new, or another call applied this change first
        self.toolbox = box
        for session in self.sessions:
            session.use_tools(box, change)
        for key, client in list(self._clients.items()):
            try:
                await client.send_tool_list_changed()
            except Exception:  # boundary: a client gone meanwhile is not told
                self._clients.pop(key, None)
        if self._subscriptions is not None:
            from mcp.server.subscriptions import ToolsListChanged

            await self._subscriptions.publish(ToolsListChanged())
        return change

    def read_tools(self) -> Toolbox:
        """The toolbox resource reads the policy asks about go through (`_carry.read_tools`)."""
        box: Toolbox | None = getattr(self, "_read_tools", None)
        if box is None:
            box = self._read_tools = read_tools(self)
        return box

    def offered(self) -> list[ToolSpec]:
        """What clients are shown: the granted tools, with the manifest's descriptions."""
        specs = self.toolbox.specs()
        return self.manifest.offer(specs) if self.manifest is not None else specs

    async def open_session(self, client: str = "mcp client") -> GatewaySession:
        """Start a session: a new run, recorded now so `handrail runs` lists it."""
        now = time.time()
        governance = self.governance
        run = RunRecord(
            id=uuid.uuid4().hex[:16], task=f"MCP session of {client}", agent=self.name,
            status=RunStatus.RUNNING, policy=governance.policy.to_dict(),
            manifest_digest=governance.manifest_digest, model=f"mcp:{client}",
            workspace=str(governance.workspace), created_at=now, updated_at=now,
            owner=new_owner(), lease_until=now + self.store.lease_seconds,
            events=[governance.event(now),
                    {"kind": SESSION_EVENT, "at": now, "client": client, "server": self.name}])
        await self.store.write(Batch(run=run))
        session = self._session_of(run)
        self.sessions.append(session)
        return session

    def _session_of(self, run: RunRecord) -> GatewaySession:
        """A session whose calls are recorded in `run`, under this gateway's governance."""
        from handrail.runs import DeferAll

        scope: RunScope = self.governance.scope(
            run_id=run.id, agent=self.name, toolbox=self.toolbox, store=self.store,
            approver=DeferAll(), responder=self.responder or ResponderNone(), deps=self.deps,
            mark_reads=False,
            telemetry=None if self.telemetry is None else self.telemetry.start())
        session = GatewaySession(self, run, scope)
        scope.events = session.call_event
        if self.client_approval:
            client = (run.model or "").removeprefix("mcp:") or "mcp client"
            scope.approver = ClientApprover(self.client_approval, client, session.call_event)
        return session

    # -- the MCP server -------------------------------------------------------------------

    def tool_list(self) -> list[mcp_types.Tool]:
        """The offered tools as MCP `Tool`s (names as models see them)."""
        import mcp_types as t

        tools = []
        shown = {model: name for name, model in self.client_names().items()}
        for spec in self.offered():
            output = dict(spec.output_schema) if spec.output_schema is not None else None
            if output is not None and output.get("type") != "object":
                output = None  # MCP output schemas describe objects; the text still carries it
            tools.append(t.Tool(
                name=shown.get(spec.id.model_name, spec.id.model_name),
                description=spec.description,
                input_schema=dict(spec.input_schema), output_schema=output,
                annotations=t.ToolAnnotations(read_only_hint=not spec.mutates,
                                              idempotent_hint=spec.idempotent)))
        return tools

    def server(self, *, single_client: bool = False) -> Server[Any]:
        """The low-level MCP server whose handlers pass every call through this gateway.

        Which run a call belongs to is the client's session (`client_key`): with
        `single_client` (`serve_stdio`: one process, one client) every request is the one
        client's; over HTTP a session-era client (an `initialize` handshake) is its
        `Mcp-Session-Id`, and a stateless-era client (2026-07-28: no handshake, each request
        on its own) is the `Mcp-Session-Id` header it sends, else its bearer token with the
        client name and version it declares. Both eras are told when the tool list changes:
        session-era connections by `notifications/tools/list_changed`, stateless-era clients
        on their `subscriptions/listen` stream.
        """
        from handrail.mcp._errors import require_sdk

        require_sdk()
        import mcp_types as t
        from mcp.server.lowlevel import NotificationOptions, Server
        from mcp.server.subscriptions import ListenHandler

        from handrail.mcp._content import to_mcp_result

        sessions = self._by_client
        owners = self._owners
        one_client: list[Any] = []  # with single_client: the connection that came first

        def remember(ctx: Any) -> tuple[tuple[Any, ...], Any]:
            # The SDK builds a ServerSession per request around a connection object: the
            # connection is what a session-era client's session is, and what
            # notifications go through.
            connection = getattr(ctx.session, "_connection", ctx.session)
            if single_client:
                if not one_client:
                    one_client.append(connection)
                connection = one_client[0]
            key = client_key(ctx, connection, single_client)
            if (getattr(connection, "has_standalone_channel", True)
                    and callable(getattr(connection, "send_tool_list_changed", None))):
                # Weakly: a gone one is dropped. The one stdio client has one slot, which
                # its own link (`serve_stdio`) shares: told once, whichever came last.
                self._clients[0 if single_client else id(connection)] = connection
            return key, connection

        async def session_for(ctx: Any) -> GatewaySession:
            key, connection = remember(ctx)
            found = sessions.get(key)
            if found is not None and key[0] == "connection" and owners.get(key) is not connection:
                found = None  # another connection at a reused id: a new client
                sessions.pop(key, None)
            if found is not None:
                sessions.move_to_end(key)
                return found
            params = getattr(ctx.session, "client_params", None)
            info = getattr(params, "client_info", None)
            return await self._open_for(key, getattr(info, "name", None), connection)

        async def list_tools(ctx: Any, params: Any) -> t.ListToolsResult:
            remember(ctx)
            await self.refresh_tools()
            return t.ListToolsResult(tools=self.tool_list())

        async def call_tool(ctx: Any, params: t.CallToolRequestParams) -> t.CallToolResult:
            session = await session_for(ctx)
            name = self.client_shown_to_model(params.name)
            # What an upstream server sends during the call (progress, log messages, a
            # sampling request, a form) is relayed to this request's client.
            token = RELAY.set(Relay(ctx, session.call_event))
            try:
                result = await session.call(name, params.arguments)
            finally:
                RELAY.reset(token)
            return to_mcp_result(result)

        class GatewayServer(Server[Any]):
            """Declares `tools.listChanged` whoever asks for its capabilities (HTTP too)."""

            def create_initialization_options(
                    self, notification_options: NotificationOptions | None = None,
                    experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                    extensions: dict[str, dict[str, Any]] | None = None) -> Any:
                return super().create_initialization_options(
                    notification_options or NotificationOptions(tools_changed=True),
                    experimental_capabilities, extensions)

        server = GatewayServer(self.name, version="handrail", on_list_tools=list_tools,
                               on_call_tool=call_tool,
                               on_subscriptions_listen=ListenHandler(self._subscriptions))
        Carried(self, session_for).register(server)
        return server

    async def _open_for(self, key: tuple[Any, ...], named: Any,
                        connection: Any = None) -> GatewaySession:
        """The session of client `key`, opened now (a new run) unless a twin call opened it."""
        lock = self._opening.setdefault(key, anyio.Lock())
        async with lock:  # two first calls of one client at once open one run
            found = self._by_client.get(key)
            if found is None:
                # The client names itself: shown in `handrail runs`, so plain characters.
                client = _SAFE_NAME.sub("?", str(named or "mcp client"))[:100]
                found = await self.open_session(client)
                self._by_client[key] = found
                if key[0] == "connection":
                    self._owners[key] = connection
                await self._forget_idle()
        self._opening.pop(key, None)
        return found

    async def serve_call(self, params: dict[str, Any], relay: LinkRelay) -> dict[str, Any]:
        """One `tools/call` of the stdio client, over handrail's own link (`_serve_link`).

        The same as the SDK server's `tools/call` handler (`server()`): the client's run, the
        name it was shown, the gate, and what an upstream sends meanwhile relayed for this
        request; the result as the wire dict for the negotiated version.
        """
        key = ("stdio",)
        session = self._by_client.get(key)
        if session is None:
            session = await self._open_for(key, relay.link.client_name)
        else:
            self._by_client.move_to_end(key)
        arguments = params.get("arguments")
        name = self.client_shown_to_model(params["name"])
        token = RELAY.set(relay.bind(session.call_event))
        try:
            result = await session._busy(name, arguments, None)  # `call`, one frame less
        finally:
            RELAY.reset(token)
        return to_mcp_dict(result, relay.link.version or "2025-11-25")

    def client_shown_to_model(self, shown: str) -> str:
        """The model-facing name of the tool a client calls by `shown`.

        A tool no longer offered (withdrawn, refused) of a server that keeps its names is
        found too, so the client gets the reason rather than "no such tool".
        """
        found = self.client_names().get(shown)
        if found is not None:
            return found
        from handrail.tools import ToolId

        for server in keeps_names(self):
            try:
                candidate = ToolId(server, shown).model_name
            except UserError:
                continue
            if self.toolbox.withdrawn(candidate) is not None:
                return candidate
        return shown

    def client_names(self, *, strict: bool = False) -> dict[str, str]:
        """The names MCP clients see, each to the tool's model-facing name (`client_names`).

        An upstream server's tools keep their own names where its `[[servers]]` entry says
        `names = "upstream"` (the default for a manifest with one server); others are shown
        as models see them (`server--tool`). Cached per tool list.
        """
        toolbox = self.toolbox
        cached: tuple[Toolbox, dict[str, str]] | None = getattr(self, "_names_cache", None)
        if cached is not None and cached[0] is toolbox:
            return cached[1]
        names = client_names(self.offered(), keeps_names(self), strict=strict)
        self._names_cache = (toolbox, names)
        return names

    async def end_client(self, key: tuple[Any, ...]) -> None:
        """The client `key` (`client_key`) ended its session: end its run now.

        A call still in flight keeps the run open (it ends when the server stops, or
        makes room for others).
        """
        session = self._by_client.get(key)
        if session is None or session.busy:
            return
        del self._by_client[key]
        self._owners.pop(key, None)
        if session in self.sessions:
            self.sessions.remove(session)
        await session.close()

    async def end_idle(self, now: float | None = None) -> int:
        """End the runs of clients without a call in flight for `idle_seconds`; how many.

        `serve_http` calls it every minute or so (a client of the HTTP session era whose
        session the SDK let go after the same idle time, or a stateless-era client that
        stopped calling, never says goodbye). A client that calls again afterwards starts a
        new run. A call waiting for a person keeps its session busy, so its run stays.

        Args:
            now: The `time.monotonic()` to judge by (default now).
        """
        if self.idle_seconds is None:
            return 0
        now = time.monotonic() if now is None else now
        ended = 0
        for key, session in list(self._by_client.items()):
            if session.busy or now - session.last_active < self.idle_seconds:
                continue
            if self._by_client.get(key) is not session:
                continue  # replaced meanwhile (while an earlier one was being closed)
            del self._by_client[key]
            self._owners.pop(key, None)
            if session in self.sessions:
                self.sessions.remove(session)
            await session.close(f"the MCP client was idle for {self.idle_seconds:g} s")
            ended += 1
        return ended

    async def _forget_idle(self) -> None:
        """Past `MAX_SESSIONS` clients, end the runs of those idle the longest.

        A stateless client never says goodbye: without a bound, every new token or client
        name would keep a run (and its memory) open until the server stops.
        """
        await self.end_idle()
        sessions = self._by_client
        while len(sessions) > MAX_SESSIONS:
            key, oldest = next(iter(sessions.items()))
            if oldest.busy:
                return  # the least recently used is in a call: none is idle enough
            del sessions[key]
            self._owners.pop(key, None)
            if oldest in self.sessions:
                self.sessions.remove(oldest)
            await oldest.close()

    def initialization_options(self, server: Server[Any]) -> Any:
        """The server's capabilities: its tool list may change (`tools.listChanged`)."""
        return server.create_initialization_options()

    async def serve_stdio(self) -> None:
        """Serve MCP over this process's stdin/stdout until the client closes it.

        Calls of this gateway's earlier servers that were stopped without closing their
        sessions expire first (`expire_orphans`); waiting calls keep their lease
        (`heartbeat`).
        """
        from handrail.mcp._serve_link import ServeLink
        from handrail.mcp._stdio import serve_stdio_transport

        server = self.server(single_client=True)
        link = ServeLink(self.serve_call)
        try:
            await self.expire_orphans()
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.heartbeat)
                async with serve_stdio_transport(link) as (read, write):
                    self._clients.setdefault(0, link)  # told of list changes (`remember`)
                    await server.run(read, write, self.initialization_options(server))
                tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def close(self) -> None:
        """Record every open session's run as ended."""
        sessions, self.sessions = self.sessions, []
        for session in sessions:
            await session.close()

    async def keep_alive(self) -> int:
        """Renew the lease of each session with a call waiting for a person; how many.

        A session's run row is otherwise written at its calls, so a call parked longer than
        the store's lease (30 s) would look like one whose server is gone: the inbox says
        its session ended, and the next `handrail serve` on the store expires it
        (`expire_orphans`). `serve_stdio` and `serve_http` call this every third of the
        lease (`heartbeat`); code serving `Gateway.server()` itself should too.
        """
        due = time.monotonic() - self.store.lease_seconds / 3
        written = 0
        for session in list(self.sessions):
            if session._parked and session._run_written_at <= due:
                await self.store.write(Batch(run=session._update()))
                written += 1
        return written

    async def heartbeat(self) -> None:
        """`keep_alive` every third of the store's lease, until cancelled."""
        while True:
            await anyio.sleep(self.store.lease_seconds / 3)
            await self.keep_alive()

    async def expire_orphans(
            self, why: str = "the handrail serve that held its MCP session stopped") -> int:
        """Expire the waiting calls of this gateway's runs whose server is gone; how many runs.

        A server that stops in order expires its sessions' parked calls itself
        (`GatewaySession.close`); one that was killed leaves them pending, and approving one
        would lead nowhere (nothing holds the session; a new session is a new run). So at
        start `handrail serve` looks for the open approvals of MCP sessions' runs
        (`SESSION_EVENT`) recorded under this gateway's name whose lease has lapsed (a live
        server renews it: `keep_alive`), and expires them as their server would have: the
        request denied "expired", the call recorded refused (NOT_SENT, an `mcp_call_expired`
        event), the run completed. A question stays open (an answer is a person's text).
        """
        now = time.time()
        by_run: dict[str, list[PendingItem]] = {}
        for item in await self.store.pending(agent=self.name):
            if item.kind in ("approval", "question"):
                by_run.setdefault(item.run_id, []).append(item)
        ended = 0
        for run_id, items in by_run.items():
            try:
                run = await self.store.run(run_id)
            except NotFound:
                continue
            if (not is_session_run(run) or run.agent != self.name
                    or (run.owner is not None and run.lease_until > now)
                    or not any(i.kind == "approval" for i in items)):
                continue
            session = self._session_of(run)
            records = {r.id: r for r in await self.store.calls(run_id)}
            for item in items:
                record = records.get(item.call_record)
                if record is None:
                    continue
                call = ToolCall(id=record.call_id, name=record.model_name,
                                arguments=record.arguments)
                what = "approval: request" if item.kind == "approval" else "an answer: question"
                session._parked[(call.name, item.id)] = _Parked(
                    record.turn, call, item.id, anyio.Lock(), what,
                    session.reads_gate() if call.name == READ_TOOL else None)
            session._turn = max([run.steps, *(r.turn + 1 for r in records.values())])
            session._seq = len(await self.store.messages(run_id))
            await session.close(why)
            ended += 1
        return ended


def is_session_run(run: RunRecord) -> bool:
    """Whether `run` is an MCP client's session of `handrail serve` (`SESSION_EVENT`)."""
    return any(isinstance(e, dict) and e.get("kind") == SESSION_EVENT for e in run.events)


def _waiting_message(parked: _Parked) -> str:
    """What a client's user is shown while a call waits for a person."""
    if parked.what.startswith("approval"):
        return (f"waiting for a person to approve request {parked.request_id} "
                f"({parked.call.name}): `handrail approve {parked.request_id}` or "
                "`handrail deny`, or the inbox (`handrail inbox`)")
    return (f"waiting for an answer to question {parked.request_id} ({parked.call.name}): "
            f"`handrail answer {parked.request_id} TEXT`, or the inbox (`handrail inbox`)")


def build_toolbox(tools: Sequence[object]) -> Toolbox:
    """A Toolbox of `tools` (Python tools, Toolsets, connected MCPToolsets)."""
    return Toolbox(list(tools))
