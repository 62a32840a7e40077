"""The `handrail` command's parser and dispatch.

`handrail.cli.main` hands everything but a bare `--version` to `main` here.

Each group of subcommands lives in its own module with a `register(subparsers)` function that
adds its parsers and sets `func` (returning an exit code). `main` wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

# Modules with a `register(subparsers)` function, in help order.
_COMMAND_MODULES = ("_run", "_runs", "_manifest", "_policy", "_audit", "_inbox", "_serve",
                    "_worker")


class _Version(argparse.Action):
    """`--version` after other options (`handrail --store X --version`): `handrail.__version__`.

    A bare `handrail --version` never gets here (`handrail.cli.main` answers it first). Not
    `importlib.metadata`: it costs ~15 ms of import (with `email`) and says the same thing, as
    pyproject's version is read from `handrail/__init__.py`.
    """

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from handrail import __version__

        # Printed to stdout and exit 0, as argparse's own version action does.
        print(f"handrail {__version__}")
        parser.exit()


def _columns() -> int:
    """The terminal's width as `shutil.get_terminal_size` finds it ($COLUMNS, then stdout)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, with the width found without `shutil`.

    argparse builds a formatter for every `add_argument` and imports `shutil` (with bz2 and
    lzma, ~3 ms) to size it: a cost every command paid for help it never prints (issue 11).
    """

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None, **options: Any) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width, **options)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose formatter is `_Formatter`; its subcommands' parsers are too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every registered command group)."""
    parser = _Parser(
        prog="handrail",
        description="Inspect, approve and resume agent runs; check manifests; run the demo.",
    )
    parser.add_argument("--store", default=None,
                        help="the run store, for the run commands (also accepted after the "
                             "command; default: $HANDRAIL_STORE or ./.handrail/runs.db)")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"handrail.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"handrail.cli.{name}":
                raise
            continue  # that command group is not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `handrail` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    from handrail.cli._display import printable
    from handrail.errors import HandrailError

    if argv is None and getattr(args, "many_runs", False):
        # `handrail serve`, `worker`, `inbox` started as programs: processes handrail owns,
        # which run many agents on one loop. The collector setting is process-wide, so it is
        # never applied when `main` is called inside another program (argv given).
        from handrail.collector import tune_for_many_runs

        tune_for_many_runs()
    try:
        code: int = func(args)
        sys.stdout.flush()
    except HandrailError as exc:
        # A message can quote what a model chose (an id, a path): printable, like the rest,
        # a line at a time (a multi-line message keeps its lines; each one after the first
        # is indented, so none can pass for a line of its own).
        lines = str(exc).split("\n")
        print(f"handrail: error: {printable(lines[0])}", file=sys.stderr)
        for line in lines[1:]:
            print(f"  {printable(line)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`handrail runs --json | head`): end quietly. Python would
        # report the pipe again when it flushes stdout at exit, so stdout goes to devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command ended by a closed pipe
    except KeyboardInterrupt:
        print("handrail: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
