"""The `handrail` command.

Each group of subcommands lives in its own module with a `register(subparsers)` function that
adds its parsers and sets `func` (returning an exit code); `handrail.cli._main` wires them
together. This module only dispatches: `handrail --version` is answered here without argparse,
the command groups or `importlib.metadata` (together ~200 ms of a ~25 ms interpreter start),
and everything else is handed to `_main`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see handrail/__init__.py
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `handrail` command; returns the exit code."""
    import sys

    if (sys.argv[1:] if argv is None else list(argv)) == ["--version"]:
        from handrail import __version__

        # What argparse's own version action does: the version on stdout, exit 0. The
        # distribution's version is `__version__` itself (pyproject's version is read from
        # handrail/__init__.py), so no metadata lookup is needed.
        print(f"handrail {__version__}")
        return 0
    from handrail.cli._main import main as run

    return run(argv)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every registered command group)."""
    from handrail.cli._main import build_parser as build

    return build()
