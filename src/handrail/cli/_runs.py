"""`handrail runs|show|pending|approve|deny|answer|resume|recover|demo`.

The store comes from `--store` (before or after the command), else `HANDRAIL_STORE`, else
`./.handrail/runs.db`. Only `demo` creates a store: every other command says so when none
exists there (a mistyped path must not become an empty store). Commands that continue a run
need its agent: `--agent MODULE:OBJECT`, else `HANDRAIL_AGENT`, else the `agent_ref` the run
recorded (an Agent, or a factory called with the run's record). Deciding never needs the
agent: without one, the decision is recorded and the run waits, READY, for `handrail resume`.

A decision is checked, then recorded, then the run continues. Whatever stops it continuing (an
error, Ctrl-C) leaves the run READY, and the command says so, with the next step, and exits
non-zero. Everything printed that a model or a tool wrote goes through `printable`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from handrail.cli._display import Out, argv_text, printable, printable_json, style, table
from handrail.errors import HandrailError, UserError
from handrail.runs._program import confinement_note, program_of, result_confinement, text_lines

if TYPE_CHECKING:
    from handrail.store import RunRecord, RunStatus, Store

# The store (and asyncio under it) is imported by the commands that open one: `handrail
# --help` and every parser built for another command do without (issue 11).

__all__ = ["add_store_option", "load_object", "register"]

DEFAULT_STORE = os.path.join(".handrail", "runs.db")


def add_store_option(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """Add the one `--store` option: the same before the command and after it.

    `handrail --store X serve` and `handrail serve --store X` mean the same, on every
    command that opens a store.

    SUPPRESS: given only before the command, the top-level value stands (a subcommand's own
    default would silently replace it with another store).
    """
    parser.add_argument("--store", default=argparse.SUPPRESS, help=help_text or (
        "the run store (default: $HANDRAIL_STORE or ./.handrail/runs.db)"))


def _store_path(args: argparse.Namespace) -> str:
    return str(getattr(args, "store", None) or os.environ.get("HANDRAIL_STORE")
               or DEFAULT_STORE)


def _existing_store(args: argparse.Namespace) -> Store:
    """Open the store, which must exist: only `demo` creates one."""
    path = _store_path(args)
    source = ("--store" if getattr(args, "store", None)
              else "$HANDRAIL_STORE" if os.environ.get("HANDRAIL_STORE") else "the default")
    file = path.removeprefix("sqlite://")
    if "://" not in file and not os.path.isfile(os.path.expanduser(file)):
        raise UserError(
            f"no handrail store at {printable(path)} (from {source}): check the path; "
            "this command never creates one (`handrail demo` or an agent's run does)"
        )
    from handrail.store import Store

    return Store.open(path)


_MIN_PREFIX = 4
_PREFIX_SCAN = 1000
"""At most this many ids that start with what was typed are named (and counted)."""


def _unique(text: str, matches: list[str], noun: str) -> str:
    if len(matches) == 1:
        return matches[0]
    from handrail.errors import NotFound

    if not matches:
        raise NotFound(f"no {noun} '{printable(text)}' (and no {noun} id starts with it)")
    shown = ", ".join(printable(m) for m in matches[:5])
    count = f"{len(matches)}" if len(matches) < _PREFIX_SCAN else f"{_PREFIX_SCAN} or more"
    raise UserError(f"{printable(text)} is the start of {count} {noun} ids ({shown}"
                    f"{', ...' if len(matches) > 5 else ''}): give more of the id")


async def run_id(store: Store, text: str) -> str:
    """The run id `text` names: the full id, or a unique prefix of 4 or more characters."""
    from handrail.errors import NotFound

    try:
        return (await store.run(text)).id
    except NotFound:
        if len(text) < _MIN_PREFIX:
            raise
    return _unique(text, await store.run_ids(text, limit=_PREFIX_SCAN), "run")


async def item_id(store: Store, text: str) -> str:
    """The pending item `text` names: the full id, or a unique prefix of an open one's id."""
    from handrail.errors import NotFound

    try:
        return (await store.pending_item(text)).id
    except NotFound:
        if len(text) < _MIN_PREFIX:
            raise
    items = await store.pending()
    return _unique(text, [i.id for i in items if i.id.startswith(text)], "pending item")


