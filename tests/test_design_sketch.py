"""The public API sketch of DESIGN.md, end to end and offline (a scripted model stands in
for "openai:gpt-4.1-mini"): the names the design promises keep working."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

MOVED: list[tuple[str, str, int]] = []


@hr.tool(server="ledger", mutates=False)
async def read(account: str) -> int:
    """Read a ledger account's balance."""
    return 100


class Transfer(hr.Tool, server="ledger", name="transfer", interactions={"question"}):
    """Move money between two accounts."""

    source: str
    target: str
    amount: int = Field(gt=0)

    def actions(self) -> list[hr.Action]:
        return [hr.Action(hr.Act.CALL, f"ledger/transfer/{self.target}")]

    async def run(self, ctx: hr.CallContext) -> hr.ToolResult:
        if not await ctx.ask(hr.Question("Really?", choices=["yes", "no"])) == "yes":
            return hr.ToolResult.error("cancelled by the operator")
        MOVED.append((self.source, self.target, self.amount))
        return hr.ToolResult.json({"ok": True})


MANIFEST = """
[agent]
name = "payer"
instructions = "Pay invoices."

[[tools]]
ref = "ledger/read"
mutates = false
description = "Read a ledger account's balance."

[[tools]]
ref = "ledger/transfer"
description = "Move money between two accounts."
"""


async def test_the_design_sketch_runs(tmp_path: Path) -> None:
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    box = hr.Toolbox([read, Transfer])
    manifest = hr.Manifest.load(tmp_path / "handrail.toml")
    hr.manifest.check_against(box, manifest)

    policy = (hr.Policy.default()
              .layer("app").allow(hr.Act.WRITE, "src/**").deny(hr.Act.WRITE, "src/secrets/**")
              .ask(hr.Act.CALL, "ledger/transfer/*"))

    def build() -> hr.Agent:
        model = Scripted([call("ledger/read", {"account": "acme"}),
                          call("ledger/transfer", {"source": "acme", "target": "bob",
                                                   "amount": 40}),
                          reply("paid")])
        return hr.Agent(model=model, tools=box, policy=policy, manifest=manifest,
                        instructions="Pay invoices.", workspace=tmp_path)

    store = hr.Store.open(tmp_path / "runs.db")
    result = await build().run("pay the invoice", store=store)
    match result.outcome:
        case hr.AwaitingApproval(request_id=rid):
            pass
        case other:
            raise AssertionError(other)

    # later, any process:
    paused = await hr.resume_with_decision(store, rid, hr.Decision.approve(), agent=build())
    match paused.outcome:
        case hr.AwaitingAnswer(question_id=qid):
            pass
        case other:
            raise AssertionError(other)
    done = await hr.resume_with_answer(store, qid, "yes", agent=build())
    match done.outcome:
        case hr.Completed(output=out):
            assert out == "paid"
        case other:
            raise AssertionError(other)
    assert MOVED == [("acme", "bob", 40)]
    with pytest.raises(hr.ResumeRefused):
        await hr.resume(store, result.run_id, agent=build())
    await store.close()
