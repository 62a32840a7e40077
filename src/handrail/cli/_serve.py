"""`handrail serve`: one governed toolset as an MCP server (stdio, or streamable HTTP).

```
handrail serve [MODULE:OBJECT] [--manifest handrail.toml] [--stdio | --http HOST:PORT]
               [--store URL] [--approval-timeout SECONDS] [--token-file FILE | --no-auth]
```

The tools are those of the Toolbox/Agent/Toolset named on the command line plus the MCP
servers the manifest declares (`[[servers]]`). Every call passes the gate and is recorded in a
run of the client's session. stdout belongs to the protocol under `--stdio`: everything this
command says goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from handrail.errors import UserError

__all__ = ["register"]

_DEFAULT_MANIFEST = "handrail.toml"


def register(sub: Any) -> None:
    """Add `serve` to the `handrail` parser."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve a governed toolset over MCP (stdio or streamable HTTP)",
        description="Expose the tools of MODULE:OBJECT (a Toolbox, Agent or Toolset) and the "
        "MCP servers the manifest declares as one MCP server; every call passes the gate.")
    p.add_argument("target", nargs="?", metavar="MODULE:OBJECT",
                   help="a Toolbox, Agent, Toolset or list of tools (optional)")
    p.add_argument("--manifest", help=f"the manifest (default {_DEFAULT_MANIFEST} when present)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (default)")
    mode.add_argument("--http", metavar="HOST:PORT",
                      help="serve streamable HTTP at http://HOST:PORT/mcp")
    from handrail.cli._runs import add_store_option

    add_store_option(p, "the run store (default: $HANDRAIL_STORE or ./.handrail/runs.db); "
                     "'memory' keeps runs in this process only (no approval from another "
                     "process can reach them)")
    p.add_argument("--workspace", help="the directory paths are confined to (default: the "
                   "served agent's workspace, else the current directory)")
    p.add_argument("--approval-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long a call waits for `handrail approve` (default 30)")
    p.add_argument("--sandbox", choices=("auto", "required", "off"),
                   help="how programs are confined (the tools' and the manifest's stdio "
                   "[[servers]]), derived from the policy (docs/sandbox.md; default: the "
                   "served agent's, else auto; a stricter agent's wins)")
    p.add_argument("--client-approval", metavar="ACTS", default="",
                   help="acts (comma-separated: write,call) whose asks may be put to the MCP "
                        "client's own user by a form, when the client declared elicitation "
                        "(default: none; every ask waits for a person in the queue)")
    p.add_argument("--token-file", help="HTTP: read the bearer token from this file")
    p.add_argument("--idle-timeout", type=_seconds, metavar="SECONDS",
                   help="HTTP: end a client's run after this long without a call, as the "
                   "MCP SDK ends its session (default 1800; 0: never)")
    p.add_argument("--no-auth", action="store_true",
                   help="HTTP: accept clients without a bearer token (explicitly insecure)")
    # A long-running server of many runs: the collector is tuned for it (cli.main).
    p.set_defaults(func=_serve, many_runs=True)


def _seconds(text: str) -> float:
    """`--idle-timeout`: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"takes a number of seconds (0: never), got {text!r}")
    return value


def _say(text: str) -> None:
    print(f"handrail serve: {text}", file=sys.stderr, flush=True)


def _tools_of(obj: Any) -> tuple[list[Any], Any, Any, Any]:
    """(tools, policy, manifest, the agent or None) from what MODULE:OBJECT names."""
    from handrail.runs import Agent
    from handrail.tools import Toolbox, ToolImpl, Toolset

    if isinstance(obj, Agent):
        return [obj.toolbox], obj.policy, obj.manifest, obj
    if isinstance(obj, Toolbox | Toolset | ToolImpl) or hasattr(obj, "__handrail_tool__"):
        return [obj], None, None, None
    if isinstance(obj, list | tuple):
        return list(obj), None, None, None
    raise UserError(f"handrail serve takes a Toolbox, an Agent, a Toolset or a list of tools, "
                    f"not {type(obj).__name__}")


def _token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the bearer token, the file it is in when serve made it); (None, None): --no-auth."""
    from handrail.cli._token_file import read_token_file, write_token_file

    if args.no_auth:
        return None, None
    if args.token_file:
        return read_token_file(args.token_file), None
    import secrets

    # Printed, a token would land in the service's logs: it goes into a private file, and
    # serve prints where that file is.
    token = secrets.token_urlsafe(32)
    return token, write_token_file(token, prefix="handrail-serve-")


