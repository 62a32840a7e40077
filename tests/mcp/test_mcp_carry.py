"""`handrail serve` carries what its upstream server serves besides tools, governed (issue 36).

The upstream is tests/mcp/conformance_server.py (the reference server of the conformance
harness) over stdio; the gateway's client is the SDK's in-memory client, which declares
sampling and elicitation exactly when it is given their callbacks.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

import handrail as hr
from handrail.errors import ConfigError, Disposition
from handrail.mcp import Gateway, connect_servers
from mcp import Client

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).with_name("conformance_server.py")
TOOLS = ["test_simple_text", "test_tool_with_progress", "test_tool_with_logging",
         "test_sampling", "test_elicitation"]


def manifest_text(*, deny: str = "", names: str = "", extra_tools: str = "",
                  ask: str = "") -> str:
    argv = f"{sys.executable} {SERVER} --stdio"
    lines = ["[policy]", 'extends = "default"', "[[policy.layers]]", 'name = "test"',
             f"allow = [{json.dumps('exec:' + argv)}]"]
    if deny:
        lines.append(f"deny = [{json.dumps(deny)}]")
    if ask:
        lines.append(f"ask = [{json.dumps(ask)}]")
    lines += ["[[servers]]", 'name = "ref"', f"command = {json.dumps(sys.executable)}",
              f"args = [{json.dumps(str(SERVER))}, \"--stdio\"]"]
    if names:
        lines.append(f'names = "{names}"')
    for tool in TOOLS:
        lines += ["[[tools]]", f'ref = "ref/{tool}"', f'description = "{tool}."',
                  "mutates = false"]
    return "\n".join(lines) + "\n" + extra_tools


@contextlib.asynccontextmanager
async def gateway_of(tmp_path: Path, text: str, *tools: Any,
                     **options: Any) -> AsyncIterator[Gateway]:
    manifest = hr.Manifest.from_toml(text)
    async with connect_servers(manifest, workspace=tmp_path, sandbox="off") as upstream:
        yield Gateway(hr.Toolbox([*tools, *upstream]), store=hr.Store.memory(),
                      manifest=manifest, workspace=tmp_path, **options)


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if isinstance(c, t.TextContent))


async def events(gateway: Gateway, kind: str) -> list[dict[str, Any]]:
    [run] = await gateway.store.runs()
    return [e for e in run.events if e["kind"] == kind]


async def test_resources_prompts_and_completion_are_carried_and_each_read_is_recorded(
        tmp_path: Path) -> None:
    async with gateway_of(tmp_path, manifest_text()) as gateway, \
            Client(gateway.server()) as client:
        caps = client.server_capabilities
        assert caps.resources is not None and caps.prompts is not None
        assert caps.completions is not None and caps.logging is not None
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"test://static-text", "test://static-binary"} <= listed
        read = await client.read_resource("test://static-text")
        assert read.contents[0].text == "This is the content of the static text resource."
        templated = await client.read_resource("test://template/7/data")
        assert json.loads(templated.contents[0].text)["id"] == "7"
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        assert "test_prompt_with_arguments" in prompts  # one server: its own names
        got = await client.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
        assert got.messages[0].content.text == "Prompt with arguments: arg1='a', arg2='b'"
        done = await client.complete(
            t.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
            {"name": "arg1", "value": "par"})
        assert done.completion.values == ["paris", "park", "party"]
    reads = await events(gateway, "mcp_resource_read")
    assert [(e["action"], e["effect"]) for e in reads] == [
        ("call ref/test/static-text", "allow"), ("call ref/test/template/7/data", "allow")]
    [prompt] = await events(gateway, "mcp_prompt_get")
    assert prompt["action"] == "call ref/prompt/test_prompt_with_arguments"


async def test_a_read_the_policy_does_not_allow_is_refused_and_recorded(tmp_path: Path) -> None:
    text = manifest_text(deny="call:ref/test/static-*")
    async with gateway_of(tmp_path, text) as gateway, Client(gateway.server()) as client:
        with pytest.raises(MCPError, match="handrail refused 'call ref/test/static-text'"):
            await client.read_resource("test://static-text")
        assert (await client.read_resource("test://watched-resource")).contents
    reads = await events(gateway, "mcp_resource_read")
    assert [e["effect"] for e in reads] == ["deny", "allow"]
    # A file:// URI is a read of its path: the policy's path rules and the workspace apply.
    from handrail.mcp._carry import Carried

    action = Carried(gateway, None).action("ref", "file:///etc/pass%77d")  # type: ignore[arg-type]
    assert (action.act, action.target) == (hr.Act.READ, "/etc/passwd")


async def test_a_read_the_policy_asks_about_is_asked_like_a_call(tmp_path: Path) -> None:
    text = manifest_text(ask="call:ref/test/static-*")
    async with gateway_of(tmp_path, text, approval_timeout=0.1) as gateway, \
            Client(gateway.server()) as client:
        with pytest.raises(MCPError, match="awaiting approval: request ") as waiting:
            await client.read_resource("test://static-text")
        request_id = str(waiting.value).rpartition(" ")[2].strip("'\"")
        [item] = await gateway.store.pending()
        assert item.id == request_id and item.payload["target"] == "ref/test/static-text"
        assert (await client.read_resource("test://watched-resource")).contents  # allowed
        from handrail.approval import Decision

        await gateway.store.decide(request_id, Decision.approve().to_dict(), "alice")
        read = await client.read_resource("test://static-text")  # the same read again
        assert read.contents[0].text == "This is the content of the static text resource."
        # Once: a later read is a new read, asked again.
        with pytest.raises(MCPError, match="awaiting approval: request "):
            await client.read_resource("test://static-text")
    await gateway.close()  # the session ends: the read still waiting expires, as a call would
    [run] = await gateway.store.runs()
    records = await gateway.store.calls(run.id)
    assert [(r.tool, r.decided_by, r.disposition) for r in records] == [
        ("handrail/read_resource", "alice", None),
        ("handrail/read_resource", "handrail serve (the session ended)", "not_sent")]
    assert await gateway.store.pending() == []
    reads = await events(gateway, "mcp_resource_read")
    assert [e["effect"] for e in reads] == ["ask", "allow", "ask", "ask"]


async def test_progress_and_log_messages_reach_the_client_of_the_call(tmp_path: Path) -> None:
    progress: list[float] = []
    logged: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def on_log(params: t.LoggingMessageNotificationParams) -> None:
        logged.append(str(params.data))

    async with gateway_of(tmp_path, manifest_text()) as gateway, \
            Client(gateway.server(), logging_callback=on_log, mode="legacy") as client:
        with pytest.warns(MCPDeprecationWarning):  # logging is of the handshake era
            await client.set_logging_level("info")
        await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        await client.call_tool("test_tool_with_logging", {})
    assert progress == [0, 50, 100]
    assert logged == ["Tool execution started", "Tool processing data",
                      "Tool execution completed"]


async def test_sampling_goes_to_a_client_that_declared_it_and_is_recorded(
        tmp_path: Path) -> None:
    asked: list[str] = []

    async def sample(context: Any, params: t.CreateMessageRequestParams) -> Any:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return t.CreateMessageResult(role="assistant", model="client-model",
                                     content=t.TextContent(type="text", text="forty-two"))

    async with gateway_of(tmp_path, manifest_text()) as gateway, \
            Client(gateway.server(), sampling_callback=sample, mode="legacy") as client:
        result = await client.call_tool("test_sampling", {"prompt": "the answer?"})
    assert text_of(result) == "LLM response: forty-two"
    assert asked == ["the answer?"]
    [event] = await events(gateway, "mcp_sampling")
    assert (event["relayed"], event["model"], event["server"]) == ("client", "client-model",
                                                                   "ref")


async def test_a_tool_that_failed_after_it_asked_is_in_doubt_not_blamed_on_arguments(
        tmp_path: Path) -> None:
    """The story of issue 36: an upstream tool ran, then failed a nested request (its
    sampling request refused: this client declared no sampling). It came back -32600 and was
    recorded NOT_SENT, "invalid arguments — fix these and call it again", though a mutating
    tool could have landed. Something arrived from the server during the call: IN_DOUBT."""
    async with gateway_of(tmp_path, manifest_text()) as gateway, \
            Client(gateway.server()) as client:
        result = await client.call_tool("test_sampling", {"prompt": "x"})
    assert result.is_error
    assert "after it had begun" in text_of(result) and "argument" not in text_of(result)
    [run] = await gateway.store.runs()
    [record] = await gateway.store.calls(run.id)
    assert record.disposition == Disposition.IN_DOUBT.value
    [event] = await events(gateway, "mcp_sampling")
    assert event["refused"] == "the MCP client did not declare sampling"


async def test_a_form_goes_to_a_client_that_declared_elicitation(tmp_path: Path) -> None:
    async def elicit(context: Any, params: Any) -> t.ElicitResult:
        return t.ElicitResult(action="accept",
                              content={"username": "ada", "email": "ada@example.com"})

    async with gateway_of(tmp_path, manifest_text()) as gateway, \
            Client(gateway.server(), elicitation_callback=elicit, mode="legacy") as client:
        result = await client.call_tool("test_elicitation", {"message": "who?"})
    assert text_of(result).startswith("User response: action=accept")
    assert "ada@example.com" in text_of(result)
    [event] = await events(gateway, "mcp_elicitation")
    assert (event["relayed"], event["action"], event["message"]) == ("client", "accept", "who?")


async def test_without_elicitation_declared_a_form_waits_in_the_question_queue(
        tmp_path: Path) -> None:
    async with gateway_of(tmp_path, manifest_text(), approval_timeout=0.2) as gateway, \
            Client(gateway.server()) as client:
        result = await client.call_tool("test_elicitation", {"message": "who?"})
    assert result.is_error and text_of(result).startswith("awaiting an answer: question ")
    assert await events(gateway, "mcp_elicitation") == []


@hr.tool(mutates=False, name="test_simple_text")
async def same_name() -> str:
    """A Python tool with the upstream's name."""
    return "python"


