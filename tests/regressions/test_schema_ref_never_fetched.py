"""A tool's schema with a `$ref` to a network URI made handrail fetch it (issue 36).

The 0.2.0 alpha conformance suite's `json-schema-ref-no-deref` (SEP-2106) lists a tool whose
`inputSchema` holds `{"$ref": "http://.../canary/profile-schema.json"}`. The plain SDK client
never fetches it; `MCPToolset.http` did, once, when the gate validated the call's arguments:
jsonschema's default registry retrieves an unknown `$ref` with `urlopen` (with a deprecation
warning), blocking the event loop and reaching whatever host a server's schema names — past
the policy, which decides every other host a toolset reaches. Now a tool's schema resolves
only same-document refs (and the drafts' metaschemas); another `$ref` is an issue of the
call (NOT_SENT), and nothing is requested.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.tools import SchemaTool

pytestmark = pytest.mark.anyio


async def test_a_remote_ref_in_a_tools_schema_is_never_fetched() -> None:
    reached: list[str] = []

    async def canary(stream: Any) -> None:
        async with stream:
            reached.append("canary")
            await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                              b'content-length: 16\r\nconnection: close\r\n\r\n{"type":"string"}')

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    schema = {"type": "object", "properties": {
        "profile": {"$ref": f"http://127.0.0.1:{port}/canary/profile-schema.json"},
        "name": {"$ref": "#/$defs/name"}},
        "$defs": {"name": {"type": "string", "minLength": 1}}}

    async def run(args: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.text("ran")

    tool = SchemaTool(hr.ToolSpec("remote/x", "X.", schema), run)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, canary)
        with pytest.raises(hr.InvalidArguments, match="a remote \\$ref is never fetched"):
            await anyio.to_thread.run_sync(tool.validate, {"profile": "me", "name": "a"})
        # A same-document ref still resolves and is checked.
        assert tool.validate({"name": "ada"}) == {"name": "ada"}
        with pytest.raises(hr.InvalidArguments, match=r"should be non-empty|is too short"):
            tool.validate({"name": ""})
        tg.cancel_scope.cancel()
    assert reached == []


async def test_no_other_schema_check_fetches_a_remote_ref_either() -> None:
    # The same default registry was used by the gate (a manifest's schema, a form's answer
    # read back on resume), by a handler's form check and by the inbox's form: each now
    # validates through `local_validator`, and a remote `$ref` is an issue, never a request.
    from handrail.tools import local_validator, schema_issues
    from handrail.web._inbox import Refused, _check_form_answer

    reached: list[str] = []

    async def canary(stream: Any) -> None:
        async with stream:
            reached.append("canary")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    schema = {"type": "object",
              "properties": {"who": {"$ref": f"http://127.0.0.1:{port}/who.json"}}}
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, canary)
        issues = await anyio.to_thread.run_sync(
            lambda: schema_issues(local_validator(schema), {"who": "me"}))
        assert [i.message for i in issues] == [issues[0].message]
        assert "a remote $ref is never fetched" in issues[0].message
        with pytest.raises(Refused, match="never fetched"):
            await anyio.to_thread.run_sync(_check_form_answer, '{"who": "me"}', schema)
        tg.cancel_scope.cancel()
    assert reached == []