def _decider() -> str:
    """Who decides, for the audit trail: the OS user at this host."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def load_object(ref: str) -> Any:
    """Import `module:object` (the current directory is importable)."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"expected MODULE:OBJECT, got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # the user's module failed as it ran (a missing env var, say)
        raise UserError(f"importing {module_name!r} failed: {type(exc).__name__}: "
                        f"{exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def _agent_for(args: argparse.Namespace, run: RunRecord) -> Any:
    from handrail.runs import Agent

    ref = getattr(args, "agent", None) or os.environ.get("HANDRAIL_AGENT") or run.agent_ref
    if not ref:
        return None
    obj = load_object(ref)
    if not isinstance(obj, Agent) and callable(obj):
        try:
            obj = obj(run)
        except HandrailError:
            raise
        except Exception as exc:  # the user's factory: its failure is a clear error, not a trace
            raise UserError(f"{ref} could not build the agent: {type(exc).__name__}: "
                            f"{exc}") from exc
    if not isinstance(obj, Agent):
        raise UserError(f"{ref} is not an hr.Agent (nor a factory returning one)")
    return obj


def _run_async(fn: Callable[[Store], Awaitable[int]], args: argparse.Namespace, *,
               reading: bool = False) -> int:
    """Run `fn` on the store; `reading`: a command that only reads, on a bare asyncio loop.

    The store reads on asyncio alone; `anyio.run` would import anyio's asyncio backend
    (~25 ms) that a listing never uses (issue 11). Commands that continue a run keep anyio.
    """

    async def main() -> int:
        store = _existing_store(args)
        try:
            return await fn(store)
        finally:
            await store.close()

    if reading:
        import asyncio

        return asyncio.run(main())
    import anyio

    return anyio.run(main)


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    delta = time.time() - ts
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"


EXIT_PAUSED = 3
"""The exit code of a command whose run waits for a person again (as `handrail run`)."""


def store_option(args: argparse.Namespace) -> str:
    """` --store PATH` when the store was given on the command line, for printed commands."""
    import shlex

    store = getattr(args, "store", None)
    return f" --store {printable(shlex.quote(str(store)))}" if store else ""


def _when(ts: float) -> str:
    """A time for a person: the UTC date and time, and how long ago."""
    return (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) + f" ({_ago(ts)})")


def _print_outcome(result: Any, args: argparse.Namespace) -> int:
    """How the run ended, the commands that continue it; the exit code (docs/cli.md)."""
    outcome = result.outcome
    out = Out()
    kind = outcome.kind
    run = printable(result.run_id)
    tail = store_option(args)
    code = EXIT_PAUSED
    if kind == "completed":
        out.print(f"{style('green', f'run {run} completed')}: {printable(outcome.output)}")
        code = 0
    elif kind == "awaiting_approval":
        rid = printable(outcome.request_id)
        out.print(style("yellow", f"run {run} waits for approval {rid}") + "; decide with:")
        out.print(f"  handrail approve {rid}{tail}")
        out.print(f"  handrail deny {rid} --reason 'not now'{tail}")
    elif kind == "awaiting_answer":
        qid = printable(outcome.question_id)
        out.print(style("yellow", f"run {run} waits for an answer to {qid}") + "; answer with:")
        out.print(f"  handrail answer {qid} 'your answer'{tail}")
    elif kind == "awaiting_recovery":
        cid = printable(outcome.call_id)
        out.print(style("yellow", f"run {run}: call {cid} was in flight when its process "
                                  "died; it may or may not have acted. Decide with one of:"))
        out.print(f"  handrail recover {cid} --retry{tail}")
        out.print(f"  handrail recover {cid} --completed 'what it did'{tail}")
        out.print(f"  handrail recover {cid} --abort{tail}")
        out.print("(--retry runs it again, --completed says it happened and gives the model "
                  "that result, --abort gives up on it)")
    elif kind == "failed":
        out.print(f"{style('red', f'run {run} failed')}: {printable(outcome.error)}")
        code = 1
    else:
        out.print(f"run {run} {kind}: {printable(getattr(outcome, 'reason', ''))}")
        code = 1
    out.flush()
    return code


def _status_text(run: RunRecord) -> str:
    """The run's status as a person should read it (a dead owner's run is not running)."""
    from handrail.store import RunStatus
    from handrail.store.contract import is_owner_alive, owner_is_on_this_host

    if run.status is RunStatus.READY:
        last = run.events[-1] if run.events else {}
        if last.get("kind") == "interrupted":
            return f"ready ({_interruption(last)}; resume continues it)"
        return "ready (decided, not yet continued)"
    verification = (run.outcome or {}).get("verification")
    if run.status is RunStatus.FAILED and isinstance(verification, dict):
        tried = len(verification.get("attempts") or ())
        return f"failed verification ({tried} attempt{'s' if tried != 1 else ''})"
    if run.status is RunStatus.RUNNING and run.owner and owner_is_on_this_host(run.owner) \
            and not is_owner_alive(run.owner):
        return "stopped (its process is gone; resume continues it)"
    return str(run.status.value)


def _interruption(event: dict[str, Any]) -> str:
    """What stopped a run, from its `interrupted` event: Ctrl-C, a cancellation, an error."""
    error = str(event.get("error") or "")
    if error.startswith("KeyboardInterrupt"):
        return "interrupted by Ctrl-C"
    if error.startswith(("CancelledError", "Cancelled")):
        return "cancelled"
    return "stopped on an error"


def _stopped(run: RunRecord, now: float) -> bool:
    """Whether a RUNNING run's process is gone (on this host), or its lease has lapsed."""
    from handrail.store.contract import is_owner_alive, owner_is_on_this_host

    if not run.owner:
        return True
    if owner_is_on_this_host(run.owner):
        return not is_owner_alive(run.owner)
    return run.lease_until < now


# ------------------------------------------------------------------ queries


