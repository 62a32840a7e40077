"""`MCPToolset`: another MCP server's tools, each one a `ToolImpl` behind the gate.

One session per toolset, owned by a background task (so a restart of a dead stdio server and the
final close run in the task that opened the transport, as anyio requires). Tools are listed
into `ToolSpec`s named `<local name>/<tool>`; the server's annotations are recorded on the spec
and never trusted: only a manifest grant can make an MCP tool non-mutating.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import anyio

from handrail.errors import (
    ConfigError,
    Disposition,
    InteractionDeclined,
    InvalidOutput,
    Issue,
    NotGranted,
    ToolError,
    ToolTimeout,
    TransportError,
    UnknownTool,
    UserError,
)
from handrail.manifest import ArgumentAction, ServerDecl
from handrail.mcp._content import DEFAULT_MAX_RESULT_BYTES, from_mcp_result, plain_call_result
from handrail.mcp._errors import map_mcp_error, require_sdk
from handrail.mcp._relay import RELAY, Relay
from handrail.tools import (
    Act,
    Action,
    CallContext,
    SchemaTool,
    ToolId,
    ToolImpl,
    ToolName,
    ToolResult,
    ToolSpec,
)

if TYPE_CHECKING:
    import mcp_types

    from handrail.manifest import Manifest
    from handrail.mcp._wire import Wire
    from handrail.policy import Policy
    from mcp import ClientSession

__all__ = ["MCPTool", "MCPToolset"]

DEFAULT_CALL_TIMEOUT = 60.0
"""Seconds one call may run without a result or a progress notification."""
DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds a server may take to start, initialise and list its tools."""
MAX_DESCRIPTION = 4096
"""A server's tool description is cut to this many characters (the manifest's replaces it)."""
_STDERR_TAIL = 2000


