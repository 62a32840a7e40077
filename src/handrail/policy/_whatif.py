"""What a proposed policy would have done to the recorded calls, and the least one they need.

Both are pure functions over records (`replay`, `suggest_from`): the store is read by
`Store.call_history`, which writes nothing. `what_if` and `suggest` put the two together.

A recorded call is replayed on the canonical targets it was decided on, never re-resolved
against today's disk or PATH:

- a call with one action (every built-in tool): the verdict's target, which is that action's
  canonical form as the policy saw it (the path with its links followed; the program as
  PATH found it);
- each action of a call with several: its `canonical` entry when the record has one, else
  its target made canonical lexically against the run's workspace (`..`, `.`, `//`
  collapsed; links not followed). Such a replay is marked `approximate`;
- an EXEC of a program given by path: its lexical path stands for the file it led to (a link
  there is not known to the record): `approximate` too;
- NET and CALL targets: canonical forms are pure functions of the recorded text.

A rule's value conditions read the arguments a call was performed with (a refused call kept
none: undecidable, judged the stricter way, `approximate`). Quotas are not replayed (see
`replay`).

A CALL's default depends on whether the tool declares `mutates=False`; the record says so only
when the default decided it (its reason). Otherwise the tool is taken as mutating, the
stricter reading, and the replay is `approximate` when the two defaults differ.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
import os
import posixpath
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from handrail.errors import PolicyError, UserError
from handrail.policy._policy import CONFINEMENT, Effect, Layer, Policy, Rule, Verdict
from handrail.policy._targets import Program, exec_candidates, is_inside
from handrail.tools import Act, Action

if TYPE_CHECKING:
    from handrail.store.contract import CallRecord, RunRecord, Store

__all__ = [
    "Flip",
    "Outcome",
    "Suggestion",
    "WhatIf",
    "agent_paths",
    "parse_since",
    "replay",
    "suggest",
    "suggest_from",
    "what_if",
]

Outcome = Literal["allowed", "approved", "denied", "pending", "refused"]
"""What happened to a recorded call: the policy allowed it; it asked and the approver
approved, denied, or has not decided yet; the policy denied it (refused, never sent)."""

TAINT_LAYER = "taint"
"""The layer of a verdict made stricter by the taint check (as the gate names it)."""

_READ_ONLY_REASON = "(the tool declares mutates=False)"
_ACTS = {a.value: a for a in Act}
_EFFECTS = {e.value: e for e in Effect}
_GLOB = re.compile(r"([\\*?\[\]])")
_SINCE = re.compile(r"([0-9]{1,9})([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MAX_AGENT = 1000
SUGGESTED_LAYER = "suggested"
"""The layer of a suggested policy that holds its allow rules."""
DENIED_LAYER = "denied-by-person"
"""The layer of a suggested policy that denies what a person denied in the record."""
GENERALISE_AT = 3
"""How many distinct files of one folder an agent must have been let touch (with the same act)
before `suggest` allows the folder (`dir/*`) instead of naming each file."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Flip:
    """One recorded call whose effect the proposed policy changes."""

    run_id: str
    """The run the call belongs to."""
    call_id: str
    """The model's call id (`handrail show RUN` lists it)."""
    agent: str
    """The agent path: the run's agent after its parents' (`planner/coder`)."""
    tool: str
    """The tool's id."""
    act: str
    """The act of the action that decides the new verdict."""
    target: str
    """Its canonical target, as recorded."""
    before: Effect
    """The recorded verdict's effect."""
    after: Effect
    """The proposed policy's effect."""
    outcome: Outcome
    """What happened to the call."""
    reason_before: str
    """Why, as recorded (the rule or the default)."""
    reason_after: str
    """Why, under the proposed policy."""
    approximate: bool = False
    """The replay could not use the exact canonical form of every action (see the module)."""

    @property
    def change(self) -> str:
        """`allow -> ask`, for counting and display."""
        return f"{self.before.value} -> {self.after.value}"

    @property
    def gating(self) -> bool:
        """Whether this flip fails the check (`handrail policy what-if` exits 1).

        A person approved it and it would now be denied, or it was denied (by the policy or
        a person) and it would now be allowed.
        """
        if self.outcome == "approved":
            return self.after is Effect.DENY
        if self.outcome in ("refused", "denied"):
            return self.after is Effect.ALLOW
        return False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form."""
        return {"run_id": self.run_id, "call_id": self.call_id, "agent": self.agent,
                "tool": self.tool, "act": self.act, "target": self.target,
                "before": self.before.value, "after": self.after.value,
                "outcome": self.outcome, "reason_before": self.reason_before,
                "reason_after": self.reason_after, "approximate": self.approximate,
                "gating": self.gating}


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIf:
    """What a proposed policy would have changed in the record (`what_if`, `replay`)."""

    replayed: int
    """Calls the recorded policy decided, each replayed against the proposed one."""
    undecided: int
    """Calls no policy decided (unknown tool, not granted, invalid arguments, refused by the
    tool control): a policy change cannot change them."""
    runs: int
    """Runs whose calls were read."""
    flips: tuple[Flip, ...]
    """Every call whose effect changes, in record order."""

    @property
    def gating(self) -> tuple[Flip, ...]:
        """The flips that fail the check (see `Flip.gating`)."""
        return tuple(f for f in self.flips if f.gating)

    @property
    def failed(self) -> bool:
        """Whether any flip is gating: `handrail policy what-if` then exits 1."""
        return any(f.gating for f in self.flips)

    def by_change(self) -> dict[str, int]:
        """Flips counted per change (`allow -> ask`), most first."""
        return dict(Counter(f.change for f in self.flips).most_common())

    def by_rule(self) -> dict[str, int]:
        """Flips counted per rule (or default) that decides under the proposed policy."""
        return dict(Counter(f.reason_after for f in self.flips).most_common())

    def by_tool(self) -> dict[str, int]:
        """Flips counted per tool."""
        return dict(Counter(f.tool for f in self.flips).most_common())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form (`handrail policy what-if --json`)."""
        return {"replayed": self.replayed, "undecided": self.undecided, "runs": self.runs,
                "failed": self.failed, "gating": len(self.gating),
                "approximate": sum(f.approximate for f in self.flips),
                "by_change": self.by_change(), "by_rule": self.by_rule(),
                "by_tool": self.by_tool(), "flips": [f.to_dict() for f in self.flips]}


