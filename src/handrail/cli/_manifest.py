"""`handrail manifest init | check | digest`: write, enforce and pin `handrail.toml`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from handrail.errors import UserError

__all__ = ["register", "resolve_toolset"]

_DEFAULT_PATH = "handrail.toml"


def register(subparsers: Any) -> None:
    """Add the `manifest` command group to the `handrail` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "manifest",
        help="write, check and digest handrail.toml",
        description="The manifest is the reviewed statement of what an agent may reach and "
        "what the model is told. See docs/manifest.md.",
    )
    sub = parser.add_subparsers(dest="manifest_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args: _help(parser))

    init = sub.add_parser(
        "init",
        help="write a manifest granting every tool of a Toolbox or Agent",
        description="Write a manifest from the tools in code: descriptions from their "
        "docstrings, mutates and idempotent from their declarations. Review it, then commit it.",
    )
    init.add_argument("target", metavar="MODULE:OBJECT",
                      help="a Toolbox, an Agent, a list of tools, or a callable returning one")
    init.add_argument("-o", "--output", default=_DEFAULT_PATH,
                      help=f"where to write it (default {_DEFAULT_PATH}; '-' for stdout)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.add_argument("--name", help="the agent's name for [agent]")
    init.add_argument("--model", help="the model string for [agent]")
    init.set_defaults(func=_init)

    check = sub.add_parser(
        "check",
        help="exit 1 listing every way the code has drifted from the manifest (for CI)",
    )
    check.add_argument("target", metavar="MODULE:OBJECT",
                       help="a Toolbox, an Agent, a list of tools, or a callable returning one")
    check.add_argument("--manifest", default=_DEFAULT_PATH,
                       help=f"the manifest to check against (default {_DEFAULT_PATH})")
    check.set_defaults(func=_check)

    digest = sub.add_parser("digest", help="print the manifest's digest (to pin a deployment)")
    digest.add_argument("path", nargs="?", default=_DEFAULT_PATH,
                        help=f"the manifest (default {_DEFAULT_PATH})")
    digest.add_argument("--canonical", action="store_true",
                        help="print the canonical JSON the digest hashes instead")
    digest.set_defaults(func=_digest)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _import(target: str) -> object:
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise UserError(f"expected MODULE:OBJECT (e.g. myapp.tools:box), got {target!r}")
    # Like `python -m`, the current directory is importable, so `app:box` finds ./app.py.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UserError(f"cannot import module {module_name!r} (run from the directory "
                            f"that holds it, or install it): {exc}") from exc
        raise
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(f"{module_name!r} has no {attr_path!r} ({part!r} is missing)"
                            ) from None
    return obj


def _is_toolset(obj: object) -> bool:
    return not isinstance(obj, type) and (hasattr(obj, "impls") or hasattr(obj, "specs"))


def resolve_toolset(target: str) -> tuple[Any, dict[str, str]]:
    """The toolbox named by `MODULE:OBJECT`, and [agent] fields found on it.

    OBJECT may be a Toolbox (anything with `.impls()` or `.specs()`), an Agent (its `.toolbox`),
    a list of tools, a single tool, or a callable returning one of these.
    """
    from handrail.tools import Toolbox, ToolImpl

    obj = _import(target)
    for attempt in range(2):
        toolbox = getattr(obj, "toolbox", None)
        if _is_toolset(toolbox):
            agent = {field: value for field in ("name", "instructions", "model")
                     if isinstance(value := getattr(obj, field, None), str)}
            return toolbox, agent
        if _is_toolset(obj):
            return obj, {}
        if isinstance(obj, list | tuple):
            return Toolbox(obj), {}
        # A tool is callable too; it must not be called here.
        if isinstance(obj, ToolImpl) or hasattr(obj, "__handrail_tool__"):
            return Toolbox([obj]), {}
        if attempt == 0 and callable(obj):
            obj = obj()
            continue
        break
    raise UserError(f"{target} is of type {type(obj).__name__}, not a Toolbox, an Agent, a "
                    "list of tools, or a callable returning one")


def _init(args: argparse.Namespace) -> int:
    from handrail.manifest import Manifest

    toolbox, agent = resolve_toolset(args.target)
    manifest = Manifest.from_toolbox(
        toolbox,
        name=args.name or agent.get("name"),
        instructions=agent.get("instructions"),
        model=args.model or agent.get("model"),
    )
    text = manifest.to_toml()
    if args.output == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.output, "x" if not args.force else "w", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            raise UserError(f"{args.output} exists; pass --force to overwrite it, or -o to "
                            "write elsewhere") from None
        print(f"wrote {args.output}: {len(manifest.grants)} tool"
              f"{'s' if len(manifest.grants) != 1 else ''} granted, {manifest.digest}",
              file=sys.stderr)
    undescribed = [str(g.ref) for g in manifest.grants if g.description is None]
    if undescribed:
        print(f"note: no description for {', '.join(undescribed)}: write one in the manifest "
              "(or a docstring) before `handrail manifest check` will pass", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    from handrail.manifest import Manifest, problems

    manifest = Manifest.load(args.manifest)
    toolbox, _ = resolve_toolset(args.target)
    notes: list[str] = []
    if manifest.servers:  # MCP servers: their tools are checked too (see docs/mcp.md)
        from handrail.mcp._servers import check_with_servers

        found, notes = check_with_servers(toolbox, manifest)
    else:
        found = problems(toolbox, manifest)
    for note in notes:
        print(f"note: {note}")
    if found:
        print(f"{args.manifest}: the code has drifted from the manifest ({len(found)} problem"
              f"{'s' if len(found) != 1 else ''}):")
        for problem in found:
            print(f"  - {problem}")
        return 1
    print(f"OK: {args.target} matches {args.manifest} ({len(manifest.grants)} tools, "
          f"{manifest.digest})")
    return 0


def _digest(args: argparse.Namespace) -> int:
    from handrail.manifest import Manifest, canonical_json

    manifest = Manifest.load(args.path)
    if args.canonical:
        sys.stdout.write(canonical_json(manifest.canonical()).decode("utf-8") + "\n")
    else:
        print(manifest.digest)
    return 0