GRANT_LOCAL = ('[[tools]]\nref = "local/test_simple_text"\ndescription = "Mine."\n'
               "mutates = false\n")


async def test_upstream_names_are_kept_for_one_server_and_collisions_refused_at_start(
        tmp_path: Path) -> None:
    async with gateway_of(tmp_path, manifest_text()) as gateway, \
            Client(gateway.server()) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "test_simple_text" in names and "ref--test_simple_text" not in names
        result = await client.call_tool("test_simple_text", {})
        assert text_of(result) == "This is a simple text response for testing."
    with pytest.raises(ConfigError, match="would both be shown to MCP clients as "
                                          "'test_simple_text'"):
        async with gateway_of(tmp_path, manifest_text(extra_tools=GRANT_LOCAL),
                              same_name):
            pass
    async with gateway_of(tmp_path, manifest_text(names="prefixed", extra_tools=GRANT_LOCAL),
                          same_name) as gateway, Client(gateway.server()) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"test_simple_text", "ref--test_simple_text"} <= names
        assert text_of(await client.call_tool("test_simple_text", {})) == "python"
        upstream = await client.call_tool("ref--test_simple_text", {})
        assert text_of(upstream) == "This is a simple text response for testing."


async def test_an_http_server_that_wants_authorization_says_where(tmp_path: Path) -> None:
    """A 401 is reported as what it is, with the resource metadata the server names, instead
    of "failed to start: MCPError: Server returned an error response"."""
    metadata = "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp"

    async def answer(stream: Any) -> None:
        async with stream:
            with contextlib.suppress(Exception):
                await stream.receive(65536)
                await stream.send(
                    b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n"
                    b'www-authenticate: Bearer resource_metadata="' + metadata.encode()
                    + b'"\r\n\r\n')

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    policy = hr.Policy.default().layer("t").allow("net", f"127.0.0.1:{port}")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        toolset = hr.mcp.MCPToolset.http(f"http://127.0.0.1:{port}/mcp", name="locked",
                                         policy=policy, connect_timeout=20)
        with pytest.raises(hr.UserError) as caught:
            async with toolset:
                pass
        tg.cancel_scope.cancel()
    assert (f"the server requires authorization (resource metadata at {metadata})"
            in str(caught.value))