@dataclass(frozen=True, kw_only=True, slots=True)
class Suggestion:
    """The least policy the record needs (`suggest`, `suggest_from`)."""

    policy: Policy
    """The suggested policy: `Policy.from_toml(suggestion.policy.to_toml())` loads it back."""
    calls: int
    """Calls whose actions were allowed or approved, each now allowed by a rule."""
    runs: int
    """Runs read."""
    generalised: tuple[str, ...] = ()
    """The folder globs written in place of several files (`write:src/*`)."""
    conflicts: tuple[str, ...] = field(default=())
    """Allowed or approved targets that a kept deny rule denies (a deny of another run's
    policy): the deny is kept, so these calls would be refused."""

    def to_toml(self, *, header: str = "") -> str:
        """The policy as TOML (`Policy.from_toml` reads it), after `header` as comments."""
        lines = [f"# {line}" if line else "#" for line in header.splitlines()]
        return ("\n".join(lines) + "\n\n" if lines else "") + self.policy.to_toml()


# -- reading a record -------------------------------------------------------------------


# The two internal records below are built once per recorded call (100,000 at a time): not
# frozen, since a frozen dataclass pays an object.__setattr__ per field on construction.
@dataclass(slots=True)
class _Decided:
    """One action of a recorded call, in the canonical form it was decided on."""

    act: Act
    target: str
    """Canonical: a workspace-relative path, an EXEC's shown argv, a NET or CALL target."""
    argv: tuple[str, ...] | None = None
    program: Program | None = None
    root: str = "/"
    confined: bool = False
    """Denied by confinement when decided (outside the workspace, not canonical)."""
    approximate: bool = False

    def check(self, policy: Policy, mutates: bool, arguments: Any = None) -> Verdict:
        if self.confined:
            return Verdict(Effect.DENY, None, CONFINEMENT, self.target,
                           "path resolves outside the workspace, or cannot be made canonical "
                           "(as recorded)")
        act = self.act
        if act is Act.READ or act is Act.WRITE:
            return policy.check_canonical_path(act, self.target)
        if act is Act.EXEC:
            assert self.argv is not None and self.program is not None
            shown, deny, allow = exec_candidates(self.argv, self.program, self.root)
            return policy.check_canonical_exec(shown, deny, allow)
        # NET and CALL: canonicalising these is a pure function of the text (no DNS). A CALL
        # rule's value conditions read the arguments the call was performed with.
        return policy.check(Action(act, self.target), mutates=mutates, arguments=arguments)