def _cmd_runs(args: argparse.Namespace) -> int:
    async def go(store: Store) -> int:
        from handrail.store import RunStatus

        status = RunStatus(args.status) if args.status else None
        # One more than asked: a listing says when there are more (one more run decoded).
        runs = await _roots(store, args.limit + 1, status)
        more = len(runs) > args.limit
        runs = runs[:args.limit]
        sizes = [await _tree_size(store, r) for r in runs]
        if args.json:
            _json_list({**_run_json(r), "sub_agent_runs": n}
                       for r, n in zip(runs, sizes, strict=True))
            return 0
        out = Out()
        if not runs:
            out.print(f"no {args.status + ' ' if args.status else ''}runs in this store")
        else:
            # Ids in full, never cut: they are what the other commands take.
            for line in table(("run", "status", "agent", "task", "steps", "sub-agents",
                               "started"),
                              [(printable(r.id), _status_text(r), printable(r.agent or "-"),
                                _short(r.task, 50), str(r.steps), str(n) if n else "-",
                                _ago(r.created_at))
                               for r, n in zip(runs, sizes, strict=True)]):
                out.print(line)
        if more:
            out.print(f"\nthe newest {len(runs):,} shown, and there are more: "
                      "`handrail runs --limit N` lists N")
        out.flush()
        return 0

    return _run_async(go, args, reading=True)


def _json_list(items: Iterable[Any]) -> None:
    """`json.dumps(list(items), indent=2)`, the same text, written as each item is ready.

    A script reading `--json` of 1,000 items starts at once, and memory holds one item's
    text at a time.
    """
    write = sys.stdout.write
    first = True
    for item in items:
        text = json.dumps(item, indent=2)
        write(("[\n  " if first else ",\n  ") + text.replace("\n", "\n  "))
        first = False
    write("[]\n" if first else "\n]\n")


async def _roots(store: Store, limit: int, status: RunStatus | None) -> list[RunRecord]:
    """The newest `limit` runs that are not a sub-agent's (a tree is listed by its root)."""
    asked = limit
    while True:
        runs = await store.runs(limit=asked, status=status)
        roots = [r for r in runs if r.parent_id is None or r.depth == 0]
        if len(roots) >= limit or len(runs) < asked:
            return roots[:limit]
        asked *= 4


async def _tree_size(store: Store, run: RunRecord, depth: int = 0) -> int:
    """How many sub-agent runs the tree under `run` holds (bounded: a tree is shallow)."""
    from handrail.runs import sub_runs

    if depth > 16 or not any(e.get("kind") == "delegated" for e in run.events):
        return 0
    children = await sub_runs(store, run)
    return sum([1 + await _tree_size(store, c, depth + 1) for c in children.values()])


def _run_json(r: RunRecord) -> dict[str, Any]:
    return {"id": r.id, "status": r.status.value, "agent": r.agent, "task": r.task,
            "steps": r.steps, "created_at": r.created_at, "outcome": r.outcome,
            "manifest_digest": r.manifest_digest, "model": r.model,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
            "parent_id": r.parent_id, "parent_call_id": r.parent_call_id, "depth": r.depth}


