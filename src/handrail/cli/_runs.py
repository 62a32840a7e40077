"""`handrail runs|show|pending|approve|deny|answer|resume|recover|demo`.

The store comes from `--store`, else `HANDRAIL_STORE`, else `./.handrail/runs.db`. Commands
that continue a run need its agent: `--agent MODULE:OBJECT`, else `HANDRAIL_AGENT`, else the
`agent_ref` the run recorded (an Agent, or a factory called with the run's record). Deciding
never needs the agent: without one, the decision is recorded and the run waits for
`handrail resume`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from handrail.errors import UserError
from handrail.host import record_dir
from handrail.store import RunRecord, Store

__all__ = ["load_object", "register"]

DEFAULT_STORE = os.path.join(".handrail", "runs.db")


def _store_path(args: argparse.Namespace) -> str:
    return str(args.store or os.environ.get("HANDRAIL_STORE") or DEFAULT_STORE)


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
        obj = obj(run)
    if not isinstance(obj, Agent):
        raise UserError(f"{ref} is not an hr.Agent (nor a factory returning one)")
    return obj


def _run_async(fn: Callable[[Store], Awaitable[int]], args: argparse.Namespace) -> int:
    async def main() -> int:
        store = Store.open(_store_path(args))
        try:
            return await fn(store)
        finally:
            await store.close()

    return anyio.run(main)


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    delta = time.time() - ts
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"


def _print_outcome(result: Any) -> None:
    outcome = result.outcome
    console = _console()
    kind = outcome.kind
    if kind == "completed":
        console.print(f"[green]run {result.run_id} completed[/]: {outcome.output}")
    elif kind == "awaiting_approval":
        console.print(f"[yellow]run {result.run_id} waits for approval {outcome.request_id}[/]")
    elif kind == "awaiting_answer":
        console.print(f"[yellow]run {result.run_id} waits for an answer to "
                      f"{outcome.question_id}[/]")
    elif kind == "awaiting_recovery":
        console.print(f"[yellow]run {result.run_id}: call {outcome.call_id} was in flight at a "
                      "crash; decide with `handrail recover`[/]")
    elif kind == "failed":
        console.print(f"[red]run {result.run_id} failed[/]: {outcome.error}")
    else:
        console.print(f"run {result.run_id} {kind}: {getattr(outcome, 'reason', '')}")


# ------------------------------------------------------------------ queries


def _cmd_runs(args: argparse.Namespace) -> int:
    from handrail.store import RunStatus

    async def go(store: Store) -> int:
        status = RunStatus(args.status) if args.status else None
        runs = await store.runs(limit=args.limit, status=status)
        if args.json:
            print(json.dumps([_run_json(r) for r in runs], indent=2))
            return 0
        from rich.table import Table

        table = Table("run", "status", "agent", "task", "steps", "started")
        for r in runs:
            table.add_row(r.id, r.status.value, r.agent or "-", _short(r.task, 50),
                          str(r.steps), _ago(r.created_at))
        _console().print(table if runs else "no runs in this store")
        return 0

    return _run_async(go, args)


def _run_json(r: RunRecord) -> dict[str, Any]:
    return {"id": r.id, "status": r.status.value, "agent": r.agent, "task": r.task,
            "steps": r.steps, "created_at": r.created_at, "outcome": r.outcome,
            "manifest_digest": r.manifest_digest, "model": r.model,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens}


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _cmd_show(args: argparse.Namespace) -> int:
    async def go(store: Store) -> int:
        run = await store.run(args.run)
        calls = await store.calls(run.id)
        messages = await store.messages(run.id)
        if args.json:
            print(json.dumps({"run": _run_json(run), "messages": messages,
                              "calls": [_call_json(c) for c in calls]}, indent=2))
            return 0
        console = _console()
        console.print(f"[bold]run {run.id}[/] — {run.status.value} — agent {run.agent or '-'} — "
                      f"model {run.model or '-'}")
        console.print(f"task: {run.task}")
        if run.manifest_digest:
            console.print(f"manifest: {run.manifest_digest}")
        console.print(f"tokens: {run.input_tokens} in / {run.output_tokens} out over "
                      f"{run.model_requests} requests")
        # The disk record of each call, when the run kept one (Agent(records_dir=...)).
        records = next((e.get("dir") for e in run.events if e.get("kind") == "records"), None)
        by_turn: dict[int, list[Any]] = {}
        for c in calls:
            by_turn.setdefault(c.turn, []).append(c)
        turn = -1
        for m in messages:
            kind = m.get("kind")
            if kind == "assistant":
                turn += 1
                text = "".join(p.get("text", "") for p in m["parts"] if p["kind"] == "text")
                if text:
                    console.print(f"\n[cyan]model[/] {_short(text, 200)}")
                for c in by_turn.get(turn, []):
                    _print_call(console, c)
                    if records is not None:
                        from rich.markup import escape

                        path = record_dir(records, run.id, c.turn, c.call_id)
                        console.print(escape(f"    record: {path}"), soft_wrap=True)
            elif kind == "user":
                console.print(f"[magenta]user[/] {_short(m['text'], 200)}")
        if run.outcome:
            console.print(f"\noutcome: {json.dumps(run.outcome)}")
        return 0

    return _run_async(go, args)


def _call_json(c: Any) -> dict[str, Any]:
    return {"id": c.id, "turn": c.turn, "tool": c.tool, "model_name": c.model_name,
            "status": c.status.value, "arguments_digest": c.arguments_digest,
            "actions": c.actions, "verdict": c.verdict, "decision": c.decision,
            "decided_by": c.decided_by, "result": c.result, "disposition": c.disposition,
            "error": c.error, "pending_id": c.pending_id}


def _print_call(console: Any, c: Any) -> None:
    verdict = c.verdict or {}
    effect = verdict.get("effect", "-")
    colour = {"allow": "green", "ask": "yellow", "deny": "red"}.get(effect, "white")
    actions = ", ".join(
        f"{a['act']} "
        + (a["target"] if isinstance(a["target"], str) else " ".join(a["target"]))
        for a in c.actions
    ) or "-"
    console.print(f"  [bold]{c.tool or c.model_name}[/] ({c.id}) → {actions}")
    console.print(f"    verdict: [{colour}]{effect}[/] — {verdict.get('reason', c.error or '-')}")
    if c.decision:
        console.print(f"    decision: {c.decision.get('kind')} by {c.decided_by}")
    result = c.result or {}
    texts = [i.get("text", "") for i in result.get("content", []) if i.get("kind") == "text"]
    from rich.markup import escape

    console.print(escape(f"    status: {c.status.value}"
                         + (f" — result: {_short(' '.join(texts), 120)}" if texts else "")
                         + (f" ({c.disposition})" if c.disposition else "")))


def _cmd_pending(args: argparse.Namespace) -> int:
    async def go(store: Store) -> int:
        items = await store.pending(kind=args.kind, agent=args.agent_name, tool=args.tool)
        if args.json:
            print(json.dumps([{"id": p.id, "kind": p.kind, "run_id": p.run_id, "tool": p.tool,
                               "agent": p.agent, "payload": p.payload,
                               "created_at": p.created_at} for p in items], indent=2))
            return 0
        console = _console()
        if not items:
            console.print("nothing is pending")
            return 0
        for p in items:
            console.print(f"[bold]{p.id}[/] {p.kind} — run {p.run_id} — tool {p.tool} — "
                          f"{_ago(p.created_at)}")
            payload = p.payload
            if p.kind == "approval":
                console.print(f"    {payload.get('act')} {payload.get('target')}"
                              f"  ({payload.get('verdict_reason', '')})")
                console.print(f"    arguments: {_short(json.dumps(payload.get('arguments')), 200)}")
            elif p.kind == "question":
                console.print(f"    asks: {payload.get('question') or payload.get('message')}")
                if payload.get("choices"):
                    console.print(f"    choices: {', '.join(payload['choices'])}")
            else:
                console.print(f"    in doubt: {_short(json.dumps(payload), 200)}")
        return 0

    return _run_async(go, args)


# ---------------------------------------------------------------- decisions


def _decide_then_resume(args: argparse.Namespace, kind: str, decision: dict[str, Any],
                        resume_fn: Callable[..., Awaitable[Any]], value: Any) -> int:
    async def go(store: Store) -> int:
        item = await store.pending_item(args.id)
        if item.kind != kind:
            raise UserError(f"{args.id} is a pending {item.kind}, not a {kind}")
        run = await store.run(item.run_id)
        agent = None if args.no_resume else _agent_for(args, run)
        console = _console()
        if agent is None:
            await store.decide(args.id, decision, "cli")
            console.print(f"recorded; continue the run with: handrail resume {item.run_id} "
                          "--agent MODULE:OBJECT")
            return 0
        result = await resume_fn(store, args.id, value, agent=agent, **_decided_by(kind))
        _print_outcome(result)
        return 0

    return _run_async(go, args)


def _decided_by(kind: str) -> dict[str, str]:
    return {"answered_by": "cli"} if kind == "question" else {"decided_by": "cli"}


def _cmd_approve(args: argparse.Namespace) -> int:
    from handrail.approval import Decision
    from handrail.runs import resume_with_decision

    decision = Decision.approve(remember=tuple(args.remember or ()))
    return _decide_then_resume(args, "approval", decision.to_dict(), resume_with_decision,
                               decision)


def _cmd_deny(args: argparse.Namespace) -> int:
    from handrail.approval import Decision
    from handrail.runs import resume_with_decision

    decision = Decision.deny(args.reason)
    return _decide_then_resume(args, "approval", decision.to_dict(), resume_with_decision,
                               decision)


def _cmd_answer(args: argparse.Namespace) -> int:
    from handrail.runs import resume_with_answer

    return _decide_then_resume(args, "question", {"answer": args.text}, resume_with_answer,
                               args.text)


def _cmd_recover(args: argparse.Namespace) -> int:
    from handrail.runs import Recovery, resume_with_recovery

    if args.retry:
        recovery = Recovery.retry()
    elif args.abort:
        recovery = Recovery.abort()
    else:
        recovery = Recovery.completed(args.completed)
    args.id = args.call
    return _decide_then_resume(args, "recovery", recovery.to_dict(), resume_with_recovery,
                               recovery)


def _cmd_resume(args: argparse.Namespace) -> int:
    from handrail.runs import resume

    async def go(store: Store) -> int:
        run = await store.run(args.run)
        agent = _agent_for(args, run)
        if agent is None:
            raise UserError(f"run {run.id} recorded no agent reference: pass --agent "
                            "MODULE:OBJECT (or set HANDRAIL_AGENT)")
        result = await resume(store, run.id, agent=agent,
                              allow_manifest_change=args.allow_manifest_change)
        _print_outcome(result)
        return 0

    return _run_async(go, args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from handrail.cli._demo import run_demo

    return run_demo(_store_path(args))


# ----------------------------------------------------------------- parsers


def register(sub: Any) -> None:
    """Add the run commands to the `handrail` parser."""
    store_help = "the run store (default: $HANDRAIL_STORE or ./.handrail/runs.db)"

    def add(name: str, help_text: str, func: Callable[[argparse.Namespace], int],
            agent: bool = False) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                         description=help_text)
        parser.add_argument("--store", help=store_help)
        if agent:
            parser.add_argument("--agent", metavar="MODULE:OBJECT",
                                help="the agent that continues the run (default: "
                                     "$HANDRAIL_AGENT, else the one the run recorded)")
        parser.set_defaults(func=func)
        return parser

    p = add("demo", "run the offline demo: reads, a denied secret, a deferred write", _cmd_demo)
    p = add("runs", "list runs, newest first", _cmd_runs)
    p.add_argument("--status", help="only runs in this status")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = add("show", "a run's timeline: each call, verdict, decision and result", _cmd_show)
    p.add_argument("run")
    p.add_argument("--json", action="store_true")
    p = add("pending", "approvals, questions and recoveries waiting for a person",
            _cmd_pending)
    p.add_argument("--kind", choices=["approval", "question", "recovery"])
    p.add_argument("--agent-name", dest="agent_name", help="only this agent's")
    p.add_argument("--tool", help="only this tool's (server/name)")
    p.add_argument("--json", action="store_true")
    p = add("approve", "approve a deferred action and continue its run", _cmd_approve, True)
    p.add_argument("id")
    p.add_argument("--remember", action="append", metavar="PATTERN",
                   help="also allow this pattern (same act) for the rest of the run")
    p.add_argument("--no-resume", action="store_true", help="record only; resume later")
    p = add("deny", "deny a deferred action; the model reads the reason", _cmd_deny, True)
    p.add_argument("id")
    p.add_argument("--reason", required=True)
    p.add_argument("--no-resume", action="store_true")
    p = add("answer", "answer a tool's question and continue its run", _cmd_answer, True)
    p.add_argument("id")
    p.add_argument("text")
    p.add_argument("--no-resume", action="store_true")
    p = add("resume", "continue a paused, cancelled or crashed run", _cmd_resume, True)
    p.add_argument("run")
    p.add_argument("--allow-manifest-change", action="store_true",
                   help="resume under a manifest other than the one the run started with")
    p = add("recover", "decide a call that was in flight at a crash", _cmd_recover, True)
    p.add_argument("call")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--retry", action="store_true", help="run it again")
    group.add_argument("--completed", metavar="TEXT", help="it happened; TEXT is its result")
    group.add_argument("--abort", action="store_true", help="give up on it")
    p.add_argument("--no-resume", action="store_true")