@dataclass(slots=True)
class _Shape:
    """What a recorded call was decided on: shared by every call recorded alike.

    The same file read, the same program run, the same rule deciding: a record of 100,000
    calls holds a few hundred shapes, so each is built, and replayed, once.
    """

    actions: tuple[_Decided, ...]
    before: Effect
    reason_before: str
    mutates: bool
    mutates_known: bool
    tainted: bool


@dataclass(slots=True)
class _Call:
    """A recorded call the policy decided, ready to replay."""

    record: CallRecord
    agent: str
    shape: _Shape
    outcome: Outcome


def _lexical_path(raw: object, root: str) -> tuple[str, bool]:
    """(canonical path, confined): `raw` made workspace-relative without touching the disk."""
    if not isinstance(raw, str) or not raw or "\x00" in raw or len(raw) > 4096:
        return (raw if isinstance(raw, str) else repr(raw)), True
    path = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(root, raw))
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if not is_inside(path, root):
        return raw, True
    rel = path[len(root.rstrip("/")) + 1:]
    return (rel or "."), False


def _program(argv: tuple[str, ...], shown: str | None, root: str) -> tuple[Program, bool]:
    """The program of a recorded EXEC as it was resolved: (program, approximate)."""
    given = argv[0]
    rest = " ".join(argv[1:])
    shown_program: str | None = None
    if shown is not None:
        suffix = " " + rest if rest else ""
        if shown.endswith(suffix):
            shown_program = shown[:len(shown) - len(suffix)] if suffix else shown
    if "/" not in given:
        if shown_program is None:
            return Program(given, None, None, False), True
        if shown_program == given:
            return Program(given, None, None, False), False  # found nowhere on PATH
        return Program(given, shown_program, shown_program, True), False
    path = shown_program or posixpath.normpath(
        given if given.startswith("/") else posixpath.join(root, given))
    # The real path (links followed) is not in the record: the lexical one stands for it.
    return Program(given, path, path, False), True


def _decided(record: CallRecord, root: str) -> tuple[_Decided, ...] | None:
    """A call's actions in their decided canonical form; None when the record is unusable."""
    verdict = record.verdict
    actions = record.actions
    if not isinstance(actions, list) or not actions or not isinstance(verdict, dict):
        return None
    shown = verdict.get("target")
    single = len(actions) == 1 and isinstance(shown, str)
    confined = verdict.get("layer") == CONFINEMENT
    out: list[_Decided] = []
    for entry in actions:
        if not isinstance(entry, dict):
            return None
        act = _ACTS.get(entry.get("act"))  # type: ignore[arg-type]
        raw = entry.get("target")
        canonical = entry.get("canonical")
        if act is None:
            return None
        if act is Act.EXEC:
            if not isinstance(raw, list) or not raw or not all(isinstance(w, str) for w in raw):
                out.append(_Decided(act, repr(raw), confined=True))
                continue
            argv = tuple(raw)
            if single and confined:
                out.append(_Decided(act, str(shown), argv=argv, confined=True))
                continue
            known = canonical if isinstance(canonical, str) else shown if single else None
            program, approximate = _program(argv, known, root)
            target = " ".join((program.path or program.given, *argv[1:]))
            out.append(_Decided(act, target, argv=argv, program=program, root=root,
                                approximate=approximate))
        elif act is Act.READ or act is Act.WRITE:
            if isinstance(canonical, str):
                out.append(_Decided(act, canonical))
            elif entry.get("confined") is True or (single and confined):
                out.append(_Decided(act, str(shown if single else raw), confined=True))
            elif single:
                assert isinstance(shown, str)
                out.append(_Decided(act, shown))
            else:
                path, outside = _lexical_path(raw, root)
                out.append(_Decided(act, path, confined=outside,
                                    approximate=not outside and path != shown))
        else:
            if not isinstance(raw, str):
                out.append(_Decided(act, repr(raw), confined=True))
            else:
                out.append(_Decided(act, raw, confined=single and confined))
    return tuple(out)


