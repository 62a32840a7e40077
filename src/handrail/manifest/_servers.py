"""`[[servers]]`: the MCP servers a manifest declares, and what their tools' arguments touch.

```toml
[[servers]]
name = "fs"                       # the local name: tools are granted as "fs/<tool>"
command = "npx"                   # a stdio server: command, args, env, cwd
args = ["@modelcontextprotocol/server-filesystem", "."]
timeout = 30                      # per-call seconds (default 60)

[servers.actions]                 # per tool: which arguments are paths, hosts, argv...
write_file = [{ act = "write", argument = "path", content = "content" }]
read_text_file = [{ act = "read", argument = "path" }]

[[servers]]
name = "remote"
url = "http://127.0.0.1:8000/mcp" # a streamable HTTP server
```

A tool listed under `actions` is decided on those actions (so path rules, confinement and the
secrets layer govern it as they govern the workspace tools); any other tool of the server is a
`call server/tool` action. This part of the manifest is hashed into its digest (under
`"servers"`, present only when a manifest declares servers, so older digests do not change).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from handrail.errors import ManifestError, UserError
from handrail.tools import Act, ToolName

if TYPE_CHECKING:
    from handrail.manifest._locate import Path

__all__ = ["SERVER_KEYS", "ArgumentAction", "ServerDecl", "parse_servers"]

SERVER_KEYS = ("name", "command", "args", "env", "cwd", "url", "headers", "timeout", "actions",
               "names", "auth")
"""The keys a `[[servers]]` entry accepts."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ArgumentAction:
    """One action a call touches, taken from one of its arguments.

    `ArgumentAction(act=Act.WRITE, argument="path", content="content")`: the call writes the
    path in its `path` argument, with the text of its `content` argument as the bytes. An
    argument holding a list gives one action per element.
    """

    act: Act
    """What is done to the argument's value (read/write: a path; net: a host; exec: argv)."""
    argument: str
    """The argument (a top-level property of the tool's input) holding the target."""
    content: str | None = None
    """For WRITE: the argument holding the text written, shown to approvers."""

    def __post_init__(self) -> None:
        if not isinstance(self.act, Act):
            object.__setattr__(self, "act", Act(self.act))
        if not isinstance(self.argument, str) or not self.argument:
            raise ManifestError("an action's argument must name an argument of the tool")
        if self.content is not None and self.act is not Act.WRITE:
            raise ManifestError("content = names the written text; only a write has one")

    def canonical(self) -> dict[str, Any]:
        """JSON form, for the digest."""
        return {"act": self.act.value, "argument": self.argument, "content": self.content}


