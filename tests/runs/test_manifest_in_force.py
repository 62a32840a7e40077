"""The manifest at runtime: checked at construction, only grants offered, digest pinned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import handrail as hr
from handrail.manifest import Manifest
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@hr.tool(server="ledger", mutates=False)
async def read(account: str) -> int:
    """Read a balance (code docstring)."""
    RAN.append("read")
    return 1


@hr.tool(server="ledger")
async def wipe(account: str) -> str:
    """Wipe an account."""
    RAN.append("wipe")
    return "wiped"


MANIFEST = """
[agent]
name = "ledger-bot"
instructions = "You read ledgers."

[[tools]]
ref = "ledger/read"
mutates = false
description = "Read one account's balance (reviewed text)."
"""


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


def _seen(into: list[Any]) -> Any:
    def turn(messages: Sequence[Any], tools: Sequence[hr.ToolSpec]) -> Turn:
        into.append(([m for m in messages if isinstance(m, ToolResultMessage)], list(tools)))
        return reply("done")

    return turn


def test_construction_checks_the_toolbox_against_the_manifest() -> None:
    manifest = Manifest.from_toml(MANIFEST)
    with pytest.raises(hr.ManifestDrift, match="ledger/wipe"):
        hr.Agent(Scripted([]), [read, wipe], manifest=manifest)


async def test_only_granted_tools_are_offered_with_the_manifest_descriptions() -> None:
    manifest = Manifest.from_toml(MANIFEST)
    box = hr.Toolbox([read])
    seen: list[Any] = []
    agent = hr.Agent(Scripted([call("ledger/read", {"account": "a"}), _seen(seen)]), box,
                     manifest=manifest)
    assert agent.name == "ledger-bot" and agent.instructions == "You read ledgers."
    store = hr.Store.memory()
    result = await agent.run("go", store=store)
    assert isinstance(result.outcome, hr.Completed)
    (_, tools) = seen[0]
    assert [(str(t.id), t.description) for t in tools] == [
        ("ledger/read", "Read one account's balance (reviewed text).")]
    assert (await store.run(result.run_id)).manifest_digest == manifest.digest


async def test_a_call_to_an_ungranted_tool_is_declined_uniformly() -> None:
    # The toolbox may hold more than the manifest grants only if check_against passes; build
    # the gate's view directly: an agent over a manifest granting `read`, and a model that
    # names a tool it was never offered.
    manifest = Manifest.from_toml(MANIFEST)
    seen: list[Any] = []
    agent = hr.Agent(Scripted([call("ledger/wipe", {"account": "a"}), _seen(seen)]), [read],
                     manifest=manifest)
    result = await agent.run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    (results, _) = seen[0]
    assert results[0].result.is_error and "wipe" not in RAN


async def test_a_pinned_digest_refuses_a_changed_manifest() -> None:
    manifest = Manifest.from_toml(MANIFEST)
    hr.Agent(Scripted([]), [read], manifest=manifest, expect_digest=manifest.digest)
    changed = Manifest.from_toml(MANIFEST.replace("reviewed text", "edited text"))
    assert changed.digest != manifest.digest
    with pytest.raises(hr.UserError, match="expected"):
        hr.Agent(Scripted([]), [read], manifest=changed, expect_digest=manifest.digest)


async def test_resume_under_another_manifest_is_refused_unless_allowed() -> None:
    policy_manifest = MANIFEST.replace("mutates = false", "mutates = true")
    manifest = Manifest.from_toml(policy_manifest)
    store = hr.Store.memory()

    def build(m: Manifest) -> hr.Agent:
        return hr.Agent(Scripted([call("ledger/read", {"account": "a"}), reply("done")]),
                        [read], manifest=m)

    paused = await build(manifest).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    changed = Manifest.from_toml(policy_manifest.replace("reviewed text", "new text"))
    with pytest.raises(hr.ResumeRefused, match="allow_manifest_change"):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=build(changed))
    # Refused before anything was recorded: the approval is still open.
    assert [p.id for p in await store.pending()] == [paused.outcome.request_id]
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=build(changed),
                                         allow_manifest_change=True)
    assert isinstance(done.outcome, hr.Completed)
    run = await store.run(paused.run_id)
    assert any(e["kind"] == "manifest_changed" and e["to"] == changed.digest for e in run.events)


async def test_a_schema_the_manifest_supplies_is_enforced_at_stage_3() -> None:
    ran: list[dict[str, Any]] = []

    async def run(arguments: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        ran.append(arguments)
        return hr.ToolResult.text("sent")

    send = hr.tools.SchemaTool(hr.ToolSpec("mail/send", "", {"type": "object"}), run)
    manifest = Manifest.from_toml("""