def _outcome(record: CallRecord, effect: Effect) -> Outcome:
    if effect is Effect.DENY:
        return "refused"
    if effect is Effect.ALLOW:
        return "allowed"
    decision = record.decision
    kind = decision.get("kind") if isinstance(decision, dict) else None
    if kind == "approve":
        return "approved"
    if kind == "deny":
        return "denied"
    return "pending"


def _shape(record: CallRecord, root: str) -> _Shape | None:
    """What `record` was decided on; None when no policy decided it, or it is unusable."""
    verdict = record.verdict
    if not isinstance(verdict, dict):
        return None
    if _held_by_quota(verdict):
        return None  # a quota decided it, not the rules: counted, never replayed (`replay`)
    before = _EFFECTS.get(verdict.get("effect"))  # type: ignore[arg-type]
    if before is None:
        return None  # refused before the policy (the tool control): no effect to compare
    actions = _decided(record, root)
    if actions is None:
        return None
    reason = verdict.get("reason")
    reason = reason if isinstance(reason, str) else ""
    read_only = verdict.get("mutates") is False or (
        verdict.get("rule") is None and verdict.get("layer") is None
        and reason.endswith(_READ_ONLY_REASON))
    known = "mutates" in verdict or (verdict.get("rule") is None
                                     and verdict.get("layer") is None)
    return _Shape(actions, before, reason, not read_only, known, bool(verdict.get("taint")))


def _held_by_quota(verdict: Mapping[str, Any]) -> bool:
    """Whether a full quota held the call back (its verdict is the limit's, not the rules')."""
    shown = verdict.get("quota")
    return isinstance(shown, list) and any(isinstance(e, dict) and e.get("over") for e in shown)


class _Shapes:
    """Each recorded call's `_Shape`, built once per distinct (actions, verdict, workspace).

    A store's history shares one decoded value among records with equal JSON
    (`call_history(decisions_only=True)`), so the objects' identities are the key; the
    entry keeps both objects alive (an id is only unique while its object lives) and is
    checked against them. Records that share nothing (built one by one) are shaped one by
    one, the same result.
    """

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo: dict[tuple[int, int, str], tuple[object, object, _Shape | None]] = {}

    def of(self, record: CallRecord, root: str) -> _Shape | None:
        actions, verdict = record.actions, record.verdict
        key = (id(actions), id(verdict), root)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is actions and hit[1] is verdict:
            return hit[2]
        shape = _shape(record, root)
        self._memo[key] = (actions, verdict, shape)
        return shape


class _Verdicts:
    """`_shape_verdict` of each shape under one policy, decided once per shape."""

    __slots__ = ("_conditional", "_memo", "_policy")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._conditional = policy.conditional
        # Keyed by the shape's id: every shape outlives this (the calls hold them).
        self._memo: dict[int, tuple[Verdict, _Decided, bool]] = {}

    def of(self, call: _Call) -> tuple[Verdict, _Decided, bool]:
        shape = call.shape
        if self._conditional:
            # Value conditions read each call's own arguments: nothing to share.
            return _shape_verdict(shape, self._policy, call.record.performed_arguments)
        hit = self._memo.get(id(shape))
        if hit is None:
            hit = self._memo[id(shape)] = _shape_verdict(shape, self._policy)
        return hit


def _shape_verdict(shape: _Shape, policy: Policy, arguments: Any = None
                   ) -> tuple[Verdict, _Decided, bool]:
    """The proposed policy's verdict (strictest over the actions, ties: the first).

    `arguments`: what the call was performed with, for a policy with value conditions.
    """
    best: Verdict | None = None
    which = shape.actions[0]
    for action in shape.actions:
        verdict = action.check(policy, shape.mutates, arguments)
        if best is None or verdict.effect > best.effect:
            best, which = verdict, action
            if verdict.effect is Effect.DENY:
                break
    assert best is not None
    approximate = any(a.approximate for a in shape.actions)
    if (policy.conditional and arguments is None and best.rule is not None
            and best.rule.when):
        # The record kept no arguments (a refused call's): the condition was undecidable,
        # so decided the stricter way; the call itself may have fared otherwise.
        approximate = True
    if (not shape.mutates_known and best.rule is None and best.layer is None
            and best.effect is not Effect.DENY and which.act is Act.CALL
            and policy.default_for(Act.CALL) != policy.default_for(Act.CALL, mutates=False)):
        approximate = True
    if shape.tainted and best.effect is Effect.ALLOW:
        # The same protected arguments came from untrusted output: the proposed policy's
        # taint setting decides what an allowed call gets (docs/taint.md).
        effect = Effect.DENY if policy.taint == "deny" else Effect.ASK
        best = Verdict(effect, None, TAINT_LAYER, best.target,
                       f"taint (as recorded); the rules alone would allow it ({best.reason})")
    return best, which, approximate