def _short(text: object, width: int) -> str:
    """Whitespace folded, cut to `width` characters, then made printable."""
    folded = " ".join(str(text).split())
    return printable(_cut(folded, width))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cmd_show(args: argparse.Namespace) -> int:
    async def go(store: Store) -> int:
        from handrail.runs import thread

        run = await store.run(await run_id(store, args.run))
        calls = await store.calls(run.id)
        messages = await store.messages(run.id)
        # A conversation's run holds the whole history; its earlier turns' calls belong to
        # the runs before it in the thread.
        runs = await thread(store, run)
        earlier = runs[:[r.id for r in runs].index(run.id)]
        for r in earlier:
            calls = [*await store.calls(r.id), *calls]
        # What other processes recorded about the run: each delivery attempt of a
        # notification of its items, printed under the call that waited.
        events = await store.run_events(run.id)
        deliveries: dict[str, list[str]] = {}
        for r in earlier:
            for event in await store.run_events(r.id):
                _add_delivery(deliveries, event)
        for event in events:
            _add_delivery(deliveries, event)
        if args.json:
            print(json.dumps({"run": _run_json(run), "events": events, "messages": messages,
                              "calls": [_call_json(c) for c in calls],
                              "sub_agents": await _sub_agents_json(store, run, calls),
                              "verifications": [e for e in run.events
                                                if e.get("kind") == "verification"],
                              "conversation": [r.id for r in runs]}, indent=2))
            return 0
        out = Out()
        out.print(f"{style('bold', f'run {printable(run.id)}')} — {_status_text(run)} — agent "
                  f"{printable(run.agent or '-')} — model {printable(run.model or '-')}")
        out.print(f"task: {printable(run.task)}")
        if run.created_at:
            out.print(f"started: {_when(run.created_at)}"
                      + (f"; last change {_when(run.updated_at)}"
                         if run.updated_at and run.updated_at - run.created_at >= 1 else ""))
        if len(runs) > 1:
            out.print("conversation: " + " -> ".join(
                f"{style('bold', printable(r.id))} (this)" if r.id == run.id else
                f"{printable(r.id)} ({printable(r.status.value)})" for r in runs))
        if run.manifest_digest:
            out.print(f"manifest: {printable(run.manifest_digest)}")
        out.print(f"tokens: {run.input_tokens} in / {run.output_tokens} out over "
                  f"{run.model_requests} requests")
        # The disk record of each call, when the run kept one (Agent(records_dir=...)).
        records = next((e.get("dir") for e in run.events if e.get("kind") == "records"), None)
        by_turn: dict[int, list[Any]] = {}
        for c in calls:
            by_turn.setdefault(c.turn, []).append(c)
        if run.parent_id is not None:
            out.print(f"sub-agent of run {printable(run.parent_id)} (call "
                      f"{printable(run.parent_call_id)}, depth {run.depth})")
        children = await _children(store, run, calls)
        checks: dict[int, list[dict[str, Any]]] = {}
        for event in run.events:
            if event.get("kind") == "verify":
                out.print(f"verified by: {printable_json(event.get('check'))}, at "
                          f"most {printable(event.get('max_attempts'))} attempts")
            elif event.get("kind") == "verification" and isinstance(event.get("turn"), int):
                checks.setdefault(event["turn"], []).append(event)
        limit = next((e.get("max_attempts") for e in run.events if e.get("kind") == "verify"),
                     "?")
        turn = -1
        for m in messages:
            kind = m.get("kind")
            if kind == "assistant":
                turn += 1
                text = "".join(p.get("text", "") for p in m["parts"] if p["kind"] == "text")
                if text:
                    out.print(f"\n{style('cyan', 'model')} {_short(text, 200)}")
                for c in by_turn.get(turn, []):
                    _print_call(out, c)
                    for line in await _waiting_quotas(store, run, c):
                        out.print(f"    quota: {printable(line)}")
                    for line in deliveries.pop(str(c.pending_id), [])[-MAX_DELIVERIES:]:
                        out.print(f"    {style('dim', printable(line))}")
                    child = children.get(c.call_id) if c.run_id == run.id else None
                    if child is not None:
                        await _print_sub_agent(store, out, child, "      ")
                    if records is not None:
                        # Lazily: `handrail show` without records never loads the tool core.
                        from handrail.host import record_dir

                        path = record_dir(records, run.id, c.turn, c.call_id)
                        out.print(f"    record: {printable(path)}")
                for event in checks.get(turn, []):
                    _print_verification(out, event, limit)
            elif kind == "user":
                out.print(f"{style('magenta', 'user')} {_short(m['text'], 200)}")
        for item_id, lines in deliveries.items():  # an item whose call is not shown
            out.print(f"\nnotifications of {printable(item_id)}:")
            for line in lines[-MAX_DELIVERIES:]:
                out.print(f"    {style('dim', printable(line))}")
        for event in run.events:
            if event.get("kind") == "interrupted":
                out.print(f"\n{style('red', _interruption(event))}: "
                          f"{printable(event.get('error'))}")
        if run.outcome:
            out.print(f"\noutcome: {printable_json(run.outcome)}")
        out.flush()
        return 0

    return _run_async(go, args, reading=True)


async def _waiting_quotas(store: Store, run: RunRecord, c: Any) -> list[str]:
    """For a call waiting for its approval, each quota it falls under and the count now.

    A call's own quota entries are written when it starts (or when a quota held it: then
    `_print_call` shows those).
    """
    from handrail.errors import NotFound
    from handrail.policy import quota_lines
    from handrail.runs._standing import quota_standing

    if c.status.value != "awaiting_approval" or not c.pending_id or quota_lines(c.verdict) \
            or c.run_id != run.id:
        return []
    try:
        item = await store.pending_item(str(c.pending_id))
    except NotFound:
        return []
    if item.kind != "approval" or item.state != "open":
        return []
    return await quota_standing(store, run, item.payload)


MAX_DELIVERIES = 20
"""The most recent delivery attempts `handrail show` prints for one pending item."""


def _add_delivery(deliveries: dict[str, list[str]], event: dict[str, Any]) -> None:
    from handrail.approval._notify import delivery_text

    line = delivery_text(event)
    if line is not None:
        deliveries.setdefault(str(event.get("item")), []).append(line)


def _print_verification(out: Out, event: dict[str, Any], limit: object) -> None:
    """One check of a final answer: passed or failed, why, and the end of its output."""
    verdict = style("green", "passed") if event.get("passed") else style("red", "failed")
    line = (f"  {style('bold', 'verification')} {printable(event.get('attempt'))}/"
            f"{printable(limit)}: {verdict}")
    if event.get("reason"):
        line += f" — {_short(event['reason'], 200)}"
    out.print(line)
    if event.get("output"):
        out.print(f"    output: {_short(event['output'], 200)}")


def _call_json(c: Any) -> dict[str, Any]:
    return {"id": c.id, "turn": c.turn, "tool": c.tool, "model_name": c.model_name,
            "status": c.status.value, "arguments_digest": c.arguments_digest,
            "actions": c.actions, "verdict": c.verdict, "decision": c.decision,
            "decided_by": c.decided_by, "result": c.result, "disposition": c.disposition,
            "error": c.error, "pending_id": c.pending_id}


def _target_text(target: Any) -> str:
    """A call's target: a path or host as printable text, an argv as the quoted list it is."""
    return argv_text(target) if isinstance(target, list | tuple) else printable(target)


