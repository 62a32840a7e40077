"""`handrail audit verify|export|keygen`: the record's hash chain, checked, signed, exported.

`verify` recomputes every run's chain and the store-wide chain, compares every row with the
last fact recorded about it, and exits 1 at the first break, naming the row and what happened
to it (edited, deleted, reordered, inserted, rewritten). `--key PUB` also checks the heads
signed with that key; `--sign KEY` signs the head once it verified (run it at intervals: a
timer, cron). `export` writes the chain as JSON lines a reader without handrail can check
(docs/audit.md). None of them writes the record; `--sign` adds one signature row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from handrail.cli._display import Out, printable, style
from handrail.errors import UserError

__all__ = ["register"]

SHOWN_BREAKS = 10
"""Breaks listed after the first (`--json` lists every one found)."""


def _read_key(path: str, what: str) -> bytes:
    from pathlib import Path  # (not at import: pathlib loads ipaddress, for `--help` too)

    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the {what} {printable(path)}: "
                        f"{exc.strerror or exc}") from None


def _store_url(args: argparse.Namespace) -> str:
    from handrail.cli._runs import _existing_store, _store_path

    path = _store_path(args)
    file = path.removeprefix("sqlite://")
    if "://" not in file and not os.path.isfile(os.path.expanduser(file)):
        _existing_store(args)  # raises, saying where the path came from
    return path


def _cmd_verify(args: argparse.Namespace) -> int:
    from handrail.store import audit

    keys = [audit.load_public_key(_read_key(k, "public key")) for k in args.key or ()]
    signer = (audit.load_private_key(_read_key(args.sign, "signing key"))
              if args.sign else None)
    if signer is not None and args.run:
        raise UserError("--sign signs the whole store's head: leave out --run")
    url = _store_url(args)
    reader = audit.open_reader(url, writable=signer is not None)
    try:
        report = audit.verify(reader.source(args.run), run_id=args.run, keys=keys)
        signed = None
        if signer is not None and report.ok:
            signed = audit.sign(reader, signer)
    finally:
        reader.close()
    if args.run and report.runs == 0:
        raise UserError(f"no run '{printable(args.run)}' in the audit chain of "
                        f"{printable(url)}")
    if args.json:
        print(json.dumps({
            "ok": report.ok, "facts": report.facts, "runs": report.runs, "rows": report.rows,
            "head": None if report.head is None else {"seq": report.head[0],
                                                      "link": report.head[1]},
            "signed_upto": None if report.signed is None else report.signed[0],
            "breaks": [{"what": b.what, "where": b.where, "detail": b.detail, "seq": b.seq}
                       for b in report.breaks], "more_breaks": report.more,
            "signed": None if signed is None else {"seq": signed[0], "link": signed[1],
                                                   "key": signed[2]},
        }))
        return 0 if report.ok else 1
    out = Out()
    scope = f"run {printable(args.run)}" if args.run else f"{report.runs} runs"
    if report.ok:
        out.print(style("green", f"The record verifies: {report.facts} facts of {scope}, "
                                 f"{report.rows} rows as recorded."))
        if report.head is not None:
            out.print(f"head: #{report.head[0]} {report.head[1]}")
        if keys:
            assert report.signed is not None
            after = (report.head[0] - report.signed[0]) if report.head else 0
            out.print(f"signed up to #{report.signed[0]}"
                      + (f"; {after} facts after it are not signed yet" if after > 0 else ""))
        if signed is not None:
            out.print(f"signed head #{signed[0]} with key {signed[2][:16]}…")
        out.flush()
        return 0
    first, *rest = report.breaks
    out.print(style("bold red", f"BROKEN: {first.what}: {printable(first.where)}"))
    out.print(f"  {printable(first.detail)}")
    total = len(report.breaks) + report.more
    if total > 1:
        out.print(f"{total - 1} more break(s):")
        for b in rest[:SHOWN_BREAKS]:
            out.print(f"  {b.what}: {printable(b.where)}: {printable(b.detail)}")
        if total - 1 > SHOWN_BREAKS:
            out.print(style("dim", f"  ... {total - 1 - SHOWN_BREAKS} more (--json)"))
    if signer is not None:
        out.print("nothing was signed: the record does not verify")
    out.flush()
    return 1


def _cmd_export(args: argparse.Namespace) -> int:
    from handrail.store import audit

    since = 0.0
    if args.since:
        from handrail.policy._whatif import parse_since

        since = parse_since(args.since)
    from pathlib import Path

    url = _store_url(args)
    reader = audit.open_reader(url)
    try:
        if args.out:
            target = Path(args.out).expanduser()
            try:
                with target.open("w", encoding="utf-8") as f:
                    n = 0
                    for line in audit.export_lines(reader, since=since):
                        f.write(line + "\n")
                        n += 1
            except OSError as exc:
                raise UserError(f"cannot write {printable(args.out)}: "
                                f"{exc.strerror or exc}") from None
            print(f"wrote {n - 1} lines after the header to {printable(args.out)}",
                  file=sys.stderr)
        else:
            write = sys.stdout.write
            for line in audit.export_lines(reader, since=since):
                write(line + "\n")
    finally:
        reader.close()
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from pathlib import Path

    from handrail.store import audit

    private, public = audit.generate_key()
    target = Path(args.path).expanduser()
    pub = target.with_name(target.name + ".pub")
    for path in (target, pub):
        if path.exists():
            raise UserError(f"{printable(str(path))} exists: choose another path (a key is "
                            "never overwritten)")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        pub.write_bytes(public)
    except OSError as exc:
        raise UserError(f"cannot write the key {printable(args.path)}: "
                        f"{exc.strerror or exc}") from None
    print(f"private key: {printable(str(target))} (keep it off the machine that writes the "
          f"store)\npublic key:  {printable(str(pub))}")
    return 0


def register(sub: Any) -> None:
    """Add `handrail audit verify`, `export` and `keygen`."""
    store_help = "the run store (default: $HANDRAIL_STORE or ./.handrail/runs.db)"
    group = sub.add_parser("audit", help="verify, sign and export the record's hash chain",
                           description="The tamper-evident record (docs/audit.md).")
    commands = group.add_subparsers(dest="audit_command", metavar="COMMAND", required=True)
    p = commands.add_parser(
        "verify", help="recompute the hash chains; exit 1 at the first break",
        description="Recompute every run's chain and the store's, compare every run, call and "
                    "pending item with the last fact recorded about it, and report the first "
                    "break (edited, deleted, reordered, inserted, rewritten). Exit status 1 "
                    "on any break.")
    p.add_argument("--store", help=store_help, default=argparse.SUPPRESS)
    p.add_argument("--run", metavar="ID", help="only this run (its full id)")
    p.add_argument("--key", metavar="PUB", action="append",
                   help="an Ed25519 public key (PEM): the heads it signed must match the "
                        "chain, and at least one must exist (repeatable)")
    p.add_argument("--sign", metavar="KEY",
                   help="once the store verifies, sign its head with this Ed25519 private "
                        "key (PEM) and record the signature")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_verify)
    p = commands.add_parser(
        "export", help="the chain as JSON lines, readable without handrail",
        description="One header line, one line per fact (its body, hash, previous hash and "
                    "store-wide link), one per signature; the schema is in docs/audit.md.")
    p.add_argument("--store", help=store_help, default=argparse.SUPPRESS)
    p.add_argument("--since", metavar="AGE",
                   help="only facts written since then: 7d, 12h, 30m, 2w, or an ISO date")
    p.add_argument("--format", choices=["jsonl"], default="jsonl",
                   help="the format (jsonl, the only one)")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(func=_cmd_export)
    p = commands.add_parser(
        "keygen", help="make an Ed25519 key pair for signing heads",
        description="Write PATH (the private key, PEM, mode 0600) and PATH.pub.")
    p.add_argument("path", metavar="PATH", help="where the private key goes (PATH.pub: the "
                   "public key); neither may exist yet")
    p.set_defaults(func=_cmd_keygen)
