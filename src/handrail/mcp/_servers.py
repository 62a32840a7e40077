"""The MCP servers a manifest declares: connecting them all, and checking their hints.

Used by `handrail serve` and `handrail manifest check`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

from handrail.manifest import Problem
from handrail.mcp._client import MCPTool, MCPToolset

if TYPE_CHECKING:
    from handrail.manifest import Manifest
    from handrail.policy import Policy

__all__ = ["check_with_servers", "connect_servers", "hint_problems"]


@contextlib.asynccontextmanager
async def connect_servers(manifest: Manifest, *, policy: Policy | None = None,
                          workspace: str | os.PathLike[str] = ".", sandbox: str = "auto",
                          ) -> AsyncIterator[list[MCPToolset]]:
    """Enter an `MCPToolset` for every `[[servers]]` entry; all are closed on exit.

    `policy` decides each start (default: the manifest's policy, else `Policy.default()`)
    and confines each stdio server as `sandbox` says (docs/sandbox.md).
    """
    if policy is None:
        policy = manifest.policy
    async with contextlib.AsyncExitStack() as stack:
        toolsets = []
        for decl in manifest.servers:
            toolset = MCPToolset.from_manifest(decl, manifest=manifest, policy=policy,
                                               workspace=workspace, sandbox=sandbox)
            toolsets.append(await stack.enter_async_context(toolset))
        yield toolsets


def hint_problems(toolsets: Iterable[MCPToolset], manifest: Manifest
                  ) -> tuple[list[str], list[str]]:
    """Where a server's `readOnlyHint` and the manifest's `mutates` disagree.

    Returns (problems, notes). A grant of `mutates = false` for a tool its server does not
    call read-only is a problem: the manifest exempts from asking what may change the world.
    A read-only hint on a tool granted as mutating is a note: the manifest is the stricter,
    and it stays the authority (hints are never trusted).
    """
    problems: list[str] = []
    notes: list[str] = []
    for toolset in toolsets:
        for impl in toolset.impls():
            if not isinstance(impl, MCPTool):
                continue
            grant = manifest.grant(impl.spec.id)
            if grant is None:
                continue
            hinted = impl.spec.annotations.get("readOnlyHint") is True
            if not grant.mutates and not hinted:
                problems.append(
                    f"tool '{impl.spec.id}' is granted with mutates = false, but MCP server "
                    f"'{toolset.name}' does not declare it read-only (readOnlyHint is "
                    f"{impl.spec.annotations.get('readOnlyHint', 'absent')}) — calls would "
                    "skip the ask for mutating tools on the manifest's word alone; grant it "
                    "with mutates = true unless you have checked that it changes nothing")
            elif grant.mutates and hinted:
                notes.append(
                    f"tool '{impl.spec.id}': MCP server '{toolset.name}' hints it is "
                    "read-only, but the manifest grants it as mutating (calls ask as for a "
                    "mutating tool; grant mutates = false if you have checked the hint)")
    return problems, notes


def check_with_servers(toolset: object, manifest: Manifest, *, strict: bool = False,
                       ) -> tuple[list[Problem], list[str]]:
    """`handrail manifest check` for a manifest with `[[servers]]`: (problems, notes).

    The servers are started (their start actions are decided by the manifest's policy), and
    the Python tools and the servers' granted tools are reviewed against the manifest together
    (`hr.manifest.review`, `strict` as there), then each server's hints against its grants
    (errors: a hint that claims more safety than the grant allows). An awaited grant
    (`awaited = true`) its server does not list yet is a note.
    """
    import anyio

    from handrail.manifest import review
    from handrail.tools import Toolbox

    async def check() -> tuple[list[Problem], list[str]]:
        async with connect_servers(manifest) as toolsets:
            box = Toolbox([toolset, *toolsets])
            found = review(box, manifest, strict=strict)
            hinted, notes = hint_problems(toolsets, manifest)
            listed = {str(spec.id) for spec in box.specs()}
            notes += [f"tool '{g.ref}' is awaited: server '{g.ref.server}' does not list it "
                      "yet; it is offered once listed, if it passes the check against its grant"
                      for g in manifest.grants if g.awaited and str(g.ref) not in listed]
            return found + [Problem(kind="server_hint", severity="error", message=h)
                            for h in hinted], notes

    return anyio.run(check)