async def _children(store: Store, run: RunRecord, calls: list[Any]) -> dict[str, RunRecord]:
    from handrail.runs import sub_runs

    return await sub_runs(store, run, [c for c in calls if c.run_id == run.id])


async def _print_sub_agent(store: Store, out: Out, run: RunRecord, indent: str,
                           depth: int = 0) -> None:
    """A sub-agent's run under the call that delegated to it: its calls, indented."""
    agent = printable(run.agent or "-")
    out.print(f"{indent}{style('bold', f'sub-agent {agent}')} — run {printable(run.id)} — "
              f"{_status_text(run)} — {run.steps} steps")
    calls = await store.calls(run.id)
    children = await _children(store, run, calls) if depth < 16 else {}
    for c in calls:
        _print_call(out, c, indent)
        if c.call_id in children:
            await _print_sub_agent(store, out, children[c.call_id], indent + "      ",
                                   depth + 1)
    if run.outcome:
        out.print(f"{indent}outcome: {printable_json(run.outcome)}")


async def _sub_agents_json(store: Store, run: RunRecord, calls: list[Any],
                           depth: int = 0) -> list[dict[str, Any]]:
    children = await _children(store, run, calls) if depth < 16 else {}
    out = []
    for child in children.values():
        child_calls = await store.calls(child.id)
        out.append({"run": _run_json(child), "calls": [_call_json(c) for c in child_calls],
                    "sub_agents": await _sub_agents_json(store, child, child_calls,
                                                         depth + 1)})
    return out


_EFFECT_STYLE = {"allow": "green", "ask": "yellow", "deny": "red"}


def _print_call(out: Out, c: Any, indent: str = "") -> None:
    verdict = c.verdict or {}
    effect = str(verdict.get("effect", "-"))
    actions = ", ".join(f"{printable(a['act'])} {_target_text(a['target'])}"
                        for a in c.actions) or "-"
    out.print(f"{indent}  {style('bold', printable(c.tool or c.model_name))} "
              f"({printable(c.id)}) → {actions}")
    out.print(f"{indent}    verdict: {style(_EFFECT_STYLE.get(effect, 'white'), printable(effect))}"
              f" — {printable(verdict.get('reason', c.error or '-'))}")
    from handrail.policy import quota_lines  # here: building the parser imports no policy

    for line in quota_lines(verdict):
        out.print(f"{indent}    quota: {printable(line)}")
    if c.decision:
        out.print(f"{indent}    decision: {printable(c.decision.get('kind'))} by "
                  f"{printable(c.decided_by)}")
    result = c.result or {}
    program = program_of(result)
    exited = ""
    if program is not None:
        exited = (" — timed out" if program["timed_out"] else
                  f" — exit code {printable(program['exit_code'])}")
    out.print(f"{indent}    status: {printable(c.status.value)}{exited}"
              + (f" ({printable(c.disposition)})" if c.disposition else ""))
    note = confinement_note(result_confinement(result))
    if note:
        out.print(f"{indent}    {style('bold red', 'sandbox')}: {printable(note)}")
    if program is not None:
        if program["note"]:
            out.print(f"{indent}    note: {printable(program['note'])}")
        for name in ("stdout", "stderr"):
            if program[name].strip():
                out.print(f"{indent}    {name}:")
                _print_lines(out, program[name], f"{indent}      ")
        return
    content: Any = result.get("content")
    if not isinstance(content, list):
        content = []
    texts = [str(i.get("text", "")) for i in content
             if isinstance(i, dict) and i.get("kind") == "text"]
    text = "\n".join(t for t in texts if t)
    if "\n" not in text.strip() and len(text) <= 120:
        if text.strip():  # one short line: beside its label
            out.print(f"{indent}    result: {printable(text.strip())}")
    else:
        out.print(f"{indent}    result:")
        _print_lines(out, text, f"{indent}      ")


def _print_lines(out: Out, text: str, indent: str) -> None:
    """A tool's or a program's text as the lines it is: each escaped, the whole bounded."""
    for line in text_lines(text):
        out.print(f"{indent}{printable(line)}")


PENDING_PAGE = 50
"""How many open items `handrail pending` shows a person unless told (`--limit N`, `--all`)."""
_READY_SHOWN = 20
"""How many ready runs `handrail pending` names after the items (the newest)."""
_RUNNING_READ = 200
"""How many running runs `handrail pending` reads to find those whose process is gone."""


