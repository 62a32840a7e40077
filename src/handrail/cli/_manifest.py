"""`handrail manifest init | update | check | digest`: write, enforce and pin `handrail.toml`."""

from __future__ import annotations

import argparse
import importlib
import json
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
        "docstrings, mutates and idempotent from their declarations, every input and output "
        "schema; for an Agent also its name, instructions, model and policy. Refuses to "
        "overwrite an existing file (see `manifest update`). Review it, then commit it.",
    )
    init.add_argument("target", metavar="MODULE:OBJECT", nargs="?",
                      help="a Toolbox, an Agent, a list of tools, or a callable returning one")
    init.add_argument("--servers", action="store_true",
                      help="grant the tools of the [[servers]] the manifest (-o) declares: "
                      "each server is started (its start decided by the manifest's policy) and "
                      "every tool it offers is granted with its schemas pinned, as mutating; "
                      "a read-only hint is printed as a note to review")
    init.add_argument("-o", "--output", default=_DEFAULT_PATH,
                      help=f"where to write it (default {_DEFAULT_PATH}; '-' for stdout)")
    init.add_argument("--force", action="store_true",
                      help="overwrite an existing file (what was written by hand is lost; "
                      "`manifest update` keeps it)")
    init.add_argument("--name", help="the agent's name for [agent]")
    init.add_argument("--model", help="the model string for [agent]")
    init.set_defaults(func=_init)

    update = sub.add_parser(
        "update",
        help="merge the code's changes into an existing manifest, showing what changed",
        description="Bring handrail.toml up to date with the code: new tools are granted, "
        "grants of tools that are gone are removed, schemas and the agent's instructions and "
        "model follow the code, and mutates/idempotent only ever get stricter. Descriptions, "
        "[policy], [budgets] and every grant that did not change are kept as written. Prints "
        "a summary and a diff; review it like any change.",
    )
    update.add_argument("target", metavar="MODULE:OBJECT", nargs="?",
                        help="a Toolbox, an Agent, a list of tools, or a callable returning one "
                             "(not needed for a manifest whose tools are its [[servers]]')")
    update.add_argument("--manifest", default=_DEFAULT_PATH,
                        help=f"the manifest to update (default {_DEFAULT_PATH})")
    update.add_argument("--dry-run", action="store_true",
                        help="print what would change; write nothing")
    update.set_defaults(func=_update)

    check = sub.add_parser(
        "check",
        help="exit 1 listing every way the code has drifted from the manifest (for CI)",
    )
    check.add_argument("target", metavar="MODULE:OBJECT", nargs="?",
                       help="a Toolbox, an Agent, a list of tools, or a callable returning one "
                            "(not needed for a manifest whose tools are its [[servers]]')")
    check.add_argument("--manifest", default=_DEFAULT_PATH,
                       help=f"the manifest to check against (default {_DEFAULT_PATH})")
    check.add_argument("--strict", action="store_true",
                       help="fail on warnings too (a grant whose schema is not pinned)")
    check.add_argument("--json", action="store_true",
                       help="print the result as one JSON object (ok, digest, problems)")
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


def resolve_toolset(target: str) -> tuple[Any, dict[str, Any]]:
    """The toolbox named by `MODULE:OBJECT`, and what an Agent says for the manifest.

    OBJECT may be a Toolbox (anything with `.impls()` or `.specs()`), an Agent (its `.toolbox`),
    a list of tools, a single tool, or a callable returning one of these. For an Agent the
    second value holds its `name`, `instructions` and `model` (a model string, or a Model's
    `name`), and its `policy` (a `hr.Policy`) when it has one; it is empty otherwise.
    """
    from handrail.tools import Toolbox, ToolImpl

    obj = _import(target)
    for attempt in range(2):
        toolbox = getattr(obj, "toolbox", None)
        if _is_toolset(toolbox):
            # An agent with sub-agents: its manifest covers the whole tree (issue 32).
            tree = getattr(obj, "tools_of_tree", None)
            return (tree() if callable(tree) else toolbox), _agent_fields(obj)
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


def _agent_fields(agent: object) -> dict[str, Any]:
    from handrail.policy import Policy

    fields: dict[str, Any] = {"agent": True}
    for name in ("name", "instructions"):
        value = getattr(agent, name, None)
        if isinstance(value, str):
            fields[name] = value
    model = getattr(agent, "model", None)
    label = model if isinstance(model, str) else getattr(model, "name", None)
    if isinstance(label, str):
        fields["model"] = label
    policy = getattr(agent, "policy", None)
    if isinstance(policy, Policy):
        fields["policy"] = policy
    return fields


