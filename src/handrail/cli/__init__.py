"""The `handrail` command.

Each group of subcommands lives in its own module with a `register(subparsers)` function that
adds its parsers and sets `func` (returning an exit code). `main` wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Modules with a `register(subparsers)` function, in help order.
_COMMAND_MODULES = ("_runs", "_manifest", "_worker")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every registered command group)."""
    parser = argparse.ArgumentParser(
        prog="handrail",
        description="Inspect, approve and resume agent runs; check manifests; run the demo.",
    )
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
    from handrail.errors import HandrailError

    try:
        code: int = func(args)
    except HandrailError as exc:
        print(f"handrail: error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