async def test_a_host_the_auth_flow_reaches_is_a_net_action_the_policy_decides() -> None:
    """An OAuth flow's other hosts (metadata, the authorization server, a token endpoint)
    are reached only if the policy allows `net host:port`; nothing is sent to one it does
    not."""
    import httpx2

    reached: list[int] = []

    async def answer(stream: Any) -> None:
        async with stream:
            reached.append(stream.extra(anyio.abc.SocketAttribute.local_port))
            with contextlib.suppress(Exception):
                await stream.receive(65536)
                await stream.send(b"HTTP/1.1 500 No\r\ncontent-length: 0\r\n"
                                  b"connection: close\r\n\r\n")

    server = await anyio.create_tcp_listener(local_host="127.0.0.1")
    issuer = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = server.extra(anyio.abc.SocketAttribute.local_port)
    issuer_port = issuer.extra(anyio.abc.SocketAttribute.local_port)

    class TokenFirst(httpx2.Auth):
        def auth_flow(self, request: Any) -> Any:
            yield httpx2.Request("POST", f"http://127.0.0.1:{issuer_port}/token")
            yield request

    policy = hr.Policy.default().layer("t").allow("net", f"127.0.0.1:{port}")
    async with server, issuer, anyio.create_task_group() as tg:
        tg.start_soon(server.serve, answer)
        tg.start_soon(issuer.serve, answer)
        toolset = hr.mcp.MCPToolset.http(f"http://127.0.0.1:{port}/mcp", name="api",
                                         policy=policy, auth=TokenFirst(), connect_timeout=20)
        with pytest.raises(hr.HandrailError) as caught:
            async with toolset:
                pass
        tg.cancel_scope.cancel()
    assert (f"reaching 127.0.0.1:{issuer_port} (for '/token') is 'net 127.0.0.1:{issuer_port}'"
            ", which the policy does not allow") in str(caught.value)
    assert issuer_port not in reached  # nothing was sent there
    assert [e["target"] for e in toolset.events if e["kind"] == "mcp_host_refused"] == [
        f"127.0.0.1:{issuer_port}"]