def agent_paths(runs: Iterable[RunRecord]) -> dict[str, str]:
    """Each run's agent path: its agent's name after its parents' (`planner/coder`).

    A run without a name is `-`; a parent not among `runs` is left out of the path.
    """
    by_id = {r.id: r for r in runs}
    paths: dict[str, str] = {}

    def path(run: RunRecord) -> str:
        known = paths.get(run.id)
        if known is not None:
            return known
        chain: list[str] = []
        seen: set[str] = set()
        current: RunRecord | None = run
        while current is not None and current.id not in seen:
            seen.add(current.id)
            chain.append(current.agent or "-")
            current = by_id.get(current.parent_id) if current.parent_id else None
        paths[run.id] = "/".join(reversed(chain))
        return paths[run.id]

    for run in by_id.values():
        path(run)
    return paths


def _matches_agent(path: str, agent: str | None) -> bool:
    if agent is None:
        return True
    return path == agent or path.rpartition("/")[2] == agent


def _check_agent(agent: str | None) -> None:
    if agent is None:
        return
    if not isinstance(agent, str) or not agent.strip() or len(agent) > _MAX_AGENT:
        raise UserError(f"an agent filter is an agent's name or path (`planner/coder`), "
                        f"1 to {_MAX_AGENT} characters; got {agent!r}")
    if not agent.isprintable():
        raise UserError(f"an agent filter holds printable characters only; got {agent!r}")


def _calls(history: Iterable[tuple[RunRecord, Sequence[CallRecord]]], agent: str | None,
           ) -> tuple[list[_Call], int, int, set[str]]:
    """(prepared calls, undecided count, runs read, agent paths seen)."""
    pairs = list(history)
    paths = agent_paths(run for run, _ in pairs)
    prepared: list[_Call] = []
    undecided = runs = 0
    seen: set[str] = set()
    shapes = _Shapes()
    for run, records in pairs:
        path = paths[run.id]
        seen.add(path)
        if not _matches_agent(path, agent):
            continue
        runs += 1
        root = run.workspace or "/"
        for record in records:
            shape = shapes.of(record, root)
            if shape is None:
                undecided += 1
            else:
                prepared.append(_Call(record, path, shape, _outcome(record, shape.before)))
    return prepared, undecided, runs, seen


