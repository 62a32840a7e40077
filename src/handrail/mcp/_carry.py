"""What `handrail serve` carries besides tools: resources, prompts, completion, logging.

The gateway serves what its upstream MCP servers serve, each request routed to the server
that offers the thing, and governed: reading a resource is an action the policy decides
(`read <path>` for a `file://` URI, `call <server>/<scheme>/<rest of the URI>` otherwise),
getting a prompt is `call <server>/prompt/<name>`; both are decided as reads
(`mutates=False`). A read the policy allows is served, one it denies refused; one it asks
about is asked like a call (`read_tools`: a pending request, the wait, the retry), a prompt
it asks about is refused. Each is an event of the client's run (`mcp_resource_read`,
`mcp_prompt_get`).

And how its tools and prompts are named to its clients (`client_names`): a `[[servers]]`
entry's `names` ("upstream", the default for a manifest with one server: the server's own
names; "prefixed": `<server>--<tool>`, the encoding models see). Two tools shown by the same
name are refused when the gateway starts.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from handrail.errors import ConfigError
from handrail.tools import Act, Action, CallContext, Tool, Toolbox, ToolResult, ToolSpec

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server

    from handrail.mcp._client import MCPToolset
    from handrail.mcp._gateway import Gateway, GatewaySession

__all__ = ["READ_TOOL", "Carried", "client_names", "keeps_names", "read_tools"]

READ_TOOL = "handrail--read_resource"
"""The model-facing name of the one tool of a session's resource-read gate (`read_tools`)."""

_MAX_PAGES = 100
_MAX_URI = 8192


def keeps_names(gateway: Gateway) -> set[str]:
    """The upstream servers whose own names clients see (`names = "upstream"`, or default)."""
    manifest = gateway.manifest
    if manifest is None:
        return set()
    decls = manifest.servers
    return {d.name for d in decls
            if d.names == "upstream" or (d.names is None and len(decls) == 1)}


def client_names(specs: Sequence[ToolSpec], keep: set[str], *, strict: bool = False,
                 ) -> dict[str, str]:
    """Shown name -> the tool's model-facing name (what the gate resolves).

    A tool of a server in `keep` is shown by its own name; any other by its model-facing
    name (`server--tool`; a `local` tool by its bare name). With `strict` (at start), two
    tools shown by one name raise `ConfigError`; afterwards (a tool a server added later)
    the newcomer is shown by its model-facing name instead.
    """
    out: dict[str, str] = {}
    for spec in specs:
        model = spec.id.model_name
        shown = spec.id.name if spec.id.server in keep else model
        if shown in out and out[shown] != model:
            if strict:
                other = next(s for s in specs if s.id.model_name == out[shown])
                raise ConfigError(
                    f"tools '{other.id}' and '{spec.id}' would both be shown to MCP clients "
                    f"as '{shown}'; set names = \"prefixed\" on the [[servers]] entry of "
                    f"'{spec.id.server}' (its tools are then shown as '{model}')")
            shown = model
        out[shown] = model
    return out