async def test_auth_is_an_httpx_auth_for_an_http_server() -> None:
    with pytest.raises(hr.UserError, match="auth is for an HTTP server"):
        hr.mcp.MCPToolset.stdio("x", name="s", auth=object())
    with pytest.raises(hr.UserError, match=r"is an httpx\.Auth"):
        hr.mcp.MCPToolset.http("http://127.0.0.1:1/mcp", name="s", auth="token")


NOT_AUTH = "a token is not an httpx2.Auth"


def token_auth(decl: Any) -> Any:
    """A factory the manifest's `auth` may name: called with the `[[servers]]` entry."""
    import httpx2

    class Bearer(httpx2.Auth):
        def auth_flow(self, request: Any) -> Any:
            request.headers["Authorization"] = f"Bearer for-{decl.name}"
            yield request

    return Bearer()


def test_a_manifests_auth_names_the_provider_and_is_part_of_its_digest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    entry = ('[[servers]]\nname = "api"\nurl = "http://127.0.0.1:1/mcp"\n'
             'auth = "test_mcp_carry:token_auth"\n')
    manifest = hr.Manifest.from_toml(entry)
    [decl] = manifest.servers
    toolset = hr.mcp.MCPToolset.from_manifest(decl, manifest=manifest)
    assert type(toolset.auth).__name__ == "Bearer"
    plain = hr.Manifest.from_toml(entry.replace('auth = "test_mcp_carry:token_auth"\n', ""))
    assert plain.digest != manifest.digest
    with pytest.raises(hr.ManifestError, match="auth is for an HTTP server"):
        hr.Manifest.from_toml('[[servers]]\nname = "s"\ncommand = "x"\nauth = "m:o"\n')
    with pytest.raises(hr.ManifestError, match="as MODULE:OBJECT"):
        hr.Manifest.from_toml(entry.replace("test_mcp_carry:token_auth", "token"))
    wrong = hr.Manifest.from_toml(entry.replace("token_auth", "NOT_AUTH"))
    with pytest.raises(hr.UserError, match=r"not an httpx2\.Auth"):
        hr.mcp.MCPToolset.from_manifest(wrong.servers[0], manifest=wrong)


# -- a call that waits for a person ----------------------------------------------------------


@hr.tool()
async def launch(target: str) -> str:
    """Launch something (mutating: the default policy asks)."""
    return f"launched {target}"


LAUNCH = '[[tools]]\nref = "local/launch"\ndescription = "Launch."\n'