@contextlib.contextmanager
def _paused_gc() -> Iterator[None]:
    """The cycle collector paused while a history is built and replayed.

    A history of 100,000 calls is that many records and as many replay entries, all alive
    until the report is made and none in a cycle: each full collection the allocations
    trigger walks them all for nothing (a third of the replay's time, measured on 100,000
    calls). Only the collector's automatic runs pause; it is re-enabled on the way out by
    whoever paused it (a nested or concurrent pause leaves it to the outer one).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _no_such_agent(agent: str, seen: set[str]) -> UserError:
    names = sorted(seen)
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return UserError(f"no recorded run of agent {agent!r} (by name or path); the record has "
                     + (f"runs of: {shown}" if names else "no runs in that window"))


# -- what-if ----------------------------------------------------------------------------


def replay(history: Iterable[tuple[RunRecord, Sequence[CallRecord]]], policy: Policy, *,
           agent: str | None = None) -> WhatIf:
    """Replay recorded calls against `policy`: what flips, call by call.

    A rule with value conditions reads the arguments each call was performed with; a refused
    call's were not kept, so its conditions are undecidable (the stricter verdict) and such
    a flip is `approximate`. Quotas are not replayed: a count depends on what ran before it,
    and in what order, which a replay cannot say. A call a full quota held back is counted
    with the undecided (it cannot flip); a call that ran is judged by the proposed rules.

    Args:
        history: runs with their calls (`Store.call_history` yields these).
        policy: the proposed policy.
        agent: only runs of this agent: its name, or its full path (`planner/coder`).

    Raises:
        UserError: `agent` is malformed, or no run of it is in `history`.
    """
    if not isinstance(policy, Policy):
        raise UserError(f"what-if replays against an hr.Policy, not {type(policy).__name__}")
    _check_agent(agent)
    with _paused_gc():
        return _replay(history, policy, agent)


def _replay(history: Iterable[tuple[RunRecord, Sequence[CallRecord]]], policy: Policy,
            agent: str | None) -> WhatIf:
    prepared, undecided, runs, seen = _calls(history, agent)
    if agent is not None and runs == 0:
        raise _no_such_agent(agent, seen)
    flips: list[Flip] = []
    verdicts = _Verdicts(policy)
    for call in prepared:
        verdict, which, approximate = verdicts.of(call)
        shape = call.shape
        if verdict.effect is shape.before:
            continue
        record = call.record
        flips.append(Flip(
            run_id=record.run_id, call_id=record.call_id, agent=call.agent,
            tool=record.tool or record.model_name, act=which.act.value, target=verdict.target,
            before=shape.before, after=verdict.effect, outcome=call.outcome,
            reason_before=shape.reason_before, reason_after=verdict.reason,
            approximate=approximate))
    return WhatIf(replayed=len(prepared), undecided=undecided, runs=runs, flips=tuple(flips))


def parse_since(since: str | float | dt.timedelta | dt.datetime | None, *,
                now: float | None = None) -> float:
    """The Unix time a `since` filter names (None: 0, everything).

    An age (`7d`, `12h`, `30m`, `90s`, `2w`), an ISO date or date-time (UTC unless it says),
    a timedelta (that long ago), a datetime, or a Unix time.

    Raises:
        UserError: anything else, or a time in the future.
    """
    now = time.time() if now is None else now
    if since is None:
        return 0.0
    if isinstance(since, dt.timedelta):
        if since.total_seconds() <= 0:
            raise UserError(f"--since must reach into the past; got {since}")
        return now - since.total_seconds()
    if isinstance(since, dt.datetime):
        moment = since if since.tzinfo else since.replace(tzinfo=dt.UTC)
        value = moment.timestamp()
    elif isinstance(since, int | float) and not isinstance(since, bool):
        value = float(since)
    elif isinstance(since, str):
        text = since.strip()
        match = _SINCE.fullmatch(text)
        if match:
            amount = int(match.group(1))
            if amount == 0:
                raise UserError(f"--since {since!r} is no time at all: give e.g. 7d, 12h, 30m")
            return now - amount * _UNIT_SECONDS[match.group(2)]
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            raise UserError(
                f"--since {since[:80]!r} is neither an age (7d, 12h, 30m, 90s, 2w) nor an ISO "
                "date (2026-11-30 or 2026-11-30T08:00:00+00:00)") from None
        moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
        value = moment.timestamp()
    else:
        raise UserError(f"since is an age like '7d', a date, a timedelta or a datetime; got "
                        f"{type(since).__name__}")
    if value > now:
        raise UserError(f"--since {since!s:.80} is in the future: nothing was recorded after it")
    return value


async def _history(store: Store, since: float, *, arguments: bool = False,
                   ) -> list[tuple[RunRecord, list[CallRecord]]]:
    """The record since `since`; with each call's performed arguments when `arguments`.

    A policy with value conditions reads them; the decisions alone are cheaper to read.
    """
    from handrail.store.contract import Store as StoreType

    if not isinstance(store, StoreType):
        raise UserError(f"what-if reads an hr.Store, not {type(store).__name__}: "
                        "open one with hr.Store.open(url)")
    history: AsyncIterator[tuple[RunRecord, list[CallRecord]]] = store.call_history(
        since=since, decisions_only=not arguments)
    with _paused_gc():
        return [pair async for pair in history]


async def what_if(store: Store, policy: Policy | str | os.PathLike[str], *,
                  since: str | float | dt.timedelta | dt.datetime | None = None,
                  agent: str | None = None) -> WhatIf:
    """Replay the calls recorded in `store` against a proposed policy (reads, never writes).

    Args:
        store: the run store (`hr.Store.open(url)`).
        policy: the proposed policy, or the path of a policy file.
        since: only runs started since then (`"7d"`, a date...; see `parse_since`).
        agent: only runs of this agent (its name, or its path `planner/coder`).

    Raises:
        UserError: a malformed filter, or no run of `agent`.
        PolicyError: the policy file is invalid.
    """
    if not isinstance(policy, Policy):
        policy = Policy.load(policy)
    _check_agent(agent)
    start = parse_since(since)
    return replay(await _history(store, start, arguments=policy.conditional), policy,
                  agent=agent)


# -- suggest ----------------------------------------------------------------------------


def _escape(pattern: str) -> str:
    """`pattern` with every glob character made literal."""
    if not any(c in pattern for c in "\\*?[]"):
        return pattern  # most targets: no regex pass
    return _GLOB.sub(r"\\\1", pattern)


def _path_pattern(path: str) -> str:
    # A pattern without `/` matches the basename at any depth: a top-level file is anchored.
    escaped = _escape(path)
    return escaped if "/" in path or path == "." else "/" + escaped


def _exec_pattern(action: _Decided) -> str:
    assert action.argv is not None and action.program is not None
    program = action.program
    # A program found on PATH is allowed by the name it was given (an allow by bare name
    # admits only a PATH lookup); any other by the path that ran.
    word = program.given if program.on_path else (program.path or program.given)
    return " ".join(_escape(w) for w in (word, *action.argv[1:]))


def _pattern(action: _Decided) -> str:
    if action.act is Act.READ or action.act is Act.WRITE:
        return _path_pattern(action.target)
    if action.act is Act.EXEC:
        return _exec_pattern(action)
    return _escape(action.target)


def _unique(calls: Iterable[_Call]) -> list[_Shape]:
    """The distinct shapes of `calls`, in first-seen order."""
    return list({id(c.shape): c.shape for c in calls}.values())


def _not_denying(let: Sequence[_Shape], rules: list[Rule]) -> list[Rule]:
    """`rules` without those that would deny an action the record let through.

    A person's denial is denied exactly, but a CALL pattern also covers longer targets
    (`s/t` covers `s/t/x`): denying `s/t` must not refuse an approved `s/t/x`.
    """
    while rules:
        policy = Policy(layers=(Layer(DENIED_LAYER, tuple(rules)),),
                        defaults=dict.fromkeys(("read", "write", "exec", "net", "call",
                                                "call_read_only"), Effect.ALLOW))
        hits = {verdict.rule for shape in let for verdict in [_shape_verdict(shape, policy)[0]]
                if verdict.rule is not None}
        if not hits:
            break
        rules = [r for r in rules if r not in hits]
    return rules


def suggest_from(history: Iterable[tuple[RunRecord, Sequence[CallRecord]]], *,
                 agent: str | None = None) -> Suggestion:
    """The least policy that lets the recorded calls through, from runs and their calls.

    Allows exactly the targets the record shows allowed or approved (layer `suggested`); a
    folder (`dir/*`) only when `GENERALISE_AT` or more of its files were let through with the
    same act and no denied, refused or pending target of that act lies in it (never the
    root). Keeps every deny rule of the recorded runs' policies and the `secrets` layer, and
    denies exactly what a person denied and nothing let through (layer `denied-by-person`);
    asks for everything else (a default stricter than ask, NET's deny, stays). Ask rules are
    dropped: they would ask for what the record shows let through.

    Raises:
        UserError: `agent` is malformed, or no run of it is in `history`; or the record holds
            no call the policy let through (nothing to suggest from).
    """
    _check_agent(agent)
    with _paused_gc():
        return _suggest_from(list(history), agent)


def _suggest_from(pairs: list[tuple[RunRecord, Sequence[CallRecord]]], agent: str | None,
                  ) -> Suggestion:
    prepared, _, runs, seen = _calls(pairs, agent)
    if agent is not None and runs == 0:
        raise _no_such_agent(agent, seen)
    let: list[_Call] = [c for c in prepared if c.outcome in ("allowed", "approved")]
    if not let:
        raise UserError("the record holds no call the policy allowed or a person approved: "
                        "nothing to derive a policy from (run the agent first)")
    # The policies the runs were bound by: their deny rules, defaults and taint.
    bound: list[Policy] = [Policy.default()]
    agent_runs = {c.record.run_id for c in prepared}
    read: set[str] = set()
    for run, _ in pairs:
        if run.id in agent_runs and isinstance(run.policy, Mapping):
            # Runs of one agent mostly share one policy: each distinct one is read once
            # (what is kept of them, denies, strictest defaults, taint, is the same twice).
            text = json.dumps(run.policy, sort_keys=True, default=repr)
            if text in read:
                continue
            read.add(text)
            try:
                bound.append(Policy.from_dict(run.policy, source=f"run {run.id}'s policy"))
            except PolicyError:
                continue  # a policy this handrail cannot read: its denies cannot be kept
    deny_layers: dict[str, dict[Rule, None]] = {}
    for policy in bound:
        for layer in policy.layers:
            for rule in layer.rules:
                if rule.effect is Effect.DENY:
                    deny_layers.setdefault(layer.name, {})[rule] = None
    defaults = dict.fromkeys(("read", "write", "exec", "net", "call", "call_read_only"),
                             Effect.ASK)
    for policy in bound[1:] or bound:
        for key, effect in policy.defaults.items():
            defaults[key] = max(defaults[key], effect)
    taint = "deny" if any(p.taint == "deny" for p in bound[1:]) else "ask"

    let_shapes = _unique(let)
    allowed: dict[tuple[Act, str], None] = {}
    files: dict[tuple[Act, str], set[str]] = {}
    for shape in let_shapes:
        for action in shape.actions:
            if action.confined:
                continue
            allowed[action.act, _pattern(action)] = None
            if action.act in (Act.READ, Act.WRITE) and "/" in action.target:
                folder = action.target.rpartition("/")[0]
                files.setdefault((action.act, folder), set()).add(action.target)
    # Folders that held something not let through are never generalised.
    held_back: set[tuple[Act, str]] = set()
    for shape in _unique(c for c in prepared if c.outcome not in ("allowed", "approved")):
        for action in shape.actions:
            if action.act in (Act.READ, Act.WRITE) and "/" in action.target:
                held_back.add((action.act, action.target.rpartition("/")[0]))
    generalised: list[str] = []
    for (act, folder), members in sorted(files.items(), key=lambda kv: (kv[0][0].value,
                                                                       kv[0][1])):
        if len(members) < GENERALISE_AT or (act, folder) in held_back:
            continue
        glob = _escape(folder) + "/*"
        for member in members:
            allowed.pop((act, _path_pattern(member)), None)
        allowed[act, glob] = None
        generalised.append(f"{act.value}:{glob}")
    rules = tuple(Rule(act, pattern, Effect.ALLOW) for act, pattern in allowed)
    # What a person refused (and nobody let through anywhere in the record) stays refused:
    # denying it exactly is tighter than asking again, and is what the record shows.
    refused: dict[tuple[Act, str], None] = {}
    for shape in _unique(c for c in prepared if c.outcome == "denied"):
        for action in shape.actions:
            denied = (action.act, _pattern(action))
            if not action.confined and denied not in allowed:
                refused[denied] = None
    by_person = _not_denying(let_shapes, [Rule(act, pattern, Effect.DENY)
                                   for act, pattern in refused])
    layers = [Layer(name, tuple(kept)) for name, kept in deny_layers.items()]
    if by_person:
        layers.append(Layer(DENIED_LAYER, tuple(by_person)))
    layers.append(Layer(SUGGESTED_LAYER, rules))
    policy = Policy(layers=tuple(layers), defaults=defaults)
    if taint == "deny":
        policy = policy.with_taint("deny")
    conflicts: list[str] = []
    verdicts = _Verdicts(policy)
    for call in let:
        verdict, which, _ = verdicts.of(call)
        if verdict.effect is Effect.DENY and verdict.layer != TAINT_LAYER:
            conflicts.append(f"{call.record.run_id}:{call.record.call_id} "
                             f"{which.act.value} {which.target} ({verdict.reason})")
    return Suggestion(policy=policy, calls=len(let), runs=runs,
                      generalised=tuple(generalised), conflicts=tuple(conflicts))


async def suggest(store: Store, *, agent: str | None = None,
                  since: str | float | dt.timedelta | dt.datetime | None = None,
                  ) -> Suggestion:
    """The least policy that lets the calls recorded in `store` through (reads, never writes).

    See `suggest_from` for what it allows, keeps and asks.

    Raises:
        UserError: a malformed filter, no run of `agent`, or nothing let through to learn from.
    """
    _check_agent(agent)
    start = parse_since(since)
    return suggest_from(await _history(store, start), agent=agent)