def _cmd_pending(args: argparse.Namespace) -> int:
    async def go(store: Store) -> int:
        # A script gets every item unless it asks for fewer; a person gets a page (1,000 open
        # items are not read on a terminal) and is told how to see the rest. A page is all
        # that is read of the store.
        limit = None if args.all else args.limit if args.limit is not None else \
            None if args.json else PENDING_PAGE
        if limit is None:
            shown = await store.pending(kind=args.kind, agent=args.agent_name, tool=args.tool)
            total = len(shown)
        else:
            shown, total = await store.pending_page(limit, kind=args.kind,
                                                    agent=args.agent_name, tool=args.tool)
        if args.json:
            _json_list({"id": p.id, "kind": p.kind, "run_id": p.run_id, "tool": p.tool,
                        "agent": p.agent, "payload": p.payload, "created_at": p.created_at,
                        "approvals_needed": p.approvals_needed,
                        "approvals": [a.get("by") for a in p.approvals],
                        "deadline": p.deadline}
                       for p in shown)
            return 0
        out = Out()
        for p in shown:
            _print_item(out, p)
        if len(shown) < total:
            out.print(f"\n{len(shown):,} of {total:,} open items shown, oldest first: "
                      "`handrail pending --all` lists every one (`--limit N` the first N, "
                      "`--json` every one for a script)")
        # Runs that wait for nobody but a `resume` (decided, stopped on an error or Ctrl-C,
        # or whose process is gone): said, so "nothing is pending" never hides a run that has
        # not finished.
        from handrail.store import RunStatus

        ready = await store.runs(status=RunStatus.READY, limit=_READY_SHOWN + 1)
        now = time.time()
        running = await store.runs(status=RunStatus.RUNNING, limit=_RUNNING_READ)
        stopped = [r for r in running if _stopped(r, now)]
        waiting = [*stopped, *ready][:_READY_SHOWN]
        if not total:
            out.print("nothing is pending" if not waiting else
                      "nothing waits for a person, but these runs have not finished:")
        tail = store_option(args)
        for run in waiting:
            state = _status_text(run) if run.status is RunStatus.READY else \
                "stopped (its process is gone, or its lease lapsed; resume continues it)"
            out.print(f"run {printable(run.id)} is {state}: "
                      f"`handrail resume {printable(run.id)}{tail}`")
        if len(stopped) + len(ready) > _READY_SHOWN:
            out.print(f"more runs wait for a resume than these {_READY_SHOWN}: handrail runs "
                      "--status ready (and --status running)")
        out.flush()
        return 0

    return _run_async(go, args, reading=True)


def _print_item(out: Out, p: Any) -> None:
    """One open item: who asks for what, and why, as a person decides it."""
    out.print(f"{style('bold', printable(p.id))} {printable(p.kind)} — run "
              f"{printable(p.run_id)} — tool {printable(p.tool)} — {_ago(p.created_at)}")
    payload = p.payload
    path = payload.get("agent_path")
    if isinstance(path, list) and path:
        # Who asks, from the root of the tree (the root's agent decides it).
        out.print("    agent: " + " / ".join(printable(str(a)) for a in path))
    if p.kind == "approval":
        actions = payload.get("actions") or [
            {"act": payload.get("act"), "target": payload.get("target")}]
        for action in actions:
            out.print(f"    {printable(action.get('act'))} "
                      f"{_target_text(action.get('target'))}")
        out.print(f"    why: {printable(payload.get('verdict_reason', ''))}")
        out.print(f"    arguments: {_cut(printable_json(payload.get('arguments')), 200)}")
        for taint in payload.get("taint") or ():
            out.print(
                f"    tainted: {printable_json(taint.get('pointer'))} = "
                f"{_cut(printable_json(taint.get('value')), 120)} from call "
                f"{printable_json(taint.get('source_call'))} "
                f"({printable_json(taint.get('source_tool'))})")
        if getattr(p, "approvals_needed", 1) > 1:
            by = ", ".join(printable(str(a.get("by"))) for a in p.approvals)
            out.print(f"    approvals: {len(p.approvals)} of {p.approvals_needed}"
                      + (f" (by {by}; another person must approve)" if by else ""))
        if getattr(p, "deadline", None):
            kind = printable(str((p.on_expiry or {}).get("kind", "deny")))
            out.print(f"    deadline: {kind} by default at "
                      + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(p.deadline)))
    elif p.kind == "question":
        out.print(f"    asks: {printable(payload.get('question') or payload.get('message'))}")
        if payload.get("choices"):
            out.print("    choices: " + argv_text(payload["choices"]))
    else:
        if payload.get("tool_missing"):
            out.print(f"    {style('red', 'its tool is not in the agent that resumed it')}: "
                      "retry needs an agent that has it")
        started = payload.get("started_at")
        out.print("    in doubt: started "
                  f"{_when(started) if isinstance(started, int | float) else 'at an unknown time'}"
                  ", in flight when its process died; it may or may not have acted")
        out.print(f"    arguments: {_cut(printable_json(payload.get('arguments')), 200)}")


# ---------------------------------------------------------------- decisions