def resource_action(server: str, uri: str) -> Action:
    """What reading `uri` of `server` touches: a file's path, else `call server/uri`."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme == "file":
        return Action(Act.READ, urllib.parse.unquote(parts.path) or "/")
    # `call server/scheme/rest`: the URI's segments, empty ones dropped, so a pattern
    # can name them (`test://docs/a` is `call ref/test/docs/a`; `call:ref/test/**`).
    rest = "/".join(p for p in re.split(r"[/:]+", uri[len(parts.scheme):]) if p)
    return Action(Act.CALL, "/".join(p for p in (server, parts.scheme or "uri", rest) if p))


def read_tools(gateway: Gateway) -> Toolbox:
    """The toolbox of a session's resource-read gate: one tool, reading an upstream resource.

    A client's `resources/read` the policy asks about is driven through it as a call
    (`GatewaySession.read_asked`), so it is asked, waited for, retried and recorded like
    one. Its action is the read's (`resource_action`); it changes nothing.
    """
    from pydantic import Field


    class ReadResource(Tool, server="handrail", name="read_resource", mutates=False):
        """Read a resource of an upstream MCP server (a client's `resources/read`)."""

        server: str = Field(max_length=200)
        """The upstream server's name."""
        uri: str = Field(max_length=_MAX_URI)
        """The resource's URI."""

        def actions(self) -> list[Action]:
            """The read's action: a file's path, else `call server/scheme/...`."""
            return [resource_action(self.server, self.uri)]

        async def run(self, ctx: CallContext) -> ToolResult:
            """Read it from the server that serves it now."""
            from handrail.mcp._client import MCPToolset

            for member in gateway.toolbox.changing():
                if isinstance(member, MCPToolset) and member.name == self.server:
                    result = await member.forward("read_resource", uri=self.uri)
                    return ToolResult.json(result.model_dump(mode="json", by_alias=True,
                                                             exclude_none=True))
            return ToolResult.error(f"MCP server {self.server!r} is not served any more")

    return Toolbox([ReadResource])


class Carried:
    """The resources, prompts, completion and logging of a gateway's upstream servers."""

    def __init__(self, gateway: Gateway,
                 session_for: Callable[[Any], Awaitable[GatewaySession]]) -> None:
        self.gateway = gateway
        self.session_for = session_for
        self.resources: dict[str, MCPToolset] = {}  # uri -> the server that listed it
        self.templates: list[tuple[str, MCPToolset]] = []  # (uri template, its server)
        self.prompts: dict[str, tuple[MCPToolset, str]] = {}  # shown -> (server, its name)
        self.subscribed: dict[str, set[int]] = {}  # uri -> connections (by id) subscribed
        self._connections: dict[int, Any] = {}

    # -- which servers -------------------------------------------------------------------

    def upstream(self, capability: str) -> list[MCPToolset]:
        """The connected MCP servers of the toolbox that declared `capability`."""
        from handrail.mcp._client import MCPToolset

        found: list[MCPToolset] = []
        for member in self.gateway.toolbox.changing():
            if isinstance(member, MCPToolset) and member.serves(capability) \
                    and member not in found:
                found.append(member)
        return found

    def register(self, server: Server[Any]) -> None:
        """Add the handlers (and so the capabilities) the upstream servers call for."""
        import mcp_types as t

        add = server.add_request_handler
        if self.upstream("resources"):
            add("resources/list", t.PaginatedRequestParams, self.list_resources)
            add("resources/templates/list", t.PaginatedRequestParams, self.list_templates)
            add("resources/read", t.ReadResourceRequestParams, self.read_resource)
            if any(getattr(u.server_capabilities.resources, "subscribe", False)
                   for u in self.upstream("resources")):
                add("resources/subscribe", t.SubscribeRequestParams, self.subscribe)
                add("resources/unsubscribe", t.UnsubscribeRequestParams, self.unsubscribe)
                for u in self.upstream("resources"):
                    u.watch_resources(self.updated)
        if self.upstream("prompts"):
            add("prompts/list", t.PaginatedRequestParams, self.list_prompts)
            add("prompts/get", t.GetPromptRequestParams, self.get_prompt)
        if self.upstream("completions"):
            add("completion/complete", t.CompleteRequestParams, self.complete)
        if self.upstream("logging"):
            add("logging/setLevel", t.SetLevelRequestParams, self.set_level)

    # -- governance ----------------------------------------------------------------------

    def action(self, server: str, uri: str) -> Action:
        """What reading `uri` of `server` touches (`resource_action`)."""
        return resource_action(server, uri)

    async def decide(self, ctx: Any, kind: str, action: Action, *, asks: bool = False,
                     **detail: Any) -> bool:
        """The policy's verdict on a read the client asks for; recorded; refused unless allow.

        With `asks`, an *ask* is not refused: False is returned, and the caller asks like
        a call (a resource read). True: allowed.

        Raises:
            MCPError: the policy does not allow it (the client gets the reason).
        """
        from mcp.shared.exceptions import MCPError

        from handrail.policy import Effect

        gateway = self.gateway
        verdict = gateway.policy.check(action, workspace=gateway.workspace, mutates=False)
        session = await self.session_for(ctx)
        session.run.events.append({"kind": kind, "at": _now(), "action": action.describe(),
                                   "effect": verdict.effect.value, **detail})
        await session.write_events()
        if asks and verdict.effect is Effect.ASK:
            return False
        if verdict.effect is not Effect.ALLOW:
            raise MCPError(code=-32600, message=(
                f"handrail refused '{action.describe()}': {verdict.effect.value} "
                f"({verdict.reason}); a read a client asks for on its own is never put to "
                "a person, so only what the policy allows is served"))
        return True

    # -- resources -------------------------------------------------------------------------

    async def list_resources(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t

        resources = []
        for upstream in self.upstream("resources"):
            for page in await _pages(upstream, "list_resources"):
                for resource in page.resources:
                    self.resources.setdefault(str(resource.uri), upstream)
                    resources.append(resource)
        return t.ListResourcesResult(resources=resources)

    async def list_templates(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t

        templates = []
        for upstream in self.upstream("resources"):
            for page in await _pages(upstream, "list_resource_templates"):
                for template in page.resource_templates:
                    entry = (str(template.uri_template), upstream)
                    if entry not in self.templates:
                        self.templates.append(entry)
                    templates.append(template)
        return t.ListResourceTemplatesResult(resource_templates=templates)

    async def owner(self, uri: str) -> MCPToolset:
        """The server a URI is read from: the one that listed it, or whose template fits."""
        from mcp.shared.exceptions import MCPError

        if len(uri) > _MAX_URI:
            raise MCPError(code=-32602, message=f"a resource URI is {_MAX_URI} characters "
                                                "at most")
        candidates = self.upstream("resources")
        if len(candidates) == 1:
            return candidates[0]
        if uri not in self.resources and not self.templates:
            await self.list_resources(None, None)
            await self.list_templates(None, None)
        if uri in self.resources:
            return self.resources[uri]
        for template, upstream in self.templates:
            if uri.startswith(template.split("{", 1)[0]):
                return upstream
        raise MCPError(code=-32602, message=f"no upstream server lists the resource {uri!r}")

    async def read_resource(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t
        from mcp.shared.exceptions import MCPError

        from handrail.mcp._relay import RELAY, Relay

        uri = str(params.uri)
        upstream = await self.owner(uri)
        if await self.decide(ctx, "mcp_resource_read", self.action(upstream.name, uri),
                             asks=True, server=upstream.name, uri=uri[:1000]):
            return await upstream.forward("read_resource", uri=uri)
        # The policy asks: as a call (a person decides; progress and in-band approval too).
        session = await self.session_for(ctx)
        token = RELAY.set(Relay(ctx, session.call_event))
        try:
            result = await session.read_asked(upstream.name, uri)
        finally:
            RELAY.reset(token)
        if result.is_error or not isinstance(result.structured, dict):
            raise MCPError(code=-32600, message=result.render_text()[:4000])
        return t.ReadResourceResult.model_validate(result.structured)

    async def subscribe(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t

        uri = str(params.uri)
        upstream = await self.owner(uri)
        # Being told a resource changed is a read of what it is now.
        await self.decide(ctx, "mcp_resource_subscribe", self.action(upstream.name, uri),
                          server=upstream.name, uri=uri[:1000])
        connection = getattr(ctx.session, "_connection", ctx.session)
        self._connections[id(connection)] = connection
        first = uri not in self.subscribed
        self.subscribed.setdefault(uri, set()).add(id(connection))
        if first:
            await upstream.forward("subscribe_resource", uri=uri)
        return t.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t

        uri = str(params.uri)
        connection = getattr(ctx.session, "_connection", ctx.session)
        subscribers = self.subscribed.get(uri, set())
        subscribers.discard(id(connection))
        if not subscribers and uri in self.subscribed:
            del self.subscribed[uri]
            await (await self.owner(uri)).forward("unsubscribe_resource", uri=uri)
        return t.EmptyResult()

    async def updated(self, uri: str) -> None:
        """An upstream resource changed: tell the clients that subscribed to it."""
        for key in list(self.subscribed.get(uri, ())):
            connection = self._connections.get(key)
            outbound = getattr(connection, "outbound", None)
            if outbound is None:
                continue
            try:
                await outbound.notify("notifications/resources/updated", {"uri": uri})
            except Exception:  # boundary: a client gone meanwhile is not told
                self.subscribed.get(uri, set()).discard(key)

    # -- prompts -----------------------------------------------------------------------------

    async def list_prompts(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t

        keep = keeps_names(self.gateway)
        prompts = []
        self.prompts = {}
        for upstream in self.upstream("prompts"):
            for page in await _pages(upstream, "list_prompts"):
                for prompt in page.prompts:
                    shown = (prompt.name if upstream.name in keep
                             else f"{upstream.name}--{prompt.name}")
                    if shown in self.prompts:
                        continue  # a name two servers share: the first one's
                    self.prompts[shown] = (upstream, prompt.name)
                    prompts.append(prompt.model_copy(update={"name": shown}))
        return t.ListPromptsResult(prompts=prompts)

    async def prompt(self, shown: str) -> tuple[MCPToolset, str]:
        from mcp.shared.exceptions import MCPError

        if shown not in self.prompts:
            await self.list_prompts(None, None)
        if shown not in self.prompts:
            raise MCPError(code=-32602, message=f"no upstream server offers the prompt "
                                                f"{shown[:200]!r}")
        return self.prompts[shown]

    async def get_prompt(self, ctx: Any, params: Any) -> Any:
        upstream, name = await self.prompt(str(params.name))
        await self.decide(ctx, "mcp_prompt_get", Action(Act.CALL,
                                                        f"{upstream.name}/prompt/{name}"),
                          server=upstream.name, prompt=name)
        return await upstream.forward("get_prompt", name=name,
                                      arguments=params.arguments or None)

    # -- completion, logging -----------------------------------------------------------------

    async def complete(self, ctx: Any, params: Any) -> Any:
        import mcp_types as t

        ref = params.ref
        if isinstance(ref, t.PromptReference):
            upstream, name = await self.prompt(ref.name)
            ref = ref.model_copy(update={"name": name})
        else:
            upstream = await self.owner(str(ref.uri))
        context = params.context.arguments if params.context is not None else None
        return await upstream.forward(
            "complete", ref=ref,
            argument={"name": params.argument.name, "value": params.argument.value},
            context_arguments=context)

    async def set_level(self, ctx: Any, params: Any) -> Any:
        import warnings

        import mcp_types as t

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated at 2026-07-28, still spoken
            for upstream in self.upstream("logging"):
                await upstream.forward("set_logging_level", level=params.level)
        return t.EmptyResult()


async def _pages(upstream: MCPToolset, method: str) -> list[Any]:
    import mcp_types as t

    pages = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):  # a server paginating forever is cut off
        page = await upstream.forward(
            method, params=t.PaginatedRequestParams(cursor=cursor) if cursor else None)
        pages.append(page)
        cursor = page.next_cursor
        if not cursor:
            break
    return pages


def _now() -> float:
    import time

    return time.time()