[[tools]]
ref = "mail/send"
description = "Send one mail."
[tools.arguments]
type = "object"
required = ["to"]
additionalProperties = false
properties = { to = { type = "string" } }
""")
    seen: list[Any] = []
    agent = hr.Agent(Scripted([call("mail/send", {"to": 5}), call("mail/send", {"to": "a@b"}),
                               _seen(seen)]), [send], manifest=manifest,
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "mail/*"))
    result = await agent.run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    (results, tools) = seen[0]
    assert tools[0].input_schema["required"] == ["to"]
    assert "$.to" in results[0].result.render_text() and results[0].result.is_error
    assert ran == [{"to": "a@b"}]


PINNED = """
[agent]
name = "ledger-bot"
instructions = "You read ledgers."
model = "openai:gpt-4.1-mini"

[[tools]]
ref = "ledger/read"
mutates = false
description = "Read one account's balance (reviewed text)."
"""


def test_instructions_or_a_model_other_than_the_manifests_are_refused_naming_each() -> None:
    manifest = Manifest.from_toml(PINNED)
    model = Scripted([], name="openai:gpt-4.1-mini")
    agent = hr.Agent(model, [read], manifest=manifest)  # the manifest's words are used
    assert agent.instructions == "You read ledgers."
    spelled = hr.Agent(model, [read], manifest=manifest, instructions="  You read ledgers.\r\n")
    assert spelled.instructions == "You read ledgers."  # the model is told the reviewed text
    with pytest.raises(hr.ManifestDrift) as info:
        hr.Agent(Scripted([], name="anthropic:claude"), [read, wipe], manifest=manifest,
                 instructions="You move money.")
    found = info.value.problems
    assert len(found) == 3
    assert found[0].startswith("tool 'ledger/wipe' is implemented")
    assert found[1].startswith('the agent\'s instructions "You move money." differ from '
                               '[agent] instructions in the manifest, "You read ledgers."')
    assert found[2].startswith('the agent\'s model is "anthropic:claude", but [agent] in the '
                               'manifest pins model "openai:gpt-4.1-mini"')


def test_an_agent_section_without_instructions_pins_none() -> None:
    manifest = Manifest.from_toml(PINNED.replace('instructions = "You read ledgers."\n', ""))
    model = Scripted([], name="openai:gpt-4.1-mini")
    hr.Agent(model, [read], manifest=manifest)
    with pytest.raises(hr.ManifestDrift, match=r"states no instructions, but the agent is "
                                               r"given instructions \"Unreviewed\.\""):
        hr.Agent(model, [read], manifest=manifest, instructions="Unreviewed.")
    # No [agent] section at all: the manifest pins tools only.
    tools_only = Manifest.from_toml("[[tools]]" + PINNED.split("[[tools]]")[1])
    hr.Agent(Scripted([]), [read], manifest=tools_only, instructions="Anything.")


async def test_from_manifest_builds_the_agent_the_manifest_states(tmp_path: Any) -> None:
    path = tmp_path / "handrail.toml"
    path.write_text(PINNED + '\n[policy]\nextends = "default"\n[[policy.layers]]\n'
                    'name = "app"\ndeny = ["call:ledger/*"]\n', encoding="utf-8")
    agent = hr.Agent.from_manifest(path, [read], workspace=tmp_path)
    assert agent.model.name == "openai:gpt-4.1-mini"
    assert (agent.name, agent.instructions) == ("ledger-bot", "You read ledgers.")
    assert agent.manifest is not None and agent.manifest.policy is not None
    assert agent.policy.to_dict() == agent.manifest.policy.to_dict()
    # A Model object may stand in when its name is the manifest's model...
    scripted = hr.Agent.from_manifest(str(path), [read], workspace=tmp_path,
                                      model=Scripted([reply("hi")], name="openai:gpt-4.1-mini"))
    assert isinstance((await scripted.run("go")).outcome, hr.Completed)
    # ... and not when it is another.
    with pytest.raises(hr.ManifestDrift, match="pins model"):
        hr.Agent.from_manifest(path, [read], model=Scripted([]), workspace=tmp_path)
    no_model = tmp_path / "no-model.toml"
    no_model.write_text(PINNED.replace('model = "openai:gpt-4.1-mini"\n', ""), encoding="utf-8")
    with pytest.raises(hr.UserError, match="states no \\[agent\\] model; add model"):
        hr.Agent.from_manifest(no_model, [read])
    with pytest.raises(hr.UserError, match=r"takes a hr\.Manifest or the path"):
        hr.Agent.from_manifest(42, [read])