class MCPTool(SchemaTool):
    """One tool of an MCP server: validated against its JSON Schema, called over the session."""

    typed = False
    """Its schema comes from the server, not a Python type (the manifest may state it)."""

    def __init__(self, toolset: MCPToolset, remote: str, spec: ToolSpec,
                 actions: Sequence[ArgumentAction]) -> None:
        super().__init__(spec, self._run, origin=f"MCP server '{toolset.name}' tool {remote!r}")
        self.toolset = toolset
        self.remote_name = remote
        """The tool's name on the server (the spec's id carries our local server name)."""
        self.argument_actions = tuple(actions)
        """What the manifest says the arguments touch; empty: `call server/tool`."""
        self.tool_id = str(spec.id)
        """`str(spec.id)`, as every call's errors name the tool (made once, not a call)."""

    def actions(self, validated: Any) -> list[Action]:
        """The mapped argument actions, or `call server/tool` when none is mapped.

        Raises:
            ValueError: a mapped argument does not hold what its act needs (the gate refuses).
        """
        out: list[Action] = []
        for mapping in self.argument_actions:
            value = validated.get(mapping.argument)
            if value is None:
                continue
            if mapping.act is Act.EXEC:
                argv = value if isinstance(value, list) else [value]
                if not argv or not all(isinstance(a, str) for a in argv):
                    raise ValueError(f"argument '{mapping.argument}' must be an argv (strings)")
                out.append(Action(Act.EXEC, tuple(argv)))
                continue
            targets = value if isinstance(value, list) else [value]
            content = None
            if mapping.content is not None:
                text = validated.get(mapping.content)
                if isinstance(text, str):
                    content = text.encode("utf-8", "surrogatepass")
            for target in targets:
                if not isinstance(target, str):
                    raise ValueError(f"argument '{mapping.argument}' must be a string (or a "
                                     f"list of strings) to be checked as a {mapping.act.value} "
                                     "target")
                out.append(Action(mapping.act, target, content))
        return out or [self.default_action()]

    async def _run(self, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        result = await self.toolset.call_remote(self, arguments, ctx)
        confinement = self.toolset.confinement
        if confinement is None or "handrail.sandbox" in result.metadata:
            return result  # none, or a plain result made with it (`call_remote`)
        # How the server that answered was confined, in every call's record (docs/sandbox.md).
        return ToolResult(result.content, result.structured, result.is_error,
                          {**result.metadata, "handrail.sandbox": confinement})


class MCPToolset:
    """The tools of one MCP server, as a `Toolset` (see docs/mcp.md).

    ```python
    policy = hr.Policy.default().layer("mcp").allow("exec", "mcp-server-time")
    async with hr.mcp.MCPToolset.stdio("mcp-server-time", name="time", policy=policy) as time:
        agent = hr.Agent(model, [time], policy=policy)
    ```

    Entering it starts (or connects to) the server, once the policy allows it: a stdio server's
    argv is an EXEC action, an HTTP server's host a NET action; anything but allow refuses to
    start (nobody is there to approve at connect time). Leaving it closes the session.

    Args:
        name: The local name; tools are `name/<tool>` whatever the server calls itself.
        command: A stdio server's program (or `url`).
        args: Its arguments.
        env: Extra environment variables for it.
        cwd: Its working directory (default: `workspace`).
        url: A streamable HTTP server's URL (or `command`).
        headers: HTTP headers for it (a bearer token...).
        policy: Decides the start action; default `Policy.default()` (which asks: so allow it).
        workspace: The workspace the policy confines paths to; default the current directory.
        manifest: When given, a grant's `mutates = false` is what makes a tool non-mutating.
        actions: Per tool name, what its arguments touch (the manifest's `[servers.actions]`).
        timeout: Seconds a call may run without a result or progress; per-call deadline.
        connect_timeout: Seconds to start, initialise and list tools.
        max_result_bytes: A larger result is refused (InvalidOutput).
        sandbox: How a stdio server is confined (docs/sandbox.md): "auto", "required" or
            "off", derived from `policy` and `workspace` at each start like the programs of
            an agent's tools; how is in `confinement` and in every call's metadata.
        auth: For an HTTP server, an `httpx2.Auth` that authorizes its requests: the SDK's
            `mcp.client.auth.OAuthClientProvider` (or its client-credentials and
            identity-assertion providers). Every host the flow reaches is a NET action the
            policy decides; a server that answers 401 without it says where to authorize.
    """

    def __init__(
        self,
        *,
        name: str,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        policy: Policy | None = None,
        workspace: str | os.PathLike[str] | None = None,
        manifest: Manifest | None = None,
        actions: Mapping[str, Sequence[ArgumentAction]] | None = None,
        timeout: float | None = DEFAULT_CALL_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        sandbox: str = "auto",
        auth: Any = None,
    ) -> None:
        from handrail.sandbox import SANDBOX_MODES

        if sandbox not in SANDBOX_MODES:
            raise UserError(f"MCP server '{name}': sandbox must be one of {SANDBOX_MODES}, "
                            f"not {sandbox!r}")
        try:
            self.name = str(ToolName(name))
        except UserError as exc:
            raise UserError(f"MCPToolset name: {exc}") from None
        if (command is None) == (url is None):
            raise UserError(f"MCP server '{name}': give exactly one of command (stdio) or url "
                            "(streamable HTTP)")
        if isinstance(args, str):
            raise UserError(f"MCP server '{name}': args is a list of strings, not one string")
        if auth is not None and (url is None or not _is_httpx_auth(auth)):
            raise UserError(f"MCP server '{name}': auth is for an HTTP server (url=), and is an "
                            "httpx.Auth such as the SDK's mcp.client.auth.OAuthClientProvider, "
                            f"not {type(auth).__name__}")
        self.command = command
        self.args = tuple(str(a) for a in args)
        self.env = dict(env or {})
        self.url = url
        self.headers = dict(headers or {})
        self.workspace = Path(workspace or ".").resolve()
        self.cwd = Path(cwd).resolve() if cwd is not None else self.workspace
        self.policy = policy
        self.manifest = manifest
        self.argument_actions = {k: tuple(v) for k, v in (actions or {}).items()}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_result_bytes = max_result_bytes
        self.sandbox = sandbox
        self.confinement: dict[str, Any] | None = None
        """How the running stdio server was confined (`handrail.sandbox.wrap`'s record)."""
        self.refused_tools: list[str] = []
        """Tools the server offered that handrail cannot name (skipped, with the reason)."""
        self.ungranted: list[str] = []
        """Tools the server offers that the manifest (when given) does not grant: left out."""
        self.events: list[dict[str, Any]] = []
        """What happened to the connection (restarts), newest last."""
        self._impls: list[MCPTool] = []
        self._session: ClientSession | None = None
        self._wire: Wire | None = None  # a stdio server's own link, when the loop can serve it
        self._next_wire: Wire | None = None
        self._tg: Any = None
        self._stop = anyio.Event()
        self._reconnected = anyio.Event()
        self._restart_error: BaseException | None = None
        self._closing = False
        self._restarted_runs: set[str | None] = set()
        self._restart_lock = anyio.Lock()
        self._stderr: IO[bytes] | None = None
        self._in_flight: list[_InFlight] = []
        self._definitions: dict[str, bytes] = {}
        self._drifted: set[str] = set()
        self._removed: set[str] = set()
        self._rejected: dict[str, str] = {}  # a tool that appeared and failed the check
        self._watchers: list[Callable[[], Awaitable[None]]] = []
        self.server_info: Any = None
        """What the server says about itself (recorded, never used as its name)."""
        self.server_capabilities: Any = None
        """What the server declared it serves (`resources`, `prompts`...), from its handshake."""
        self.auth = auth
        self._resource_watchers: list[Callable[[str], Awaitable[None]]] = []
        self._hosts_allowed: set[str] = set()
        self.tools_changed = False
        """True once the server announced `tools/list_changed`, until the list is re-read."""
        self.list_changed = anyio.Event()
        """Set when the server first announces `tools/list_changed`."""
        self.version = 0
        """Grows each time `impls()` changes (a re-read list that differs): a `Toolbox`
        holding this toolset rebuilds itself when it sees a new version (`Toolbox.refreshed`)."""

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def stdio(cls, command: str, args: Sequence[str] = (), *, name: str,
              env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
              **options: Any) -> MCPToolset:
        """A server started as a subprocess and spoken to over its stdin/stdout."""
        return cls(name=name, command=command, args=args, env=env, cwd=cwd, **options)

    @classmethod
    def http(cls, url: str, *, name: str, headers: Mapping[str, str] | None = None,
             auth: Any = None, **options: Any) -> MCPToolset:
        """A server reached over streamable HTTP (`auth`: an OAuth provider; see the class)."""
        return cls(name=name, url=url, headers=headers, auth=auth, **options)

    @classmethod
    def from_manifest(cls, decl: ServerDecl, *, manifest: Manifest | None = None,
                      **options: Any) -> MCPToolset:
        """The server a manifest's `[[servers]]` entry declares."""
        if decl.timeout is not None:
            options.setdefault("timeout", decl.timeout)
        if decl.auth is not None and "auth" not in options:
            options["auth"] = _load_auth(decl)
        return cls(name=decl.name, command=decl.command, args=decl.args, env=decl.env,
                   cwd=decl.cwd, url=decl.url, headers=decl.headers, manifest=manifest,
                   actions=decl.actions, **options)

    # -- the Toolset protocol -------------------------------------------------------------

    def impls(self) -> list[ToolImpl]:
        """The server's tools (the Toolset protocol).

        Raises:
            UserError: the toolset is not connected (enter `async with toolset` first).
        """
        if self._session is None:
            raise UserError(f"MCP server '{self.name}' is not connected: enter "
                            "`async with toolset:` before handing it to an Agent or Toolbox")
        return list(self._impls)

    def withdrawn(self) -> dict[str, str]:
        """Tools no longer offered, by id, with the reason a call to one is refused.

        A tool the server removed, one it redefined after the manifest check, and one it added
        that the toolset's manifest does not grant (the Toolset protocol's optional part: a
        `Toolbox` tells the model this reason instead of "there is no tool named ...").
        """
        out: dict[str, str] = {}
        for remote in sorted(self._removed):
            out[f"{self.name}/{remote}"] = (
                f"MCP server '{self.name}' no longer offers '{remote}' (it changed its tool "
                "list); the call was not sent")
        for remote in sorted(self._drifted):
            out[f"{self.name}/{remote}"] = (
                f"MCP server '{self.name}' changed the definition of '{remote}' after it was "
                "checked against the manifest; it is refused until the toolset is entered "
                "again (and checked)")
        for remote, why in sorted(self._rejected.items()):
            out.setdefault(f"{self.name}/{remote}", why)
        for remote in self.ungranted:
            out.setdefault(f"{self.name}/{remote}", (
                f"MCP server '{self.name}' offers '{remote}', which the manifest does not "
                "grant; it is refused (grant it in handrail.toml to offer it)"))
        return out

    async def refresh(self) -> None:
        """Re-read the server's tools if it announced `tools/list_changed`; else nothing.

        Run before each model turn by the agent loop (through `Toolbox.refreshed`) and before
        each call: a new tool joins `impls()` (the manifest, when the toolset has one, must
        grant it), a removed one leaves it, and one whose definition (schemas, description)
        changed since it was checked leaves it too and is refused. `version` grows when
        `impls()` changed; the change is an `mcp_tools_changed` event in `events`.
        """
        session = self._session
        if not self.tools_changed or session is None or self._down(session):
            return
        try:
            with anyio.fail_after(self.connect_timeout):
                await self._refresh(session)
        except Exception as exc:  # boundary: the list stays as it was, the next turn retries
            self.events.append({"kind": "mcp_tools_refresh_failed", "server": self.name,
                                "error": f"{type(exc).__name__}: {exc}"[:1000],
                                "at": time.time()})

    def watch(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Call `callback()` (in the toolset's task group) at each `tools/list_changed`.

        `handrail serve` uses it to refresh its list and tell its own clients.
        """
        self._watchers.append(callback)

    # -- lifecycle ------------------------------------------------------------------------

    def start_action(self) -> Action:
        """What starting the server touches: EXEC of its argv, or NET of its URL's host."""
        if self.command is not None:
            return Action(Act.EXEC, (self.command, *self.args))
        import urllib.parse

        parts = urllib.parse.urlsplit(self.url or "")
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return Action(Act.NET, f"{host}:{port}")

    async def _check_host(self, request: Any) -> None:
        """An HTTP request of the session's: its host must be one the policy allows."""
        from handrail.policy import Effect, Policy

        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        target = f"{url.host}:{port}"
        if target in self._hosts_allowed:
            return
        policy = self.policy if self.policy is not None else Policy.default()
        action = Action(Act.NET, target)
        verdict = policy.check(action, workspace=self.workspace)
        if verdict.effect is not Effect.ALLOW:
            self.events.append({"kind": "mcp_host_refused", "server": self.name,
                                "target": target, "at": time.time()})
            raise ConfigError(
                f"MCP server '{self.name}': reaching {target} (for {url.path[:200]!r}) is "
                f"'{action.describe()}', which the policy does not allow "
                f"({verdict.effect.value}: {verdict.reason}); nothing was sent there. An "
                "OAuth flow reaches the server's authorization server: allow it explicitly, "
                f"e.g. policy.layer('mcp').allow('net', {target!r})")
        self._hosts_allowed.add(target)

    def _check_start(self) -> None:
        from handrail.policy import Effect, Policy

        policy = self.policy if self.policy is not None else Policy.default()
        action = self.start_action()
        verdict = policy.check(action, workspace=self.workspace)
        if verdict.effect is not Effect.ALLOW:
            raise ConfigError(
                f"starting MCP server '{self.name}' is '{action.describe()}', which the policy "
                f"does not allow ({verdict.effect.value}: {verdict.reason}); nothing was "
                "started. Allow it explicitly, e.g. policy.layer('mcp').allow("
                f"'{action.act.value}', {verdict.target!r})")

    async def __aenter__(self) -> MCPToolset:
        require_sdk()
        self._check_start()
        self._closing = False
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._tg.start(self._connection)
        except BaseException as exc:
            self._tg.cancel_scope.cancel()
            with contextlib.suppress(BaseException):
                await self._tg.__aexit__(None, None, None)
            self._tg = None
            try:
                # The failure is worded before the server's stderr is closed: its tail (why
                # it did not start) goes into the message.
                if isinstance(exc, Exception) and not isinstance(exc, UserError | ToolError):
                    raise self._start_failure(exc, await self._auth_hint()) from exc
                raise
            finally:
                self._close_stderr()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self._closing = True
        self._stop.set()
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                # The connection task closes the session and the server, in its own task; a
                # server that will not stop is cut off by the SDK's own shutdown timeouts,
                # and this deadline bounds the rest.
                tg.cancel_scope.deadline = anyio.current_time() + 10
                await tg.__aexit__(None, None, None)
        finally:
            self._session = None
            self._wire = None
            self._close_stderr()

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def stderr_tail(self) -> str:
        """The last lines a stdio server wrote to stderr (for messages); empty for HTTP."""
        f = self._stderr
        if f is None or f.closed:
            return ""
        try:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - _STDERR_TAIL))
            text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "".join(ch if ch.isprintable() or ch == "\n" else "?" for ch in text).strip()

    async def _auth_hint(self) -> str | None:
        """Why an HTTP server refused to start a session, when it is authorization.

        Asked once more, plainly, after a failed start: a 401 names the server's protected
        resource metadata in its `WWW-Authenticate` header (RFC 9728), which says where to
        authorize. None when the server did not answer 401 (or could not be asked).
        """
        if self.url is None:
            return None
        import re

        from mcp.shared._httpx_utils import create_mcp_http_client

        body = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
        try:
            with anyio.fail_after(min(self.connect_timeout, 10)):
                async with create_mcp_http_client(headers=self.headers or None) as http:
                    response = await http.post(self.url, json=body, headers={
                        "accept": "application/json, text/event-stream"})
        except Exception:  # boundary: the hint is a courtesy; the failure is reported anyway
            return None
        if response.status_code != 401:
            return None
        challenge = response.headers.get("www-authenticate", "")
        found = re.search(r'resource_metadata="([^"]{1,2000})"', challenge)
        where = (f"resource metadata at {found.group(1)}" if found
                 else "it names no resource metadata")
        given = " (the auth given was refused)" if self.auth is not None else ""
        return (f"the server requires authorization ({where}){given}; give "
                "MCPToolset.http(..., auth=...) an OAuth provider, e.g. the SDK's "
                "mcp.client.auth.OAuthClientProvider")

    def _start_failure(self, exc: BaseException, hint: str | None = None) -> UserError:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # the transports' task groups wrap the one cause
        tail = self.stderr_tail()
        how = (f"command {' '.join((self.command or '', *self.args))!r}"
               if self.command is not None else f"url {self.url!r}")
        reason = (hint if hint is not None else "it did not answer within "
                  f"{self.connect_timeout}s" if isinstance(exc, TimeoutError)
                  else f"{type(exc).__name__}: {exc}")
        return UserError(f"MCP server '{self.name}' ({how}) failed to start: {reason}"
                         + (f"\n--- its stderr ends with:\n{tail}" if tail else ""))

    async def _connection(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            self._stop = anyio.Event()
            try:
                async with contextlib.AsyncExitStack() as stack:
                    session = await self._open(stack)
                    wire, self._next_wire = self._next_wire, None
                    # Only awaits inside: the transports' task groups are entered above.
                    with anyio.fail_after(self.connect_timeout):
                        init = await session.initialize()
                        if wire is not None:
                            wire.version = str(init.protocol_version)
                        self.server_info = init.server_info
                        self.server_capabilities = init.capabilities
                        listed = await self._list(session)
                    if not started:
                        self._impls = self._build(listed)
                    self._session, self._wire = session, wire
                    if not started:
                        started = True
                        task_status.started()
                    else:
                        # A restarted server may list other tools: compared at the next turn.
                        self.tools_changed = True
                        self._restart_error = None
                        self._reconnected.set()
                    await self._stop.wait()
            except Exception as exc:
                if not started:
                    raise
                self._restart_error = exc
                self._reconnected.set()
                if not self._closing:
                    await self._stop.wait()
            if self._closing:
                return

    async def _open(self, stack: contextlib.AsyncExitStack) -> ClientSession:
        from mcp import ClientSession

        if self.command is not None:
            from handrail.sandbox import wrap
            from mcp import StdioServerParameters, stdio_client

            # Confined like every program handrail starts, from the same policy; off the
            # loop (it walks the workspace). Spawned by the SDK from the loop's thread, which
            # bwrap's --die-with-parent follows.
            argv, self.confinement = await anyio.to_thread.run_sync(
                lambda: wrap([self.command or "", *self.args], policy=self.policy,
                             workspace=self.workspace, mode=self.sandbox, cwd=self.cwd))
            self._close_stderr()
            self._stderr = tempfile.TemporaryFile()  # closed by _close_stderr
            if _own_link():
                from handrail.mcp._stdio import MAX_MESSAGE_BYTES
                from handrail.mcp._wire import open_wire

                # handrail's own link (mcp/_wire.py): `tools/call` spoken directly, the
                # rest of the protocol by the SDK's session over it.
                wire = await stack.enter_async_context(open_wire(
                    argv, env=self.env, cwd=str(self.cwd), errlog=self._stderr,
                    limit=max(MAX_MESSAGE_BYTES, 2 * self.max_result_bytes + (1 << 20))))
                self._next_wire = wire
                streams: Any = (wire.read, wire.write)
            else:
                params = StdioServerParameters(command=argv[0], args=argv[1:],
                                               env=self.env or None, cwd=str(self.cwd))
                streams = await stack.enter_async_context(
                    stdio_client(params, errlog=cast(Any, self._stderr)))
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = await stack.enter_async_context(
                create_mcp_http_client(headers=self.headers or None, auth=self.auth))
            # Every host the session reaches (an OAuth flow's authorization server, its
            # metadata, a redirect) is a NET action the policy decides, as the start was.
            client.event_hooks["request"].append(self._check_host)
            streams = await stack.enter_async_context(
                streamable_http_client(self.url or "", http_client=client))
        read, write = streams[0], streams[1]
        return await stack.enter_async_context(
            ClientSession(read, write, message_handler=self._on_message,
                          elicitation_callback=self._on_elicit,
                          sampling_callback=self._on_sampling,
                          logging_callback=self._on_log))

    async def _on_message(self, message: Any) -> None:
        import mcp_types as t

        if isinstance(message, t.ResourceUpdatedNotification):
            if self._tg is not None:
                for watcher in self._resource_watchers:
                    self._tg.start_soon(watcher, str(message.params.uri))
            return
        if isinstance(message, t.ToolListChangedNotification):
            self.tools_changed = True
            self.list_changed.set()
            if self._tg is not None:
                for callback in self._watchers:
                    self._tg.start_soon(callback)

    async def _refresh(self, session: ClientSession) -> None:
        """After `tools/list_changed`: list again, and hold the server to what was checked.

        A tool whose definition changed since it was listed (and checked) is withdrawn and
        refused from then on: the manifest check ran against the old one. A new tool is built
        like those listed at connection (the toolset's manifest, when given, must grant it);
        an agent's Toolbox then checks it against the agent's manifest before offering it.
        A removed tool is withdrawn; a call to it is refused, not sent.
        """
        async with self._restart_lock:
            if not self.tools_changed:
                return
            self.tools_changed = False
            try:
                listed = await self._list(session)
            except BaseException:
                self.tools_changed = True  # the next turn (or call) tries again
                raise
            seen: dict[str, mcp_types.Tool] = {}
            for tool in listed:
                seen.setdefault(tool.name, tool)
            changed = sorted(name for name, tool in seen.items()
                             if name in self._definitions and name not in self._drifted
                             and _definition(tool) != self._definitions[name])
            known = {impl.remote_name: impl for impl in self._impls}
            added = sorted(name for name in seen if name not in self._definitions)
            back = {name for name in seen if name in self._removed and name not in changed}
            removed = sorted(name for name in known if name not in seen)
            self._drifted.update(changed)
            self._removed.update(removed)
            self._removed.difference_update(seen)
            if not (changed or added or removed or back):
                return
            impls: list[MCPTool] = []
            refused_before, ungranted_before = len(self.refused_tools), len(self.ungranted)
            for tool in listed:
                name = tool.name
                if name in self._drifted:
                    continue
                if name in known:
                    impls.append(known.pop(name))
                    continue
                if name in self._definitions and name not in back:
                    continue  # listed twice, or not granted / refused when first listed
                self._definitions.setdefault(name, _definition(tool))
                back.discard(name)
                impl = self._build_one(tool, set())
                problem = None if impl is None else self._problem(impl)
                if problem is not None:
                    self._rejected[name] = problem
                elif impl is not None:
                    self._rejected.pop(name, None)
                    impls.append(impl)
            self._impls = impls
            self.version += 1
            self.events.append({"kind": "mcp_tools_changed", "server": self.name,
                                "changed": changed, "added": added, "removed": removed,
                                "refused": self.refused_tools[refused_before:],
                                "ungranted": self.ungranted[ungranted_before:],
                                "at": time.time()})

    def _problem(self, impl: MCPTool) -> str | None:
        """The toolset's manifest check of a tool that appeared: the first error, or None."""
        if self.manifest is None:
            return None
        from handrail.manifest import refusals

        return refusals([impl], self.manifest).get(str(impl.spec.id))

    async def _list(self, session: ClientSession) -> list[mcp_types.Tool]:
        import mcp_types as t

        tools: list[t.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a server paginating forever is cut off
            page = await session.list_tools(
                params=t.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _build(self, listed: Sequence[mcp_types.Tool]) -> list[MCPTool]:
        self._definitions = {tool.name: _definition(tool) for tool in listed}
        self.refused_tools = []
        self.ungranted = []
        seen: set[str] = set()
        impls = [impl for tool in listed if (impl := self._build_one(tool, seen)) is not None]
        return impls

    def _build_one(self, tool: mcp_types.Tool, seen: set[str]) -> MCPTool | None:
        """One listed tool as an `MCPTool`, or None (refused or not granted: noted)."""
        if tool.name in seen:
            self.refused_tools.append(f"{tool.name!r}: listed twice")
            return None
        seen.add(tool.name)
        try:
            tool_id = ToolId(self.name, tool.name)
        except UserError as exc:
            self.refused_tools.append(f"{tool.name!r}: {exc}")
            return None
        annotations = (tool.annotations.model_dump(mode="json", by_alias=True,
                                                   exclude_none=True)
                       if tool.annotations is not None else {})
        if tool.title:
            annotations.setdefault("title", tool.title)
        grant = self.manifest.grant(tool_id) if self.manifest is not None else None
        if self.manifest is not None and grant is None:
            # What a server offers is not ours to admit: a tool the manifest does not
            # grant is left out (never offered, never callable), and `withdrawn()` says so.
            self.ungranted.append(tool.name)
            return None
        try:
            spec = ToolSpec(
                tool_id,
                (tool.description or "")[:MAX_DESCRIPTION],
                dict(tool.input_schema),
                dict(tool.output_schema) if tool.output_schema is not None else None,
                annotations=annotations,
                # Hints are recorded, never trusted: only a grant makes a tool read-only.
                mutates=grant.mutates if grant is not None else True,
                idempotent=False,
                # A server may elicit during any call: the gate drives every MCP call as
                # a handler, so the form reaches the run's Responder (or pauses the run).
                interactions=frozenset({"form"}),
                timeout=None,
            )
            return MCPTool(self, tool.name, spec, self.argument_actions.get(tool.name, ()))
        except UserError as exc:
            self.refused_tools.append(f"{tool.name!r}: {exc}")
            return None

    # -- calls ----------------------------------------------------------------------------

    def _down(self, session: ClientSession) -> bool:
        """Whether `session`'s link is down (its own stdio link, or the SDK's transport)."""
        wire = self._wire
        return _closed(session) or (wire is not None and wire.closed
                                    and session is self._session)

    async def _live_session(self, tool: str, ctx: CallContext | None) -> ClientSession:
        """The session to send on; a dead stdio server is restarted once per run."""
        session = self._session
        if session is not None and not self._down(session):
            return session
        run_id = ctx.run_id if ctx is not None else None
        async with self._restart_lock:
            session = self._session
            if session is not None and not self._down(session):
                return session
            tail = self.stderr_tail()
            if self.command is None or run_id in self._restarted_runs or self._closing:
                raise TransportError(
                    f"MCP server '{self.name}' is gone (its connection closed) and was not "
                    f"restarted{' again in this run' if run_id in self._restarted_runs else ''}"
                    f"; '{tool}' was not sent" + (f"; its stderr ends with: {tail}" if tail
                                                  else ""),
                    disposition=Disposition.NOT_SENT)
            self._restarted_runs.add(run_id)
            self.events.append({"kind": "mcp_server_restarted", "server": self.name,
                                "run_id": run_id, "stderr_tail": tail, "at": time.time()})
            if ctx is not None:  # an event of the run's record too
                await ctx.record_event("mcp_server_restarted", server=self.name,
                                       stderr_tail=tail)
            self._reconnected = anyio.Event()
            self._stop.set()
            with anyio.move_on_after(self.connect_timeout + 5):
                await self._reconnected.wait()
            if self._restart_error is not None or self._session is None or \
                    self._down(self._session):
                raise TransportError(
                    f"MCP server '{self.name}' died and could not be restarted: "
                    f"{self._restart_error}; '{tool}' was not sent",
                    disposition=Disposition.NOT_SENT)
            return self._session

    async def call_remote(self, tool: MCPTool, arguments: dict[str, Any],
                          ctx: CallContext | None) -> ToolResult:
        """Send one `tools/call` and map its result (or failure); see `map_mcp_error`.

        The request runs in the connection's task group; this body waits for it, and for any
        elicitation the server makes meanwhile, which it puts to its own caller with
        `ctx.elicit` (so the run's Responder answers, or the run pauses). The deadline
        (`timeout`) restarts at each progress notification and stops while a person is asked.
        Cancelling this body cancels the request (the SDK tells the server).

        Over a stdio server's own link (`mcp/_wire.py`) there is no request task: the body
        sends the request itself and its mailbox receives the answer and the progress too;
        abandoned unanswered, the call is cancelled at the server (`notifications/cancelled`).
        """
        tool_id = tool.tool_id
        session = await self._live_session(tool_id, ctx)
        wire = self._wire
        if self.tools_changed:
            try:
                await self._refresh(session)
            except Exception as exc:  # boundary: a failed re-list is a failed call
                raise map_mcp_error(exc, tool=tool_id, server=self.name, sent=False) from exc
        withdrawn = self.withdrawn().get(tool_id) \
            if tool.remote_name in self._drifted or tool.remote_name in self._removed else None
        if withdrawn is not None:
            # A call made with a list from before the change (this turn's, or a Toolbox
            # built earlier): refused here, never sent under a name the server reassigned.
            if tool.remote_name in self._drifted:
                raise NotGranted(withdrawn)
            raise UnknownTool(withdrawn)
        timeout = self.timeout
        # The own link runs on asyncio only: its loop's clock is anyio's, without the look-up.
        now = anyio.current_time() if wire is None else asyncio.get_running_loop().time()
        deadline = now + timeout if timeout is not None else float("inf")
        mail = _Mailbox() if wire is None else _LoopMailbox()
        # The request task's scope; over the own link, a timer that puts a timeout in the
        # mailbox (the body enters no scope: a paused run's body may be closed elsewhere).
        scope: anyio.CancelScope | _Deadline = (
            anyio.CancelScope(deadline=deadline) if wire is None
            else _Deadline(deadline, mail, wire.deadlines))
        relay = RELAY.get()  # the gateway's client request this call serves, if any
        in_flight = _InFlight(mail, scope, relay)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            in_flight.heard.add("progress")
            if timeout is not None and scope.deadline != float("inf"):
                scope.deadline = anyio.current_time() + timeout
            text = None if message is None else str(message)[:1000]
            if ctx is not None:  # to the run's on_event, as `call_progress`
                await ctx.report_progress(progress, total, text)
            if relay is not None:  # and to the gateway's client, for its own request
                with contextlib.suppress(Exception):  # boundary: a client gone is not told
                    await relay.progress(progress, total, text)

        kind, value, rid = "timeout", None, None
        self._in_flight.append(in_flight)
        try:
            if wire is None:  # the SDK's session, in a request task
                async def request() -> None:
                    import mcp_types as t

                    call = t.CallToolRequest(params=t.CallToolRequestParams(name=tool.remote_name,
                                                                            arguments=arguments))
                    outcome: tuple[str, Any] = ("timeout", None)
                    try:
                        with cast(anyio.CancelScope, scope):
                            outcome = ("result", await session.send_request(
                                call, t.CallToolResult, progress_callback=on_progress))
                    except Exception as exc:  # boundary: mapped by the body, in its own task
                        outcome = ("error", exc)
                    with contextlib.suppress(anyio.ClosedResourceError):  # the body is gone
                        mail.put(outcome)

                self._tg.start_soon(request)
            else:
                try:
                    rid = await wire.request("tools/call", {"name": tool.remote_name,
                                                            "arguments": arguments}, mail)
                except anyio.ClosedResourceError as exc:  # the link went down: not sent
                    raise map_mcp_error(exc, tool=tool_id, server=self.name, sent=False,
                                        stderr_tail=self.stderr_tail()) from exc
            while True:
                kind, value = await mail.get()
                if kind == "elicit":
                    params, reply = value
                    with reply:
                        await reply.send(await self._elicit(params, ctx, scope, timeout))
                    continue
                if kind == "progress":
                    progress = _progress(value)
                    if progress is not None:
                        await on_progress(*progress)
                    continue
                if kind == "log":
                    await self._log_to(in_flight, value)
                    continue
                break  # a result, an error, or the deadline ("timeout")
        finally:
            self._in_flight.remove(in_flight)
            for left_kind, left in mail.close():
                if left_kind == "elicit":  # a form the body will never put: its server hears
                    left[1].close()  # cancel (the reply stream ends)
            scope.cancel()  # an abandoned body (cancelled, paused) takes its request along
            if rid is not None and wire is not None and wire.forget(rid):
                wire.cancel(rid, "the caller stopped waiting (deadline, or cancelled)")
        if wire is not None:
            kind, value = _answer(kind, value)
            if kind == "too_long":
                raise InvalidOutput(tool_id, [Issue(path="$", message=f"MCP server "
                                                    f"'{self.name}' sent {value}")])
            if kind == "result":
                confinement = self.confinement
                plain = plain_call_result(
                    value, max_bytes=self.max_result_bytes,
                    metadata=None if confinement is None else {"handrail.sandbox": confinement})
                if plain is not None:
                    return plain
                from pydantic import ValidationError

                from handrail.mcp._wire import check_call_result

                try:
                    value = check_call_result(value, wire.version)
                except ValidationError as exc:  # a malformed result (the server ran the tool)
                    raise map_mcp_error(exc, tool=tool_id, server=self.name) from exc
                except UnicodeEncodeError as exc:
                    # Malformed too: a lone surrogate (json.loads makes one from an escape) is
                    # no UTF-8, and the SDK's check of the result raises this, not a
                    # ValidationError.
                    raise InvalidOutput(tool_id, [Issue(
                        path="$", message=f"MCP server '{self.name}' sent a malformed result: "
                        f"text no UTF-8 can carry ({exc.reason})")]) from exc
        if kind == "error":
            from mcp.shared.exceptions import MCPError

            error = map_mcp_error(value, tool=tool_id, server=self.name,
                                  stderr_tail=self.stderr_tail())
            if in_flight.heard and error.disposition is Disposition.NOT_SENT:
                # The server was at work on this call (it reported progress, logged, asked):
                # an error now is not a refusal of the arguments, and it may have acted.
                said = (f"error {value.code}: {value.message}"[:1000]
                        if isinstance(value, MCPError) else f"{type(value).__name__}")
                raise TransportError(
                    f"MCP server '{self.name}' failed '{tool_id}' after it had begun (it sent "
                    f"{', '.join(sorted(in_flight.heard))} during the call), with {said}; "
                    "it may have acted, so the call is in doubt",
                    disposition=Disposition.IN_DOUBT) from value
            raise error from value
        if kind == "timeout":  # the deadline passed: the SDK sent notifications/cancelled
            raise ToolTimeout(f"MCP server '{self.name}' did not finish '{tool_id}' within "
                              f"{timeout}s (nor report progress)")
        return from_mcp_result(value, tool=tool_id, max_bytes=self.max_result_bytes)

    async def _elicit(self, params: Any, ctx: CallContext | None,
                      scope: anyio.CancelScope | _Deadline,
                      call_seconds: float | None) -> Any:
        """Put a server's form to this call's caller; the answer authorises nothing."""
        import mcp_types as t

        if ctx is None or getattr(params, "mode", "form") != "form":
            return t.ElicitResult(action="decline")
        schema = params.requested_schema
        schema = schema.model_dump(mode="json", by_alias=True, exclude_none=True) \
            if hasattr(schema, "model_dump") else dict(schema)
        scope.deadline = float("inf")  # a person is not the server being slow
        try:
            answer = await ctx.elicit(schema, str(params.message)[:MAX_DESCRIPTION])
        except InteractionDeclined:
            return t.ElicitResult(action="decline")
        finally:
            if call_seconds is not None:
                scope.deadline = anyio.current_time() + call_seconds
        return t.ElicitResult(action="accept", content=answer)

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        """The session's elicitation callback: route the form to the one call in flight."""
        import mcp_types as t

        if len(self._in_flight) != 1:
            # With several calls in flight nothing says which one asks; an answer meant for
            # one call must never reach another, so the server is told no.
            return t.ElicitResult(action="decline")
        call = self._in_flight[0]
        call.heard.add("a form")
        if call.relay is not None and call.relay.declares("elicitation"):
            return await self._relay_elicit(call, params)
        reply_send, reply_receive = anyio.create_memory_object_stream[Any](1)
        try:
            call.mail.put(("elicit", (params, reply_send)))
        except anyio.ClosedResourceError:
            reply_send.close()
            reply_receive.close()
            return t.ElicitResult(action="cancel")
        async with reply_receive:
            try:
                return await reply_receive.receive()
            except anyio.EndOfStream:  # the call ended (paused, cancelled) before answering
                return t.ElicitResult(action="cancel")
            finally:
                reply_send.close()


    async def _relay_elicit(self, call: _InFlight, params: Any) -> Any:
        """A form for the gateway's client's own user, who declared it can show one."""
        import mcp_types as t

        relay = call.relay
        assert relay is not None
        saved = call.scope.deadline
        call.scope.deadline = float("inf")  # a person is not the server being slow
        try:
            result = await relay.elicit(params)
        except Exception as exc:  # boundary: the client failed the form; the server is told
            await relay.record("mcp_elicitation", server=self.name, relayed="client",
                               action="cancel", error=f"{type(exc).__name__}: {exc}"[:500])
            return t.ElicitResult(action="cancel")
        finally:
            if self.timeout is not None and saved != float("inf"):
                call.scope.deadline = anyio.current_time() + self.timeout
        await relay.record("mcp_elicitation", server=self.name, relayed="client",
                           action=str(result.action),
                           message=str(getattr(params, "message", ""))[:500])
        return result

    async def _on_sampling(self, context: Any, params: Any) -> Any:
        """An upstream's `sampling/createMessage`: the gateway's client's model, if allowed.

        Only within a call `handrail serve` relays, to a client that declared `sampling`,
        and when the policy allows `call <server>/sampling/createMessage` (a model call made
        for the server). Each is a `mcp_sampling` event of the client's run.
        """
        import mcp_types as t

        from handrail.policy import Effect

        call = self._in_flight[0] if len(self._in_flight) == 1 else None
        if call is not None:
            call.heard.add("a sampling request")
        relay = call.relay if call is not None else None
        if relay is None or not relay.declares("sampling"):
            why = ("no client that can sample is behind this call" if relay is None
                   else "the MCP client did not declare sampling")
            if relay is not None:
                await relay.record("mcp_sampling", server=self.name, relayed=None, refused=why)
            return t.ErrorData(code=-32600, message=f"handrail: sampling refused: {why}")
        action = Action(Act.CALL, f"{self.name}/sampling/createMessage")
        policy = self.policy
        if policy is not None:
            verdict = policy.check(action, workspace=self.workspace, mutates=False)
            if verdict.effect is not Effect.ALLOW:
                why = f"the policy does not allow '{action.describe()}' ({verdict.reason})"
                await relay.record("mcp_sampling", server=self.name, relayed=None, refused=why)
                return t.ErrorData(code=-32600, message=f"handrail: sampling refused: {why}")
        saved = call.scope.deadline if call is not None else None
        if call is not None:
            call.scope.deadline = float("inf")  # the client's model is not the server
        try:
            result = await relay.sample(params)
        except Exception as exc:  # boundary: the client's failure goes to the server
            await relay.record("mcp_sampling", server=self.name, relayed="client",
                               error=f"{type(exc).__name__}: {exc}"[:500])
            return t.ErrorData(code=-32603, message=f"the client's sampling failed: {exc}"[:500])
        finally:
            if call is not None and self.timeout is not None and saved != float("inf"):
                call.scope.deadline = anyio.current_time() + self.timeout
        await relay.record("mcp_sampling", server=self.name, relayed="client",
                           max_tokens=getattr(params, "max_tokens", None),
                           model=str(getattr(result, "model", ""))[:200])
        return result

    async def _on_log(self, params: Any) -> None:
        """An upstream's log message: to the gateway's client of the one call in flight."""
        call = self._in_flight[0] if len(self._in_flight) == 1 else None
        if call is not None:
            await self._log_to(call, params)

    async def _log_to(self, call: _InFlight, params: Any) -> None:
        """A log message of the server's during `call`: to its gateway client, if any."""
        import mcp_types as t

        if not isinstance(params, t.LoggingMessageNotificationParams):  # the own link's
            from pydantic import ValidationError

            try:
                params = t.LoggingMessageNotificationParams.model_validate(params,
                                                                           by_name=False)
            except ValidationError:
                return  # malformed: dropped, as the SDK's session drops it
        call.heard.add("a log message")
        if call.relay is not None:
            with contextlib.suppress(Exception):  # boundary: a client gone is not told
                await call.relay.log(str(params.level), params.data, params.logger)

    # -- what else the server serves (for `handrail serve`) ----------------------------------

    def serves(self, capability: str) -> bool:
        """Whether the server declared `capability` (resources, prompts, completions...)."""
        return getattr(self.server_capabilities, capability, None) is not None

    def watch_resources(self, callback: Callable[[str], Awaitable[None]]) -> None:
        """Call `callback(uri)` at each `notifications/resources/updated` of the server."""
        self._resource_watchers.append(callback)

    async def forward(self, method: str, **params: Any) -> Any:
        """Send one request of the session's (`list_resources`, `read_resource`...).

        Bounded by `connect_timeout`; the SDK's error, or a `TransportError` when the
        server is gone, is the caller's to map.
        """
        import warnings

        session = await self._live_session(method, None)
        with anyio.fail_after(self.connect_timeout), warnings.catch_warnings():
            # Logging and resource subscriptions are deprecated at 2026-07-28; a server of
            # the handshake era still speaks them, and its client asked for them.
            warnings.simplefilter("ignore")
            return await getattr(session, method)(**params)


class _Mailbox:
    """What a call's request task or the own link (`mcp/_wire.py`) hand the waiting body.

    One buffer and one event: neither side passes a checkpoint, where an anyio memory stream
    checkpoints at each send and each receive (two more event-loop iterations per MCP call,
    ~10% of an agent's MCP call in instructions: issue 38). Touched only from the loop.
    """

    __slots__ = ("_event", "_items", "closed")

    def __init__(self) -> None:
        self._items: collections.deque[tuple[str, Any]] = collections.deque()
        self._event = anyio.Event()
        self.closed = False

    def put(self, item: tuple[str, Any]) -> None:
        """Hand `item` to the body; `ClosedResourceError` once the body has gone."""
        if self.closed:
            raise anyio.ClosedResourceError
        self._items.append(item)
        self._event.set()

    async def get(self) -> tuple[str, Any]:
        """The next item, in the order put (a cancellation point while it waits)."""
        while not self._items:
            await self._event.wait()
        item = self._items.popleft()
        if not self._items:
            self._event = anyio.Event()
        return item

    def close(self) -> list[tuple[str, Any]]:
        """Refuse further items; return those never taken."""
        self.closed = True
        left = list(self._items)
        self._items.clear()
        return left


class _LoopMailbox(_Mailbox):
    """A `_Mailbox` whose body waits on a bare future of the running asyncio loop.

    For the own link (`mcp/_wire.py`, asyncio only): an `anyio.Event` is an `asyncio.Event`
    behind a backend look-up, made at the start and again after each item taken, whose wait
    makes a future anyway; this makes the one future, only when the body has to wait
    (issue 38). A cancellation reaches the body at that future, as at the event's.
    """

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._items = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def put(self, item: tuple[str, Any]) -> None:
        """Hand `item` to the body; `ClosedResourceError` once the body has gone."""
        if self.closed:
            raise anyio.ClosedResourceError
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> tuple[str, Any]:
        """The next item, in the order put (a cancellation point while it waits)."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class _Sweep:
    """One timer for the deadlines of a link's calls (`_Deadline`), armed at the earliest.

    A timer a call (`loop.call_at`, then its cancel and the heap's clean-up) was a tenth of
    the own link's share of `handrail serve`'s call (issue 38); calls of one timeout have
    deadlines in the order they start, so one timer serves them all: armed for the first,
    and when it goes off, each deadline due gets its timeout and the timer is armed again
    for the earliest left. Joining and leaving is a set's add and discard.
    """

    __slots__ = ("_at", "_due", "_timer")

    def __init__(self) -> None:
        self._due: set[_Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._at = float("inf")

    def add(self, deadline: _Deadline) -> None:
        """Watch `deadline` (again, when it moved)."""
        self._due.add(deadline)
        if deadline._at < self._at:
            self._arm(deadline._at)

    def discard(self, deadline: _Deadline) -> None:
        """Stop watching `deadline` (its call is over, or a person is asked)."""
        self._due.discard(deadline)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer, self._at = None, float("inf")
        now = asyncio.get_running_loop().time()
        earliest = float("inf")
        for deadline in list(self._due):
            if deadline._at <= now:
                self._due.discard(deadline)
                deadline._expire()
            elif deadline._at < earliest:
                earliest = deadline._at
        if earliest != float("inf"):
            self._arm(earliest)


class _Deadline:
    """A call's deadline over the own link: at it, `("timeout", None)` goes in the mailbox.

    Set like a cancel scope's (`deadline`: restarted by progress, infinite while a person
    is asked); `cancel()` stops it. No scope is entered, so nothing ties the call's body to
    one task. With a `sweep` (the link's), its timer is the sweep's; else a timer its own.
    """

    __slots__ = ("_at", "_mail", "_sweep", "_timer")

    def __init__(self, deadline: float, mail: _Mailbox, sweep: _Sweep | None = None) -> None:
        self._mail = mail
        self._timer: Any = None
        self._sweep = sweep
        self._at = deadline
        self._arm()

    @property
    def deadline(self) -> float:
        return self._at

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._at = value
        self._arm()

    def _arm(self) -> None:
        sweep = self._sweep
        if sweep is not None:
            if self._at != float("inf") and not self._mail.closed:
                sweep.add(self)
            else:
                sweep.discard(self)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._at != float("inf") and not self._mail.closed:
            self._timer = asyncio.get_running_loop().call_at(self._at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if asyncio.get_running_loop().time() < self._at:
            self._arm()  # moved later meanwhile
            return
        self._expire()

    def _expire(self) -> None:
        with contextlib.suppress(anyio.ClosedResourceError):  # the call is over
            self._mail.put(("timeout", None))

    def cancel(self) -> None:
        if self._sweep is not None:
            self._sweep.discard(self)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass(eq=False)
class _InFlight:
    mail: _Mailbox
    scope: anyio.CancelScope | _Deadline
    relay: Relay | None = None
    """The gateway client request the call serves (`handrail serve`), else None."""
    heard: set[str] = field(default_factory=set)
    """What the server sent during the call (progress, a log message, a form...)."""


def _own_link() -> bool:
    """Whether a stdio server gets handrail's own link (asyncio on POSIX; `mcp/_wire.py`)."""
    import sys

    if sys.platform == "win32":  # the link's modules use fcntl and the loop's pipes
        return False
    from handrail.mcp._wire import lean_available

    return lean_available()


def _answer(kind: str, value: Any) -> tuple[str, Any]:
    """What the link put in a call's mailbox, as the SDK's session would have raised it."""
    if kind == "result":  # the common case: no import statement run (issue 38)
        return kind, value
    from mcp.shared.exceptions import MCPError

    from handrail.mcp._errors import CONNECTION_CLOSED

    if kind == "gone":  # sent, and the server's stdout ended before it answered
        return "error", MCPError(CONNECTION_CLOSED, "Connection closed")
    if kind == "error":
        code = value.get("code") if isinstance(value, dict) else None
        message = value.get("message") if isinstance(value, dict) else None
        if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
            return "error", MCPError(-32603, "a malformed error response")
        return "error", MCPError(code, message[:2000], value.get("data"))
    return kind, value


def _progress(params: Any) -> tuple[float, float | None, str | None] | None:
    """A `notifications/progress`'s figures, or None when they are malformed (ignored)."""
    import mcp_types as t
    from pydantic import ValidationError

    try:
        checked = t.ProgressNotificationParams.model_validate(params, by_name=False)
    except ValidationError:
        return None
    return checked.progress, checked.total, checked.message


def _load_auth(decl: ServerDecl) -> Any:
    """The `auth = "MODULE:OBJECT"` of a `[[servers]]` entry: an httpx2.Auth, or made by one.

    Raises:
        UserError: it cannot be imported, or is neither an httpx2.Auth nor a function of
            the entry returning one.
    """
    import importlib

    ref = decl.auth or ""
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"MCP server '{decl.name}': auth = {ref!r} cannot be loaded: "
                        f"{exc}") from exc
    if not _is_httpx_auth(obj) and callable(obj):
        obj = obj(decl)
    if not _is_httpx_auth(obj):
        raise UserError(f"MCP server '{decl.name}': auth = {ref!r} is a "
                        f"{type(obj).__name__}, not an httpx2.Auth (such as the SDK's "
                        "mcp.client.auth.OAuthClientProvider) nor a function returning one")
    return obj


def _is_httpx_auth(auth: object) -> bool:
    try:
        import httpx2
    except ImportError:  # an SDK without its own httpx: the usual one
        import httpx as httpx2  # type: ignore[no-redef]
    return isinstance(auth, httpx2.Auth)


def _definition(tool: mcp_types.Tool) -> bytes:
    """What the manifest check saw of a tool, canonically (to notice a changed definition)."""
    from handrail.manifest import canonical_json

    return canonical_json({"input": tool.input_schema, "output": tool.output_schema,
                           "description": tool.description})


def _closed(session: ClientSession) -> bool:
    # The dispatcher knows the link is down before anything is sent; it keeps that private,
    # and without it a dead server could not be told from one that died mid-call.
    dispatcher = getattr(session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))
