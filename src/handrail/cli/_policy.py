"""`handrail policy what-if PROPOSED.toml` and `handrail policy suggest`: a policy and the record.

`what-if` replays every recorded call against a proposed policy and prints what flips, with
counts per change, rule and tool and the calls behind each; it exits 1 when a call a person
approved would now be denied, or one that was denied would now be allowed, so it can gate a
policy change in review (`--json` for CI). `suggest` writes the least policy the record needs.
Both read the store and never write it. Everything printed that a model or a tool wrote goes
through `printable`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from handrail.cli._display import Out, printable, printable_json, style, table
from handrail.errors import UserError

if TYPE_CHECKING:
    from handrail.policy import WhatIf

__all__ = ["register"]

SHOWN = 50
"""Flipped calls listed by default (gating ones first); `--limit` changes it."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _load(path: str) -> Any:
    from handrail.policy import Policy

    try:
        return Policy.load(path)
    except OSError as exc:
        raise UserError(f"cannot read the proposed policy {printable(path)}: "
                        f"{exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"the proposed policy {printable(path)} is not UTF-8 text") from None


def _history(args: argparse.Namespace, since: float, *, arguments: bool = False) -> list[Any]:
    """Every run since `since` with its calls, read without writing the store.

    With `arguments`, each call's performed arguments too (a policy with value conditions
    reads them); else the decisions alone.

    A SQLite file is read on a read-only connection of its own (`read_history`), never
    through a store, whose read-write connections could fold its log or checkpoint its WAL
    into the file when they close; any other store through its `call_history`. The cycle
    collector is paused meanwhile, as `hr.policy.what_if` does (see `_paused_gc`).
    """
    import asyncio

    from handrail.cli._runs import _existing_store, _store_path
    from handrail.policy._whatif import _paused_gc

    path = _store_path(args)
    file = path.removeprefix("sqlite://")
    if "://" not in file:
        local = os.path.expanduser(file)
        if not os.path.isfile(local):
            _existing_store(args)  # raises, saying where the path came from
        from handrail.store._sqlite import read_history

        async def read_file() -> list[Any]:
            return [pair async for pair in read_history(local, since=since,
                                                             decisions_only=not arguments)]

        with _paused_gc():
            return asyncio.run(read_file())

    async def read_store() -> list[Any]:
        store = _existing_store(args)
        try:
            return [pair async for pair in store.call_history(
                since=since, decisions_only=not arguments)]
        finally:
            await store.close()

    with _paused_gc():
        return asyncio.run(read_store())


def _print_report(report: WhatIf, source: str, limit: int, *, quotas: bool = False) -> None:
    out = Out()
    out.print(f"Replayed {report.replayed} recorded calls of {report.runs} runs against "
              f"{printable(source)}" + (f" ({report.undecided} calls no policy decided: "
                                        "unknown tool, not granted, invalid arguments, "
                                        "held back by a quota)"
                                        if report.undecided else "") + ".")
    if quotas:
        out.print("Quotas are not replayed: a call a quota held back cannot flip; one that "
                  "ran is judged by the rules alone.")
    if not report.flips:
        out.print(style("green", "Nothing flips: every call gets the effect it got."))
        out.flush()
        return
    out.print(f"{len(report.flips)} calls flip.")
    for title, counts in (("change", report.by_change()), ("rule", report.by_rule()),
                          ("tool", report.by_tool())):
        out.print("")
        for line in table([title, "calls"], [[printable(k), str(v)] for k, v in counts.items()]):
            out.print(line)
    shown = sorted(report.flips, key=lambda f: not f.gating)[:limit]
    out.print("")
    rows = [[printable(f.run_id), printable(f.call_id), printable(f.agent), printable(f.tool),
             f.act, printable(f.target), f.change, f.outcome,
             style("bold red", "GATING") if f.gating else "~" if f.approximate else ""]
            for f in shown]
    for line in table(["run", "call", "agent", "tool", "act", "target", "change", "outcome",
                       ""], rows):
        out.print(line)
    if len(report.flips) > len(shown):
        out.print(style("dim", f"... {len(report.flips) - len(shown)} more (--limit N, or "
                               "--json for every one)"))
    if any(f.approximate for f in report.flips):
        out.print(style("dim", "~ replayed on a lexical canonical form (an action of a call "
                               "with several, or a program given by path)"))
    gating = report.gating
    if gating:
        denied = sum(1 for f in gating if f.outcome == "approved")
        allowed = len(gating) - denied
        out.print("")
        out.print(style("bold red", f"FAIL: {denied} calls a person approved would be denied; "
                                    f"{allowed} denied or refused calls would be allowed."))
    out.flush()


def _cmd_what_if(args: argparse.Namespace) -> int:
    from handrail.policy import replay
    from handrail.policy._whatif import parse_since

    policy = _load(args.proposed)
    report = replay(_history(args, parse_since(args.since), arguments=policy.conditional),
                    policy, agent=args.agent)
    if args.json:
        sys.stdout.write(printable_json({"proposed": args.proposed, **report.to_dict()}) + "\n")
    else:
        _print_report(report, args.proposed, args.limit, quotas=bool(policy.limits))
    return 1 if report.failed else 0


def _cmd_suggest(args: argparse.Namespace) -> int:
    from handrail.policy import suggest_from
    from handrail.policy._whatif import parse_since

    since = parse_since(args.since)
    if args.output and os.path.isdir(args.output):
        raise UserError(f"-o {printable(args.output)} is a folder: give a file name")

    suggestion = suggest_from(_history(args, since), agent=args.agent)
    scope = f"agent {args.agent}" if args.agent else "every agent"
    header = [f"Suggested by `handrail policy suggest` from {suggestion.calls} calls let "
              f"through in {suggestion.runs} runs ({scope}"
              + (f", since {args.since}" if args.since else "") + ").",
              "Allows exactly what the record let through; keeps every deny and the "
              "secrets layer; asks for the rest."]
    header += [f"Generalised: {g} (several files of that folder)"
               for g in suggestion.generalised]
    text = suggestion.to_toml(header="\n".join(printable(h) for h in header))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {printable(args.output)}: {suggestion.calls} calls let through in "
              f"{suggestion.runs} runs", file=sys.stderr)
    else:
        sys.stdout.write(text)
    for conflict in suggestion.conflicts:
        print(f"handrail: warning: a kept deny refuses a call the record let through: "
              f"{printable(conflict)}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add `handrail policy what-if` and `handrail policy suggest`."""
    store_help = "the run store (default: $HANDRAIL_STORE or ./.handrail/runs.db)"
    group = sub.add_parser("policy", help="replay the record against a proposed policy; "
                                          "suggest the least policy it needs",
                           description="Questions about a policy the record answers.")
    commands = group.add_subparsers(dest="policy_command", metavar="COMMAND", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--store", help=store_help, default=argparse.SUPPRESS)
        parser.add_argument("--since", metavar="AGE",
                            help="only runs started since then: 7d, 12h, 30m, 2w, or an ISO "
                                 "date (default: every run)")
        parser.add_argument("--agent", metavar="NAME",
                            help="only this agent's runs: its name, or its path "
                                 "(planner/coder)")

    p = commands.add_parser(
        "what-if", help="what a proposed policy would have changed in the recorded calls",
        description="Replay every recorded call (on its targets as decided) against a proposed "
                    "policy. Exit status 1 when a call a person approved would be denied, or "
                    "a denied or refused call would be allowed.")
    p.add_argument("proposed", metavar="PROPOSED.toml", help="the proposed policy file")
    common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (every flip)")
    p.add_argument("--limit", type=_positive, default=SHOWN, metavar="N",
                   help=f"list at most N flipped calls (default {SHOWN}, gating ones first)")
    p.set_defaults(func=_cmd_what_if)
    p = commands.add_parser(
        "suggest", help="the least policy that lets the recorded calls through (TOML)",
        description="Write a policy allowing exactly what the record let through (a folder "
                    "where several of its files were), keeping every deny and the secrets "
                    "layer, asking for everything else.")
    common(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write it here (default: stdout)")
    p.set_defaults(func=_cmd_suggest)