def _decide_then_resume(args: argparse.Namespace, kind: str, decision: dict[str, Any]) -> int:
    """Check, record, continue; whatever stops the run continuing is said, with the next step."""
    from handrail.runs import check_resumable, record_decision, resume, tree_of, wrong_kind

    decided_by = args.decided_by or _decider()
    state: dict[str, Any] = {}

    async def go(store: Store) -> int:
        args.id = await item_id(store, args.id)
        item = await store.pending_item(args.id)
        if item.kind != kind:
            raise wrong_kind(item, kind)
        if item.state != "open":
            # Said before the agent is rebuilt: a finished run's agent may not build any more
            # (the demo's workspace is gone), and "already decided" is the truth either way.
            from handrail.errors import AlreadyDecided

            raise AlreadyDecided(f"{item.kind} {item.id} was already decided by "
                                 f"{printable(item.decided_by or 'someone')}; nothing was "
                                 "recorded")
        run = await store.run(item.run_id)
        state["run"] = run.id
        owner = None
        try:
            agent = None if args.no_resume else _agent_for(args, run)
            if agent is not None:
                # A sub-agent's item: its tree continues from the root, with the root's agent
                # (a sub-agent's run records its root's ref); the item's agent checks it.
                run, owner = await tree_of(store, run, agent)
                state["run"] = run.id
                check_resumable(run, agent, False)
        except HandrailError as exc:
            raise UserError(f"{exc} — nothing was recorded; fix the agent, or record the "
                            "decision alone with --no-resume") from exc
        counted = await record_decision(store, args.id, kind, decision, decided_by,
                                        agent=owner)
        state["recorded"] = True
        if counted.state == "open":
            # Four-eyes: one approval counted; the run is not resumed (it would only pause).
            out = Out()
            by = ", ".join(printable(str(a.get("by"))) for a in counted.approvals)
            out.print(f"approval {len(counted.approvals)} of {counted.approvals_needed} "
                      f"counted (by {by}); {printable(counted.id)} waits for another person's "
                      f"approval (the same person twice counts once)")
            out.flush()
            return 0
        if agent is None:
            after = await store.run(run.id)
            out = Out()
            from handrail.store import RunStatus

            if any(isinstance(e, dict) and e.get("kind") == "mcp_session"
                   for e in after.events):  # an MCP client's call (`handrail serve`)
                out.print(f"recorded (by {printable(decided_by)}); the MCP client's call goes "
                          "on by itself: at once if it is still waiting, else when its client "
                          "makes the same call again")
            elif after.status is RunStatus.READY and served_by_workers(store):
                out.print(f"recorded (by {printable(decided_by)}); run {printable(run.id)} is "
                          "ready: a worker (`handrail worker`) serving this store continues "
                          "it")
            elif after.status is RunStatus.READY:
                out.print(f"recorded (by {printable(decided_by)}); run {printable(run.id)} is "
                          "ready; continue it with:")
                out.print(f"  handrail resume {printable(run.id)}{_agent_option(args, run)}"
                          f"{store_option(args)}")
            else:  # another of its items is still open
                out.print(f"recorded (by {printable(decided_by)}); run {printable(run.id)} "
                          f"still waits: {_status_text(after)} — see `handrail pending"
                          f"{store_option(args)}`")
            out.flush()
            return 0
        result = await resume(store, run.id, agent=agent)
        return _print_outcome(result, args)

    try:
        return _run_async(go, args)
    except (Exception, KeyboardInterrupt) as exc:
        if not state.get("recorded"):
            raise
        _say_ready(state["run"], exc,
                   f"the decision was recorded (by {printable(decided_by)}), but ",
                   store_option(args))
        return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _cmd_approve(args: argparse.Namespace) -> int:
    from handrail.approval import Decision

    decision = Decision.approve(remember=tuple(args.remember or ()))
    return _decide_then_resume(args, "approval", decision.to_dict())


def _cmd_deny(args: argparse.Namespace) -> int:
    from handrail.approval import Decision

    decision = Decision.deny(args.reason)
    return _decide_then_resume(args, "approval", decision.to_dict())


def _cmd_answer(args: argparse.Namespace) -> int:
    return _decide_then_resume(args, "question", {"answer": args.text})


def _cmd_recover(args: argparse.Namespace) -> int:
    from handrail.runs import Recovery

    if args.retry:
        recovery = Recovery.retry()
    elif args.abort:
        recovery = Recovery.abort()
    else:
        recovery = Recovery.completed(args.completed)
    args.id = args.call
    return _decide_then_resume(args, "recovery", recovery.to_dict())


def _cmd_resume(args: argparse.Namespace) -> int:
    from handrail.errors import ResumeRefused
    from handrail.runs import resume

    started: list[str] = []

    async def go(store: Store) -> int:
        run = await store.run(await run_id(store, args.run))
        agent = _agent_for(args, run)
        if agent is None:
            raise UserError(f"run {run.id} recorded no agent reference: pass --agent "
                            "MODULE:OBJECT (or set HANDRAIL_AGENT)")
        started.append(run.id)
        result = await resume(store, run.id, agent=agent,
                              allow_manifest_change=args.allow_manifest_change)
        return _print_outcome(result, args)

    try:
        return _run_async(go, args)
    except ResumeRefused:
        raise
    except (Exception, KeyboardInterrupt) as exc:
        if not started:
            raise
        _say_ready(started[0], exc, "", store_option(args))
        return 130 if isinstance(exc, KeyboardInterrupt) else 1


def served_by_workers(store: Store) -> bool:
    """Whether `handrail worker` processes continue this store's runs (PostgreSQL)."""
    return callable(getattr(store, "claim_ready", None))


def _agent_option(args: argparse.Namespace, run: RunRecord) -> str:
    """` --agent REF` for a printed `handrail resume`, when the run's record does not say it."""
    import shlex

    given = getattr(args, "agent", None)
    if given:
        return f" --agent {printable(shlex.quote(given))}"
    if run.agent_ref or os.environ.get("HANDRAIL_AGENT"):
        return ""
    return " --agent MODULE:OBJECT   (the run recorded no agent: name the one that builds it)"


