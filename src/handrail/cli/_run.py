"""`handrail run MODULE:OBJECT "task"`: run an agent in the terminal.

The object is an `hr.Agent`, or tools (a Toolbox, a Toolset, a list of tools) run with
`--model`. The run is shown live (`hr.TerminalPrinter`); approvals and tools' questions are
asked at the terminal (`StdinApprover`, `StdinResponder`) unless `--defer` (or
`--approve all|deny`). When stdin is not a terminal nobody can answer, so the run pauses as
with `--defer` (never a denial in a person's name). When the run pauses, the command that
continues it is printed. When programs would run unconfined, that is said before the run.

Exit codes: 0 completed, 1 failed or cancelled (or an error), 3 paused for a person.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from handrail.cli._display import printable
from handrail.errors import UserError

__all__ = ["register"]

EXIT_PAUSED = 3


class _PausingApprover:
    """Stops the printer's spinner before asking at the terminal."""

    def __init__(self, inner: Any, printer: Any) -> None:
        self.inner = inner
        self.printer = printer
        # The audit trail names the approver that decided, not this wrapper.
        self.name = getattr(inner, "name", type(inner).__name__)

    async def decide(self, request: Any) -> Any:
        self.printer.pause()
        return await self.inner.decide(request)


class _PausingResponder:
    def __init__(self, inner: Any, printer: Any) -> None:
        self.inner = inner
        self.printer = printer

    async def answer(self, question: Any) -> Any:
        self.printer.pause()
        return await self.inner.answer(question)


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # closed, or a stand-in without a file
        return False


def _confinement_warning(agent: Any) -> str | None:
    """The demo's sandbox line when programs this agent starts would not be fully confined."""
    from handrail.cli._demo import sandbox_line
    from handrail.sandbox import find_bwrap

    mode = getattr(agent, "sandbox", "auto")
    if mode != "off" and find_bwrap()[0] is not None:
        return None
    return sandbox_line(mode)


def _agent(obj: Any, ref: str, model: str | None) -> Any:
    from handrail.runs import Agent
    from handrail.tools import Toolbox, Toolset

    if isinstance(obj, Agent):
        if model is not None:
            raise UserError(f"{ref} is an Agent with its own model ({obj.model.name}); "
                            "--model is for tools run without an Agent")
        if obj.ref is None:
            obj.ref = ref  # so `handrail approve`/`resume` in another process rebuild it
        return obj
    if isinstance(obj, Toolbox | Toolset | list | tuple):
        if model is None:
            raise UserError(f"{ref} is tools, not an Agent: pass --model PROVIDER:NAME "
                            "(e.g. --model openai:gpt-4.1-mini) to run them")
        return Agent(model, obj)
    raise UserError(f"{ref} is a {type(obj).__name__}: `handrail run` takes an hr.Agent, or "
                    "tools (a Toolbox, a Toolset or a list of tools) with --model")


def _cmd_run(args: argparse.Namespace) -> int:
    from handrail.approval import ApproveAll, DenyAll, StdinApprover, StdinResponder
    from handrail.cli._runs import _store_path, load_object
    from handrail.runs import TerminalPrinter, next_step, outcome_to_dict
    from handrail.store import Store

    agent = _agent(load_object(args.target), args.target, args.model)
    if not args.defer and args.approve == "ask" and not _is_terminal(sys.stdin):
        # Nobody can answer: a denial "by the operator" would be a lie in a person's name,
        # and the model would read it as one. The run pauses instead, and says how to decide.
        print("handrail: stdin is not a terminal, so nobody here can answer: a call to "
              "approve or a question pauses the run (as with --defer; --approve all|deny "
              "decides without asking)", file=sys.stderr)
        args.defer = True
    warning = _confinement_warning(agent)
    if warning:
        # Before anything runs: a person who followed the README on a machine without
        # bubblewrap learns here, not from a record later, that programs run unconfined.
        print(f"handrail: {printable(warning)}", file=sys.stderr)
    printer = None if args.json else TerminalPrinter()
    approver: Any = None
    responder: Any = None
    if args.approve == "all":
        approver = ApproveAll()
    elif args.approve == "deny":
        approver = DenyAll()
    elif not args.defer:
        approver = StdinApprover()
    if not args.defer:
        responder = StdinResponder()
    if printer is not None:
        approver = approver and _PausingApprover(approver, printer)
        responder = responder and _PausingResponder(responder, printer)

    async def main() -> Any:
        async with Store.open(_store_path(args)) as store:
            return await agent.run(args.task, store=store, approver=approver,
                                   responder=responder, on_event=printer)

    import anyio

    result = anyio.run(main)
    outcome = result.outcome
    if args.json:
        print(json.dumps({"run_id": result.run_id, "outcome": outcome_to_dict(outcome)}))
    else:
        print(f"run {result.run_id}: {outcome.kind}")
        if outcome.kind == "completed":
            text = outcome.output if isinstance(outcome.output, str) else json.dumps(
                outcome_to_dict(outcome)["output"])
            print(printable(text))
        else:
            print(f"next: {printable(next_step(outcome, result.run_id))}")
            store = _store_path(args)
            if getattr(args, "store", None):
                import shlex

                print(f"      (give those commands --store {printable(shlex.quote(store))})")
    if outcome.kind == "completed":
        return 0
    return EXIT_PAUSED if outcome.kind.startswith("awaiting") else 1


def register(sub: Any) -> None:
    """Add `handrail run`."""
    p: argparse.ArgumentParser = sub.add_parser(
        "run", help="run an agent on a task, live in the terminal",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("target", metavar="MODULE:OBJECT",
                   help="an hr.Agent, or tools to run with --model (the current directory "
                        "is importable)")
    p.add_argument("task", help="what the agent is asked to do")
    p.add_argument("--store", default=argparse.SUPPRESS,
                   help="the run store (created if missing; default: $HANDRAIL_STORE or "
                        "./.handrail/runs.db)")
    p.add_argument("--approve", choices=["ask", "all", "deny"], default="ask",
                   help="what happens to a call the policy marks ask: ask at the terminal "
                        "(default), approve all, deny all")
    p.add_argument("--defer", action="store_true",
                   help="ask nobody: a call to approve or a question pauses the run, and the "
                        "command that continues it is printed")
    p.add_argument("--json", action="store_true",
                   help="print only the run id and its outcome, as JSON")
    p.add_argument("--model", metavar="PROVIDER:NAME",
                   help="the model for tools run without an Agent (e.g. openai:gpt-4.1-mini)")
    p.set_defaults(func=_cmd_run)
