"""What-if with value conditions and quotas: conditions read the recorded arguments; a call a
quota held back cannot flip (a replay cannot recount)."""

from __future__ import annotations

from pathlib import Path

import pytest

import handrail as hr
from handrail.models import Scripted, calls, reply
from handrail.policy import Effect, Policy

pytestmark = pytest.mark.anyio


@hr.tool(server="bank", name="transfer")
async def transfer(target: str, amount: int) -> str:
    """Move money."""
    return f"moved {amount} to {target}"


async def test_a_proposed_condition_flips_only_the_calls_its_arguments_meet(
        tmp_path: Path) -> None:
    recorded = (Policy.default().layer("app").allow(hr.Act.CALL, "bank/transfer")
                .limit(hr.Act.CALL, "bank/transfer", 3, per="1d"))
    amounts = [10, 900, 20, 5000, 30]
    agent = hr.Agent(Scripted([calls([("bank/transfer", {"target": f"t{i}", "amount": a})
                                      for i, a in enumerate(amounts)]), reply("done")]),
                     [transfer], policy=recorded, workspace=tmp_path, name="payer")
    store = hr.Store.open(tmp_path / "runs.db")
    await agent.run("pay", store=store, approver=hr.ApproveAll())
    # Three ran (10, 900, 20); the quota held back 5000 and 30.
    proposed = recorded.layer("review").ask(hr.Act.CALL, "bank/transfer", when="amount > 500")
    report = await hr.policy.what_if(store, proposed)
    assert [(f.before, f.after, f.target) for f in report.flips] == [
        (Effect.ALLOW, Effect.ASK, "bank/transfer")]
    (flip,) = report.flips
    assert flip.reason_after.endswith("(amount 900 > 500)") and not flip.approximate
    assert report.replayed == 3 and report.undecided == 2  # the two the quota held back
    assert not report.failed
    # Decisions alone are read when the proposal has no conditions (what-if's fast path).
    plain = await hr.policy.what_if(store, recorded.layer("x").ask(hr.Act.CALL, "bank/**"))
    assert len(plain.flips) == 3
    await store.close()


async def test_a_refused_calls_condition_is_undecidable_and_marked_approximate(
        tmp_path: Path) -> None:
    recorded = Policy.default().layer("app").deny(hr.Act.CALL, "bank/transfer",
                                                  when="amount > 100")
    agent = hr.Agent(Scripted([calls([("bank/transfer", {"target": "t", "amount": 900})]),
                               reply("done")]),
                     [transfer], policy=recorded, workspace=tmp_path, name="payer")
    store = hr.Store.open(tmp_path / "runs.db")
    await agent.run("pay", store=store, approver=hr.ApproveAll())
    proposed = Policy.default().layer("app").ask(hr.Act.CALL, "bank/transfer",
                                                 when="amount > 1000")
    report = await hr.policy.what_if(store, proposed)
    (flip,) = report.flips
    assert (flip.before, flip.after) == (Effect.DENY, Effect.ASK) and flip.approximate
    assert "the arguments are not known here" in flip.reason_after
    await store.close()


def test_the_cli_reads_the_arguments_for_a_proposal_with_conditions_and_says_so_of_quotas(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    from handrail.cli import main

    recorded = (Policy.default().layer("app").allow(hr.Act.CALL, "bank/transfer")
                .limit(hr.Act.CALL, "bank/transfer", 1, per="1d"))
    db = tmp_path / "runs.db"

    async def go() -> None:
        agent = hr.Agent(Scripted([calls([("bank/transfer", {"target": "a", "amount": 900}),
                                          ("bank/transfer", {"target": "b", "amount": 9})]),
                                   reply("done")]),
                         [transfer], policy=recorded, workspace=tmp_path, name="payer")
        async with hr.Store.open(db) as store:
            await agent.run("pay", store=store)

    anyio.run(go)
    proposed = tmp_path / "proposed.toml"
    recorded.layer("review").deny(hr.Act.CALL, "bank/transfer", when="amount > 500") \
        .save(proposed)
    code = main(["policy", "what-if", str(proposed), "--store", str(db)])
    out = capsys.readouterr().out
    assert code == 0  # allowed -> deny tightens; nothing a person approved is denied
    assert "held back by a quota" in out and "Quotas are not replayed" in out
    assert "allow -> deny" in out and "amount 900 > 500" in out