def _serve(args: argparse.Namespace) -> int:
    from handrail.cli._runs import _store_path, load_object
    from handrail.manifest import Manifest
    from handrail.mcp import Gateway, connect_servers
    from handrail.policy import Policy
    from handrail.runs import governance_for
    from handrail.store import Store
    from handrail.store.contract import redacted_url
    from handrail.tools import Toolbox

    tools: list[Any] = []
    policy = manifest = agent = None
    if args.target:
        tools, policy, manifest, agent = _tools_of(load_object(args.target))
    path = args.manifest or (_DEFAULT_MANIFEST if os.path.exists(_DEFAULT_MANIFEST) else None)
    if path is not None:
        manifest = Manifest.load(path)
    elif manifest is None and not tools:
        raise UserError("nothing to serve: name MODULE:OBJECT or a --manifest with [[servers]]")
    if manifest is not None and manifest.policy is not None:
        policy = manifest.policy if policy is None else manifest.policy.contain(policy)
    # One governance for every session: the served agent's, the manifest's and the flags',
    # the stricter winning (or a refusal to start, saying which piece).
    governance, notes = governance_for(agent, policy=policy or Policy.default(),
                                       manifest=manifest, workspace=args.workspace,
                                       sandbox=args.sandbox)
    host, port = None, 0
    if args.http:
        host, sep, port_text = args.http.rpartition(":")
        if not sep or not port_text.isdigit():
            raise UserError(f"--http takes HOST:PORT, got {args.http!r}")
        host = host or "127.0.0.1"  # `:8765` means loopback, never every interface
        port = int(port_text)
    if args.idle_timeout is not None and not args.http:
        raise UserError("--idle-timeout is for --http clients (a stdio client is the "
                        "process's one client: its run ends when it closes the pipe)")
    # Not given: the gateway's default (30 minutes); 0: never.
    idle: dict[str, Any] = ({} if args.idle_timeout is None else
                            {"idle_seconds": args.idle_timeout or None})
    for note in notes:
        _say(note)
    if manifest is not None and any(d.command is not None for d in manifest.servers):
        from handrail.cli._demo import sandbox_line

        _say(sandbox_line(governance.sandbox))
    url = "memory" if args.store == "memory" else _store_path(args)
    _say(f"store {redacted_url(url)}; workspace {governance.workspace}; sandbox "
         f"{governance.sandbox}"
         + (f"; control {governance.control.describe()}" if governance.control else ""))

    token, made = _token(args) if args.http else (None, None)
    where = made or args.token_file

    async def main() -> int:
        store = Store.memory() if url == "memory" else Store.open(url)
        try:
            async with contextlib.AsyncExitStack() as stack:
                upstream = [] if manifest is None else await stack.enter_async_context(
                    connect_servers(manifest, policy=governance.policy,
                                    workspace=governance.workspace,
                                    sandbox=governance.sandbox))
                gateway = Gateway(Toolbox([*tools, *upstream]), store=store, manifest=manifest,
                                  governance=governance,
                                  approval_timeout=args.approval_timeout, **idle,
                                  client_approval=[a.strip() for a in
                                                   args.client_approval.split(",")
                                                   if a.strip()])
                names = ", ".join(s.id.model_name for s in gateway.offered()) or "(none)"
                if host is None:
                    _say(f"serving {names} over stdio")
                    await gateway.serve_stdio()
                else:
                    from handrail.mcp import serve_http

                    await serve_http(gateway, host, port, token=token, announce=_say,
                                     token_file=where)
        finally:
            await store.close()
        return 0

    import anyio

    if made is not None:
        import signal

        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            # uvicorn stops on SIGTERM, then raises it again with the handler it found:
            # this one lets the token file below be removed before the process ends.
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return anyio.run(main)
    finally:
        if made is not None:
            from handrail.cli._token_file import remove_token_file

            remove_token_file(made)