def _init_servers(args: argparse.Namespace) -> int:
    """`manifest init --servers`: grant what the declared servers offer, for review."""
    import dataclasses

    import anyio

    from handrail.manifest import Manifest, update
    from handrail.mcp import MCPToolset
    from handrail.tools import Toolbox

    path = _DEFAULT_PATH if args.output == "-" else args.output
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"manifest init --servers reads the [[servers]] of {path}, which "
                        f"cannot be read ({exc.strerror}): write the [[servers]] entries (and "
                        "a [policy] allowing their start) first, then run it again") from None
    manifest = Manifest.from_toml(text, source=path)
    if not manifest.servers:
        raise UserError(f"{path} declares no [[servers]]: add one (name, command or url) "
                        "and run `handrail manifest init --servers` again")
    code: Any = resolve_toolset(args.target)[0] if args.target else Toolbox([])

    async def offered() -> tuple[Any, list[str]]:
        import contextlib

        notes: list[str] = []
        async with contextlib.AsyncExitStack() as stack:
            impls = []
            for decl in manifest.servers:
                # No manifest: every tool the server offers, each one mutating until a
                # person reviewing the grant says otherwise.
                toolset = await stack.enter_async_context(MCPToolset.from_manifest(
                    decl, policy=manifest.policy))
                for impl in toolset.impls():
                    grant = manifest.grant(impl.spec.id)
                    if grant is not None:  # reviewed already: as granted, never laxer
                        impl.spec = dataclasses.replace(impl.spec, mutates=grant.mutates)
                    impls.append(impl)
                    if impl.spec.annotations.get("readOnlyHint") is True:
                        notes.append(f"'{impl.spec.id}': its server hints it is read-only; "
                                     "granted as mutating (calls ask): set mutates = false "
                                     "once you have checked that it changes nothing")
            return Toolbox([code, *impls]), notes

    box, notes = anyio.run(offered)
    result = update(text, box, {}, source=path)
    for change in result.changes:
        print(f"  - {change}")
    if args.output == "-":
        sys.stdout.write(result.text)
    elif result.changes:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(result.text)
        os.replace(tmp, path)
        print(f"wrote {path}: {len(result.manifest.grants)} tools granted, "
              f"{result.manifest.digest}; review each grant", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _init(args: argparse.Namespace) -> int:
    from handrail.manifest import Manifest

    if args.servers:
        return _init_servers(args)
    if not args.target:
        raise UserError("manifest init needs MODULE:OBJECT (the code whose tools to grant), "
                        "or --servers (the tools of the [[servers]] the manifest declares)")
    toolbox, agent = resolve_toolset(args.target)
    manifest = Manifest.from_toolbox(
        toolbox,
        name=args.name or agent.get("name"),
        instructions=agent.get("instructions"),
        model=args.model or agent.get("model"),
        policy=agent.get("policy"),
    )
    text = manifest.to_toml()
    if args.output == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.output, "x" if not args.force else "w", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            raise UserError(
                f"{args.output} exists; pass --force to overwrite it, or -o to write elsewhere; "
                f"`handrail manifest update {args.target}"
                f"{'' if args.output == _DEFAULT_PATH else ' --manifest ' + args.output}` "
                "merges the code's changes into it and keeps what was written by hand"
            ) from None
        print(f"wrote {args.output}: {len(manifest.grants)} tool"
              f"{'s' if len(manifest.grants) != 1 else ''} granted, {manifest.digest}",
              file=sys.stderr)
    undescribed = [str(g.ref) for g in manifest.grants if g.description is None]
    if undescribed:
        print(f"note: no description for {', '.join(undescribed)}: write one in the manifest "
              "(or a docstring) before `handrail manifest check` will pass", file=sys.stderr)
    return 0


def _update(args: argparse.Namespace) -> int:
    from handrail.manifest import update

    try:
        with open(args.manifest, encoding="utf-8") as f:
            old_text = f.read()
    except FileNotFoundError:
        raise UserError(f"{args.manifest} does not exist; write one with `handrail manifest "
                        f"init {args.target or 'MODULE:OBJECT'}`") from None
    except OSError as exc:
        raise UserError(f"cannot read the manifest {args.manifest}: {exc.strerror}") from exc
    toolbox, agent = _target_or_servers(args.target, old_text, args.manifest)
    if _declares_servers(old_text, args.manifest):
        # The servers' tools are the manifest's too: a grant a server offers is kept.
        toolbox = _with_server_tools(toolbox, old_text, args.manifest)
    result = update(old_text, toolbox, agent, source=args.manifest)
    if not result.changes:
        print(f"{args.manifest} is up to date with {args.target or 'its servers'} "
              f"({result.manifest.digest})")
        return 0
    print(f"{args.manifest}: {len(result.changes)} change{'s' if len(result.changes) != 1 else ''}"
          f" from {args.target or 'its servers'}:")
    for change in result.changes:
        print(f"  - {change}")
    if result.note:
        print(f"note: {result.note}")
    print()
    sys.stdout.write(result.diff(args.manifest))
    if args.dry_run:
        print(f"(dry run: {args.manifest} was not written)")
        return 0
    tmp = f"{args.manifest}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(result.text)
    os.replace(tmp, args.manifest)  # whole or not at all
    print(f"wrote {args.manifest}: {result.manifest.digest}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from handrail.errors import HandrailError
    from handrail.manifest import Manifest, agent_problems, review

    try:
        manifest = Manifest.load(args.manifest)
        toolbox, agent = _target_or_servers(args.target, manifest, args.manifest)
    except HandrailError as exc:
        if not args.json:
            raise
        # A CI step reading --json gets JSON whatever went wrong.
        json.dump({"ok": False, "manifest": args.manifest, "target": args.target or None,
                   "error": str(exc)}, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return 1
    notes: list[str] = []
    if manifest.servers:  # MCP servers: their tools are checked too (see docs/mcp.md)
        from handrail.mcp import check_with_servers

        found, notes = check_with_servers(toolbox, manifest, strict=args.strict)
    else:
        found = review(toolbox, manifest, strict=args.strict)
    if agent:
        found.extend(agent_problems(manifest, instructions=agent.get("instructions"),
                                    model=agent.get("model")))
    errors = [p for p in found if p.severity == "error"]
    warnings = [p for p in found if p.severity == "warning"]
    if args.json:
        json.dump({"ok": not errors, "manifest": args.manifest, "target": args.target,
                   "digest": manifest.digest, "strict": args.strict,
                   "problems": [p.to_dict() for p in found], "notes": notes}, sys.stdout,
                  ensure_ascii=False)
        sys.stdout.write("\n")
        return 1 if errors else 0
    for note in notes:
        print(f"note: {note}")
    if errors:
        print(f"{args.manifest}: the code has drifted from the manifest ({_count(errors)}):")
        for problem in errors:
            print(f"  - {problem}")
    if warnings:
        print(f"{args.manifest}: {len(warnings)} warning{'s' if len(warnings) != 1 else ''} "
              "(errors under --strict):")
        for problem in warnings:
            print(f"  - {problem}")
    if errors:
        return 1
    what = args.target or f"the {len(manifest.servers)} server(s) it declares"
    print(f"OK: {what} match{'es' if args.target else ''} {args.manifest} "
          f"({len(manifest.grants)} tools, {manifest.digest})")
    return 0


def _target_or_servers(target: str | None, manifest: Any, path: str,
                       ) -> tuple[Any, dict[str, Any]]:
    """The code named on the command line, or none for a manifest of `[[servers]]` only.

    Raises:
        UserError: no MODULE:OBJECT, and the manifest declares no servers either.
    """
    if target:
        return resolve_toolset(target)
    if not _declares_servers(manifest, path):
        raise UserError(f"name the code to compare with {path} (MODULE:OBJECT): it declares "
                        "no [[servers]] whose tools could be checked on their own")
    from handrail.tools import Toolbox

    return Toolbox([]), {}


def _declares_servers(manifest: Any, path: str) -> bool:
    from handrail.manifest import Manifest

    if isinstance(manifest, str):
        manifest = Manifest.from_toml(manifest, source=path)
    return bool(manifest.servers)


def _with_server_tools(toolbox: Any, text: str, path: str) -> Any:
    """`toolbox` and the tools of the manifest's `[[servers]]`, started for the while."""
    import anyio

    from handrail.manifest import Manifest
    from handrail.mcp import connect_servers
    from handrail.tools import Toolbox

    manifest = Manifest.from_toml(text, source=path)

    async def listed() -> Any:
        async with connect_servers(manifest) as toolsets:
            # Read while connected; the specs are what `update` compares.
            return Toolbox([toolbox, *[i for t in toolsets for i in t.impls()]])

    return anyio.run(listed)


def _count(problems: list[Any]) -> str:
    return f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"


def _digest(args: argparse.Namespace) -> int:
    from handrail.manifest import Manifest, canonical_json

    manifest = Manifest.load(args.path)
    if args.canonical:
        sys.stdout.write(canonical_json(manifest.canonical()).decode("utf-8") + "\n")
    else:
        print(manifest.digest)
    return 0
