"""Two resumes of one run in the same process drive it once.

Story: `hr.resume` claimed the run under a fresh owner, then loaded its history and rebuilt
the taint index (awaits, a thread hop) before the runner registered that owner as alive in
this process. A second `hr.resume` of the same run in that window saw a RUNNING run whose
owner was of this process but not registered, took it for orphaned (a runner that died),
claimed it too, and both drove it: the approved write happened twice. The owner is now
registered before the claim.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio


async def test_two_concurrent_resumes_of_one_run_perform_it_once(tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"

    @hr.tool(server="ledger", mutates=True)
    async def pay(amount: int) -> str:
        """Pay an amount.

        Args:
            amount: How much.
        """
        with effects.open("a") as fh:
            fh.write(f"{amount}\n")
        return "paid"

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("ledger/pay", {"amount": 5}), reply("done")]), [pay],
                        policy=hr.Policy.default().layer("app").ask(hr.Act.CALL, "ledger/**"))

    store = hr.Store.open(tmp_path / "runs.db")
    paused = await build().run("pay", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    await store.decide(paused.outcome.request_id, hr.Decision.approve().to_dict(), "alice")

    outcomes: list[object] = []

    async def resume_once() -> None:
        try:
            result = await hr.resume(store, paused.run_id, agent=build())
            outcomes.append(result.outcome)
        except hr.ResumeRefused as exc:
            outcomes.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume_once)
            tg.start_soon(resume_once)
    await store.close()
    assert effects.read_text() == "5\n"  # performed exactly once
    assert sum(isinstance(o, hr.Completed) for o in outcomes) == 1, outcomes
    assert sum(isinstance(o, hr.ResumeRefused) for o in outcomes) == 1, outcomes
