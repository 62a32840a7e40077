"""npm servers we did not write: server-filesystem under path rules, server-everything's content.

Skipped, with the reason shown, when npm cannot install them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp_servers import npm_bin

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

FS_MANIFEST = """
[[tools]]
ref = "fs/write_file"
description = "Write a text file."

[[tools]]
ref = "fs/read_text_file"
description = "Read a text file."
mutates = false

[[tools]]
ref = "fs/read_multiple_files"
description = "Read several files."
mutates = false

[[servers]]
name = "fs"
names = "prefixed"            # shown as models see them (issue 36: default upstream)
command = "{command}"
args = ["{workspace}"]

[servers.actions]
write_file = [{{ act = "write", argument = "path", content = "content" }}]
read_text_file = [{{ act = "read", argument = "path" }}]
read_multiple_files = [{{ act = "read", argument = "paths" }}]
"""


class Fs:
    def __init__(self, tools: hr.mcp.MCPToolset, manifest: hr.Manifest, workspace: Path,
                 policy: hr.Policy) -> None:
        self.tools, self.manifest, self.workspace, self.policy = (tools, manifest, workspace,
                                                                  policy)

    async def run(self, turns: list[Any], approver: Any = None) -> tuple[Any, list[Any]]:
        store = hr.Store.memory()
        agent = hr.Agent(Scripted(turns), [self.tools], policy=self.policy,
                         manifest=self.manifest, workspace=self.workspace)
        result = await agent.run("go", store=store, approver=approver)
        return result, await store.calls(result.run_id)


@pytest.fixture(scope="module")
async def fs(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fs]:
    command = npm_bin("mcp-server-filesystem")
    workspace = tmp_path_factory.mktemp("ws").resolve()
    (workspace / "docs").mkdir()
    (workspace / "notes.txt").write_text("hello")
    (workspace / ".env").write_text("SECRET=1")
    manifest = hr.Manifest.from_toml(FS_MANIFEST.format(command=command, workspace=workspace))
    policy = hr.Policy.default().layer("mcp").allow("exec", f"{command} {workspace}")
    [decl] = manifest.servers
    async with hr.mcp.MCPToolset.from_manifest(decl, manifest=manifest, policy=policy,
                                               workspace=workspace) as tools:
        yield Fs(tools, manifest, workspace, policy)


async def test_only_granted_filesystem_tools_are_offered(fs: Fs) -> None:
    assert sorted(i.spec.id.name for i in fs.tools.impls()) == [
        "read_multiple_files", "read_text_file", "write_file"]
    assert "move_file" in fs.tools.ungranted


async def test_a_write_to_dotenv_is_refused_by_the_secrets_layer(fs: Fs) -> None:
    _, [record] = await fs.run([call("fs/write_file", {"path": ".env", "content": "X=2"}),
                                reply("x")], approver=hr.ApproveAll())
    assert record.status is hr.CallStatus.REFUSED
    assert record.result is not None
    assert record.result["content"][0]["text"] == hr.PolicyDenied.MODEL_MESSAGE
    assert (fs.workspace / ".env").read_text() == "SECRET=1"


async def test_a_write_under_docs_asks_and_lands_once_approved(fs: Fs) -> None:
    result, [record] = await fs.run([call("fs/write_file", {"path": "docs/a.md",
                                                            "content": "# A"}), reply("x")])
    assert isinstance(result.outcome, hr.AwaitingApproval)
    assert not (fs.workspace / "docs" / "a.md").exists()
    assert record.actions == [{"act": "write", "target": "docs/a.md",
                               "content_sha256": record.actions[0]["content_sha256"],
                               "content_bytes": 3}]
    seen: list[hr.Request] = []

    async def decide(request: hr.Request) -> hr.Decision:
        seen.append(request)
        return hr.Decision.approve()

    result, [record] = await fs.run([call("fs/write_file", {"path": "docs/a.md",
                                                            "content": "# A"}), reply("x")],
                                    approver=hr.CallbackApprover(decide))
    assert isinstance(result.outcome, hr.Completed)
    assert (fs.workspace / "docs" / "a.md").read_text() == "# A"
    # The approver saw exactly the bytes that landed.
    assert seen[0].content == b"# A" and seen[0].target.endswith("docs/a.md")


async def test_reads_are_decided_per_path_and_confined_to_the_workspace(fs: Fs) -> None:
    _, [record] = await fs.run([call("fs/read_text_file", {"path": "notes.txt"}), reply("x")])
    assert record.status is hr.CallStatus.FINISHED
    assert record.result is not None and "hello" in record.result["content"][0]["text"]
    for arguments in ({"path": "../outside.txt"}, {"path": ".env"}):
        _, [record] = await fs.run([call("fs/read_text_file", arguments), reply("x")])
        assert record.status is hr.CallStatus.REFUSED, arguments
    # One forbidden path in a list refuses the whole call.
    _, [record] = await fs.run([call("fs/read_multiple_files",
                                     {"paths": ["notes.txt", ".env"]}), reply("x")])
    assert record.status is hr.CallStatus.REFUSED


async def test_a_mapped_argument_of_the_wrong_type_refuses_the_call(fs: Fs) -> None:
    tool = next(i for i in fs.tools.impls() if i.spec.id.name == "read_multiple_files")
    assert isinstance(tool, hr.mcp.MCPTool)
    with pytest.raises(ValueError, match="must be a string"):
        tool.actions({"paths": [{"not": "a path"}]})


# -- server-everything ----------------------------------------------------------------------


@pytest.fixture(scope="module")
async def everything() -> AsyncIterator[hr.mcp.MCPToolset]:
    command = npm_bin("mcp-server-everything")
    policy = hr.Policy.default().layer("mcp").allow("exec", command)
    async with hr.mcp.MCPToolset.stdio(command, name="every", policy=policy,
                                       timeout=3) as tools:
        yield tools


async def test_everything_content_types_map(everything: hr.mcp.MCPToolset) -> None:
    box = hr.Toolbox([everything])
    image = await box.call("every/get-tiny-image", {})
    assert any(isinstance(i, hr.Image) and i.mime_type == "image/png" for i in image.content)
    links = await box.call("every/get-resource-links", {"count": 2})
    assert sum(isinstance(i, hr.ResourceLink) for i in links.content) == 2
    embedded = await box.call("every/get-resource-reference",
                              {"resourceType": "Text", "resourceId": 1})
    assert any(isinstance(i, hr.EmbeddedResource) and i.text for i in embedded.content)
    blob = await box.call("every/get-resource-reference",
                          {"resourceType": "Blob", "resourceId": 2})
    assert any(isinstance(i, hr.EmbeddedResource) and i.blob for i in blob.content)


async def test_structured_output_is_checked_against_the_output_schema(
        everything: hr.mcp.MCPToolset) -> None:
    box = hr.Toolbox([everything])
    result = await box.call("every/get-structured-content", {"location": "Chicago"})
    assert set(result.structured) == {"temperature", "conditions", "humidity"}
    impl = box.get("every/get-structured-content")
    assert impl.spec.output_schema is not None
    assert isinstance(impl, hr.SchemaTool)
    # The same check refuses a structured result that does not fit.
    wrong = hr.ToolResult.json({"temperature": "hot"})
    impl._run = _returns(wrong)  # type: ignore[method-assign]
    try:
        with pytest.raises(hr.InvalidOutput):
            await box.call("every/get-structured-content", {"location": "Chicago"})
    finally:
        del impl._run


def _returns(result: hr.ToolResult) -> Any:
    async def run(arguments: dict[str, Any], ctx: Any) -> hr.ToolResult:
        return result

    return run


async def test_hyphenated_tools_through_an_agent(everything: hr.mcp.MCPToolset) -> None:
    store = hr.Store.memory()
    policy = hr.Policy.default().layer("t").allow("call", "every/get-sum")
    agent = hr.Agent(Scripted([call("every/get-sum", {"a": 2, "b": 3}), reply("5")]),
                     [everything], policy=policy)
    result = await agent.run("add", store=store)
    [record] = await store.calls(result.run_id)
    assert record.model_name == "every--get-hsum"
    assert record.tool == "every/get-sum"
    assert record.result is not None and "5" in record.result["content"][0]["text"]


async def test_progress_notifications_keep_a_long_call_alive(
        everything: hr.mcp.MCPToolset) -> None:
    # 5 s with a progress step every second, under a 3 s deadline.
    result = await hr.Toolbox([everything]).call("every/trigger-long-running-operation",
                                                 {"duration": 5, "steps": 5})
    assert not result.is_error
    assert "completed" in result.render_text().lower()


# -- elicitation ----------------------------------------------------------------------------

ELICIT = "every/trigger-elicitation-request"


def elicit_agent(everything: hr.mcp.MCPToolset) -> hr.Agent:
    policy = hr.Policy.default().layer("t").allow("call", ELICIT)
    return hr.Agent(Scripted([call(ELICIT), reply("thanks")]), [everything], policy=policy)


async def test_a_servers_elicitation_is_answered_by_the_runs_responder(
        everything: hr.mcp.MCPToolset) -> None:
    store = hr.Store.memory()
    result = await elicit_agent(everything).run(
        "go", store=store, responder=hr.FixedResponder('{"name": "Ada Lovelace"}'))
    assert isinstance(result.outcome, hr.Completed)
    [record] = await store.calls(result.run_id)
    assert record.result is not None
    assert "Ada Lovelace" in hr.ToolResult.from_dict(record.result).render_text()
    assert record.answers == [{"kind": "submit", "value": {"name": "Ada Lovelace"}}]


async def test_an_unanswered_elicitation_pauses_the_run_and_resumes_with_the_answer(
        everything: hr.mcp.MCPToolset, tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    agent = elicit_agent(everything)
    paused = await agent.run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingAnswer)
    [item] = [p for p in await store.pending() if p.state == "open"]
    assert item.payload["kind"] == "form" and "name" in item.payload["schema"]["properties"]
    resumed = await hr.resume_with_answer(store, paused.outcome.question_id,
                                          '{"name": "Grace Hopper"}', agent=agent)
    assert isinstance(resumed.outcome, hr.Completed)
    [record] = await store.calls(paused.run_id)
    assert record.result is not None
    assert "Grace Hopper" in hr.ToolResult.from_dict(record.result).render_text()
    await store.close()


async def test_a_declined_form_is_declined_to_the_server(everything: hr.mcp.MCPToolset) -> None:
    store = hr.Store.memory()
    # Not a JSON object of the form's shape: the tool (here: the server) hears a decline.
    result = await elicit_agent(everything).run("go", store=store,
                                                responder=hr.FixedResponder('{"name": 5}'))
    [record] = await store.calls(result.run_id)
    assert record.result is not None
    assert "declined" in hr.ToolResult.from_dict(record.result).render_text().lower()