def _say_ready(run_id: str, exc: BaseException, recorded: str, tail: str = "") -> None:
    """Tell the person the run did not continue, that it is READY, and what to do next."""
    what = ("interrupted" if isinstance(exc, KeyboardInterrupt)
            else str(exc) if isinstance(exc, HandrailError) else f"{type(exc).__name__}: {exc}")
    print(f"handrail: {recorded}run {run_id} could not continue: {printable(what)}\n"
          f"handrail: run {run_id} is ready; fix that, then continue it with: "
          f"`handrail resume {run_id}{tail}`", file=sys.stderr)


def _cmd_demo(args: argparse.Namespace) -> int:
    from handrail.cli._demo import run_demo

    return run_demo(_store_path(args), keep=args.keep)


# ----------------------------------------------------------------- parsers

RUN_STATUSES = ("running", "awaiting_approval", "awaiting_answer", "awaiting_recovery",
                "completed", "failed", "cancelled", "ready")
"""`RunStatus`'s values, for `runs --status` without importing the store (a test pins them)."""


def _positive(text: str) -> int:
    """`--limit`'s value: a count of 1 or more (SQL reads `LIMIT -1` as no limit at all)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return value


def register(sub: Any) -> None:
    """Add the run commands to the `handrail` parser."""
    store_help = "the run store (default: $HANDRAIL_STORE or ./.handrail/runs.db)"

    def add(name: str, help_text: str, func: Callable[[argparse.Namespace], int],
            agent: bool = False, decides: bool = False) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                         description=help_text)
        add_store_option(parser, store_help)
        if agent:
            parser.add_argument("--agent", metavar="MODULE:OBJECT",
                                help="the agent that continues the run (default: "
                                     "$HANDRAIL_AGENT, else the one the run recorded)")
        if decides:
            parser.add_argument("--as", dest="decided_by", metavar="NAME",
                                help="who decides, kept in the audit trail (default: "
                                     "USER@HOST)")
        parser.set_defaults(func=func)
        return parser

    p = add("demo", "run the offline demo: reads, a denied secret, a deferred write", _cmd_demo)
    p.add_argument("--keep", action="store_true",
                   help="keep the demo's temporary workspace (default: removed at exit; the "
                        "run stays readable in the store)")
    p = add("runs", "list runs, newest first", _cmd_runs)
    p.add_argument("--status", choices=RUN_STATUSES,
                   help="only runs in this status")
    p.add_argument("--limit", type=_positive, default=50, metavar="N",
                   help="at most N runs (default 50)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = add("show", "a run's timeline: each call, verdict, decision and result", _cmd_show)
    p.add_argument("run", help="the run: its id, or a unique prefix of 4 or more characters")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = add("pending", "approvals, questions and recoveries waiting for a person",
            _cmd_pending)
    p.add_argument("--kind", choices=["approval", "question", "recovery"],
                   help="only items of this kind")
    p.add_argument("--agent-name", dest="agent_name", help="only this agent's")
    p.add_argument("--tool", help="only this tool's (server/name)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: every item (unless --limit), written as it "
                        "is read")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=_positive, metavar="N",
                       help=f"at most N items, oldest first (default: {PENDING_PAGE} on a "
                            "listing, every one with --json)")
    shown.add_argument("--all", action="store_true", help="every open item")
    p = add("approve", "approve a deferred action and continue its run", _cmd_approve, True, True)
    p.add_argument("id", help="the approval request's id (or a unique prefix of 4 or more "
                              "characters)")
    p.add_argument("--remember", action="append", metavar="PATTERN",
                   help="also allow this pattern (same act) for the rest of the run")
    p.add_argument("--no-resume", action="store_true", help="record only; resume later")
    p = add("deny", "deny a deferred action; the model reads the reason", _cmd_deny, True, True)
    p.add_argument("id", help="the approval request's id (or a unique prefix of 4 or more "
                              "characters)")
    p.add_argument("--reason", required=True, help="why; the model reads it")
    p.add_argument("--no-resume", action="store_true", help="record only; resume later")
    p = add("answer", "answer a tool's question and continue its run", _cmd_answer, True, True)
    p.add_argument("id", help="the question's id (or a unique prefix of 4 or more characters)")
    p.add_argument("text", help="the answer (it authorises nothing: the call still passes "
                                "the policy)")
    p.add_argument("--no-resume", action="store_true", help="record only; resume later")
    p = add("resume", "continue a paused, cancelled or crashed run", _cmd_resume, True)
    p.add_argument("run", help="the run: its id, or a unique prefix of 4 or more characters")
    p.add_argument("--allow-manifest-change", action="store_true",
                   help="resume under a manifest other than the one the run started with")
    p = add("recover", "decide a call that was in flight at a crash", _cmd_recover, True, True)
    p.add_argument("call", help="the in-doubt call's pending id (or a unique prefix of 4 or "
                                "more characters)")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--retry", action="store_true", help="run it again")
    group.add_argument("--completed", metavar="TEXT", help="it happened; TEXT is its result")
    group.add_argument("--abort", action="store_true", help="give up on it")
    p.add_argument("--no-resume", action="store_true", help="record only; resume later")