async def test_a_waiting_call_tells_its_client_what_it_waits_for_and_where_to_decide(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import handrail.mcp._gateway as gateway_module

    monkeypatch.setattr(gateway_module, "WAIT_PROGRESS_SECONDS", 0.05)
    told: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        told.append(str(message))

    gateway = Gateway(hr.Toolbox([launch]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(LAUNCH), approval_timeout=0.3)
    async with Client(gateway.server()) as client:
        result = await client.call_tool("launch", {"target": "moon"},
                                        progress_callback=on_progress)
    request_id = text_of(result).removeprefix("awaiting approval: request ")
    assert told and all(f"handrail approve {request_id}" in m for m in told)
    assert "waiting for a person to approve request" in told[0]


async def test_a_parked_call_whose_session_ended_expires_and_is_recorded() -> None:
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([launch]), store=store,
                      manifest=hr.Manifest.from_toml(LAUNCH), approval_timeout=0.05)
    session = await gateway.open_session("test")
    result = await session.call("launch", {"target": "moon"})
    request_id = result.render_text().removeprefix("awaiting approval: request ")
    await session.close()
    item = await store.pending_item(request_id)
    assert item.state == "decided" and item.decision is not None
    assert item.decision["kind"] == "deny" and "expired" in item.decision["reason"]
    [record] = await store.calls(session.run_id)
    assert record.disposition == Disposition.NOT_SENT.value
    run = await store.run(session.run_id)
    assert run.status is hr.RunStatus.COMPLETED
    assert [e["request_id"] for e in run.events if e["kind"] == "mcp_call_expired"] == [
        request_id]
    assert await store.pending() == []


async def parked_in_a_killed_server(store: hr.Store) -> tuple[Gateway, str, str]:
    """A server whose session parked a call and that was then killed (never closed)."""
    gateway = Gateway(hr.Toolbox([launch]), store=store,
                      manifest=hr.Manifest.from_toml(LAUNCH), approval_timeout=0.05)
    session = await gateway.open_session("test")
    result = await session.call("launch", {"target": "moon"})
    return gateway, session.run_id, result.render_text().removeprefix(
        "awaiting approval: request ")


async def test_a_call_parked_in_a_killed_server_expires_when_the_next_server_starts(
        tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    store.lease_seconds = 0.01  # the killed server's lease lapses at once
    _, run_id, request_id = await parked_in_a_killed_server(store)
    await anyio.sleep(0.02)
    successor = Gateway(hr.Toolbox([launch]), store=store,
                        manifest=hr.Manifest.from_toml(LAUNCH))
    assert await successor.expire_orphans() == 1
    item = await store.pending_item(request_id)
    assert item.decision is not None and item.decision["kind"] == "deny"
    assert "expired: the handrail serve that held its MCP session stopped" in item.decision[
        "reason"]
    [record] = await store.calls(run_id)
    assert record.disposition == Disposition.NOT_SENT.value
    run = await store.run(run_id)
    assert run.status is hr.RunStatus.COMPLETED
    assert [e["request_id"] for e in run.events if e["kind"] == "mcp_call_expired"] == [
        request_id]
    assert await successor.expire_orphans() == 0  # once


async def test_a_call_of_a_live_server_is_not_expired_by_another(tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    store.lease_seconds = 0.3
    live, _, request_id = await parked_in_a_killed_server(store)
    other = Gateway(hr.Toolbox([launch]), store=store, manifest=hr.Manifest.from_toml(LAUNCH))
    # The live server renews the lease of its waiting call: still its own past the lease.
    for _ in range(4):
        await anyio.sleep(0.1)
        await live.keep_alive()
    assert await other.expire_orphans() == 0
    assert (await store.pending_item(request_id)).state == "open"
    # Another server's runs, or an agent's, are not its business either.
    stranger = Gateway(hr.Toolbox([launch]), store=store,
                       manifest=hr.Manifest.from_toml(LAUNCH), name="another")
    await anyio.sleep(0.35)
    assert await stranger.expire_orphans() == 0
    assert (await store.pending_item(request_id)).state == "open"
    await live.close()


async def test_an_agents_paused_run_of_the_same_name_is_not_expired(tmp_path: Path) -> None:
    from handrail.models import Scripted, call, reply
    from handrail.runs import DeferAll

    store = hr.Store.open(str(tmp_path / "runs.db"))
    store.lease_seconds = 0.01
    agent = hr.Agent(Scripted([call("launch", {"target": "moon"}), reply("done")]), [launch],
                     name="mcp-gateway")
    result = await agent.run("launch", store=store, approver=DeferAll())
    assert result.outcome.kind == "awaiting_approval"
    await anyio.sleep(0.02)
    gateway = Gateway(hr.Toolbox([launch]), store=store, manifest=hr.Manifest.from_toml(LAUNCH))
    assert gateway.name == "mcp-gateway"
    assert await gateway.expire_orphans() == 0  # an agent's run is resumed, not expired
    [item] = await store.pending()
    assert item.state == "open"


# -- in-band approval: the client's own user decides ----------------------------------------


def approving(answer: t.ElicitResult, asked: list[str]) -> Any:
    async def elicit(context: Any, params: Any) -> t.ElicitResult:
        asked.append(params.message)
        return answer

    return elicit


async def test_an_ask_is_put_to_the_clients_user_where_the_operator_allows_it() -> None:
    asked: list[str] = []
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([launch]), store=store, manifest=hr.Manifest.from_toml(LAUNCH),
                      approval_timeout=0.2, client_approval={"call"})
    yes = approving(t.ElicitResult(action="accept", content={"approve": True}), asked)
    async with Client(gateway.server(), elicitation_callback=yes, mode="legacy") as client:
        result = await client.call_tool("launch", {"target": "moon"})
    assert not result.is_error and text_of(result) == "launched moon"
    [message] = asked
    assert "handrail asks you to approve a call of local/launch" in message
    assert "call local/launch" in message
    await gateway.close()
    [record] = await store.calls((await store.runs())[0].id)
    assert record.decided_by is not None
    assert record.decided_by.startswith("the MCP client's user (")
    assert await store.pending() == []  # decided in the call: nothing queued
    [event] = await events(gateway, "mcp_client_approval")
    assert event["outcome"] == "approve" and event["tool"] == "local/launch"


async def test_the_clients_user_declining_denies_and_cancelling_leaves_it_to_the_queue(
        ) -> None:
    asked: list[str] = []
    gateway = Gateway(hr.Toolbox([launch]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(LAUNCH), approval_timeout=0.1,
                      client_approval={"call"})
    no = approving(t.ElicitResult(action="decline"), asked)
    async with Client(gateway.server(), elicitation_callback=no, mode="legacy") as client:
        denied = await client.call_tool("launch", {"target": "moon"})
    assert denied.is_error and "declined by the MCP client's user" in text_of(denied)
    unticked = approving(t.ElicitResult(action="accept", content={"approve": False}), asked)
    async with Client(gateway.server(), elicitation_callback=unticked, mode="legacy") as client:
        refused = await client.call_tool("launch", {"target": "moon"})
    assert refused.is_error and "declined by the MCP client's user" in text_of(refused)
    later = approving(t.ElicitResult(action="cancel"), asked)
    async with Client(gateway.server(), elicitation_callback=later, mode="legacy") as client:
        queued = await client.call_tool("launch", {"target": "mars"})
    assert text_of(queued).startswith("awaiting approval: request ")
    assert len(asked) == 3
    await gateway.close()


async def test_an_ask_of_another_act_or_to_a_client_without_forms_waits_for_a_person() -> None:
    asked: list[str] = []
    yes = approving(t.ElicitResult(action="accept", content={"approve": True}), asked)
    gateway = Gateway(hr.Toolbox([launch]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(LAUNCH), approval_timeout=0.1,
                      client_approval={"write"})
    async with Client(gateway.server(), elicitation_callback=yes, mode="legacy") as client:
        other_act = await client.call_tool("launch", {"target": "moon"})
    assert text_of(other_act).startswith("awaiting approval: request ")
    assert asked == []  # a call's ask is not the client's user's to decide here
    allowed = Gateway(hr.Toolbox([launch]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(LAUNCH), approval_timeout=0.1,
                      client_approval={"call"})
    async with Client(allowed.server(), mode="legacy") as client:  # declares no elicitation
        no_forms = await client.call_tool("launch", {"target": "moon"})
    assert text_of(no_forms).startswith("awaiting approval: request ")
    with pytest.raises(hr.UserError, match="'approve' is not an act"):
        Gateway(hr.Toolbox([launch]), store=hr.Store.memory(), client_approval={"approve"})
    await gateway.close()
    await allowed.close()