NAMES = (None, "upstream", "prefixed")
"""The values of a `[[servers]]` entry's `names` (None: not stated)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerDecl:
    """One `[[servers]]` entry: how to reach an MCP server, and its tools' argument actions."""

    name: str
    """The local name; its tools are `name/<tool>` whatever the server calls itself."""
    command: str | None = None
    """The program of a stdio server."""
    args: tuple[str, ...] = ()
    """Its arguments."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for it."""
    cwd: str | None = None
    """Its working directory (default: the workspace)."""
    url: str | None = None
    """The URL of a streamable HTTP server (instead of `command`)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """HTTP headers sent to it (not hashed: they hold tokens)."""
    timeout: float | None = None
    """Per-call seconds; None for the default."""
    actions: Mapping[str, tuple[ArgumentAction, ...]] = field(default_factory=dict)
    """Per tool name: the actions its calls touch, taken from their arguments."""
    names: str | None = None
    """How `handrail serve` shows its tools and prompts to MCP clients: "upstream" (the
    server's own names), "prefixed" (`<name>--<tool>`, the model-facing encoding); None: the
    default, "upstream" when the manifest declares one server, else "prefixed"."""
    auth: str | None = None
    """For an HTTP server: `MODULE:OBJECT`, an `httpx2.Auth` (the SDK's OAuth providers) or a
    function of this entry returning one (`MCPToolset.from_manifest` imports it). The
    manifest names the code; its secrets stay out of the file."""

    def __post_init__(self) -> None:
        try:
            ToolName(self.name)
        except UserError as exc:
            raise ManifestError(f"[[servers]] name: {exc}") from None
        if (self.command is None) == (self.url is None):
            raise ManifestError(f"server '{self.name}' needs exactly one of command = "
                                "(a stdio server) or url = (an HTTP server)")
        if self.auth is not None:
            module, sep, attr = self.auth.partition(":")
            if self.url is None or not (sep and module and attr):
                raise ManifestError(f"server '{self.name}': auth is for an HTTP server (url =) "
                                    "and names an OAuth provider as MODULE:OBJECT, not "
                                    f"{self.auth!r}")
        if self.names not in NAMES:
            raise ManifestError(f"server '{self.name}': names must be one of "
                                f"{', '.join(repr(n) for n in NAMES if n)}, not {self.names!r}")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "actions", {k: tuple(v) for k, v in self.actions.items()})

    def canonical(self) -> dict[str, Any]:
        """JSON form, for the digest (headers left out: they carry credentials)."""
        out = {
            "name": self.name, "command": self.command, "args": list(self.args),
            "env": dict(sorted(self.env.items())), "cwd": self.cwd, "url": self.url,
            "timeout": self.timeout,
            "actions": {tool: [a.canonical() for a in acts]
                        for tool, acts in sorted(self.actions.items())},
        }
        if self.names is not None:  # only when stated: older manifests keep their digest
            out["names"] = self.names
        if self.auth is not None:  # which code authorizes: reviewed like the rest
            out["auth"] = self.auth
        return out


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _string_table(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def parse_servers(reader: Any, entries: Any) -> list[ServerDecl]:
    """Check and build the `[[servers]]` entries; problems go to `reader.error`."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        reader.error(("servers",), "servers must be a list of [[servers]] tables")
        return []
    out: list[ServerDecl] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        path: Path = ("servers", index)
        where = f"in [[servers]] #{index + 1}"
        reader.known(entry, path, "servers")
        ok = True

        def bad(key: str, message: str, path: Path = path, where: str = where) -> None:
            nonlocal ok
            ok = False
            reader.error((*path, key), f"{key} {where} {message}")

        name = entry.get("name")
        if not isinstance(name, str):
            bad("name", "must be the server's local name (a string)")
        elif name in seen:
            bad("name", f"repeats '{name}'; each server needs its own name")
        else:
            seen.add(name)
        for key in ("command", "cwd", "url", "auth"):
            if key in entry and not isinstance(entry[key], str):
                bad(key, "must be a string")
        if "args" in entry and not _strings(entry["args"]):
            bad("args", "must be a list of strings")
        for key in ("env", "headers"):
            if key in entry and not _string_table(entry[key]):
                bad(key, "must be a table of strings")
        names = entry.get("names")
        if names not in NAMES:
            bad("names", 'must be "upstream" (the server\'s own tool names, to MCP clients) '
                'or "prefixed" (<server>--<tool>)')
        timeout = entry.get("timeout")
        if timeout is not None and not (type(timeout) in (int, float) and math.isfinite(timeout)
                                        and timeout > 0):
            bad("timeout", "must be a positive number of seconds")
        actions: dict[str, tuple[ArgumentAction, ...]] = {}
        raw_actions = entry.get("actions", {})
        if not isinstance(raw_actions, dict):
            bad("actions", "must be a table: tool name = [{ act = ..., argument = ... }]")
            raw_actions = {}
        for tool, specs in raw_actions.items():
            if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
                bad("actions", f"for '{tool}' must be a list of {{ act, argument }} tables")
                continue
            built = []
            for spec in specs:
                unknown = set(spec) - {"act", "argument", "content"}
                if unknown:
                    bad("actions", f"for '{tool}' has unknown key(s) {sorted(unknown)} "
                        "(known: act, argument, content)")
                    continue
                try:
                    built.append(ArgumentAction(act=Act(spec.get("act")),
                                                argument=spec.get("argument"),
                                                content=spec.get("content")))
                except (ValueError, ManifestError) as exc:
                    bad("actions", f"for '{tool}': {exc} (act is one of read, write, exec, "
                        "net, call)")
            actions[tool] = tuple(built)
        if not ok:
            continue
        try:
            out.append(ServerDecl(
                name=name, command=entry.get("command"), args=tuple(entry.get("args", ())),
                env=dict(entry.get("env", {})), cwd=entry.get("cwd"), url=entry.get("url"),
                headers=dict(entry.get("headers", {})),
                timeout=None if timeout is None else float(timeout), actions=actions,
                names=names, auth=entry.get("auth")))
        except ManifestError as exc:
            reader.error(path, f"{exc}")
    return out
