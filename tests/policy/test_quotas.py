"""Quotas through the gate: `limit call "mail/send" 2 per 1d per agent`, counted at STARTED."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.errors import PolicyError
from handrail.models import Scripted, calls, reply
from handrail.policy import Effect, Limit, Policy
from handrail.store import CallRecord, CallStatus, Store

pytestmark = pytest.mark.anyio

SENT: list[str] = []


@hr.tool(server="mail", name="send")
async def send(to: str) -> str:
    """Send one email."""
    SENT.append(to)
    return f"sent to {to}"


def _policy(then: str = "deny", key: str = "agent", count: int = 2) -> Policy:
    return (Policy.default().layer("app").allow(hr.Act.CALL, "mail/send")
            .limit(hr.Act.CALL, "mail/send", count, per="1d", key=key, then=then))


def _agent(turns: list[list[str]], policy: Policy, tmp_path: Path, name: str = "mailer"
           ) -> hr.Agent:
    script: list[Any] = [calls([("mail/send", {"to": to}) for to in turn]) for turn in turns]
    return hr.Agent(Scripted([*script, reply("done")]), [send], policy=policy,
                    workspace=tmp_path, name=name)


async def _records(store: Store) -> list[CallRecord]:
    out: list[CallRecord] = []
    for run in await store.runs(limit=100):
        out += await store.calls(run.id)
    return sorted(out, key=lambda c: (c.started_at or 0, c.turn, c.index))


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    s = Store.memory() if request.param == "memory" else Store.open(tmp_path / "runs.db")
    yield s
    await s.close()


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()


async def test_the_call_over_the_limit_is_denied_with_the_count_and_window(
        store: Store, tmp_path: Path) -> None:
    agent = _agent([["a", "b", "c"], ["d"]], _policy(), tmp_path)
    await agent.run("mail", store=store, approver=hr.ApproveAll())
    assert SENT == ["a", "b"]
    records = await _records(store)
    by_to = {r.performed_arguments["to"] if r.performed_arguments else r.call_id: r
             for r in records}
    ran = [r for r in records if r.status is CallStatus.FINISHED]
    assert [r.verdict["quota"][0]["count"] for r in ran if r.verdict] == [1, 2]
    refused = [r for r in records if r.status is CallStatus.REFUSED]
    assert len(refused) == 2
    for r in refused:
        assert r.verdict is not None and r.verdict["effect"] == "deny"
        (entry,) = r.verdict["quota"]
        assert entry["count"] == 2 and entry["max"] == 2 and entry["over"] is True
        assert entry["key"] == "agent=mailer"
        assert entry["window"].endswith("T00:00:00Z") and ".." in entry["window"]
        assert r.error is not None and r.error.startswith(
            "limit call 'mail/send' 2 per 1d per agent, then deny in layer 'app': 2 of 2 "
            "used in ")
    assert by_to  # every call was recorded
    # The model is told what any denial says: nothing of the rules.
    assert all(r.result and "limit" not in str(r.result) for r in refused)


async def test_an_ask_over_the_limit_goes_to_the_approver_and_counts_once_approved(
        store: Store, tmp_path: Path) -> None:
    asked: list[hr.Request] = []

    def person(request: hr.Request) -> hr.Decision:
        asked.append(request)
        return hr.Decision.approve() if request.arguments["to"] == "c" else \
            hr.Decision.deny("enough")

    agent = _agent([["a", "b", "c"], ["d"], ["e"]], _policy(then="ask"), tmp_path)
    await agent.run("mail", store=store, approver=hr.CallbackApprover(person))
    assert SENT == ["a", "b", "c"]
    assert [r.arguments["to"] for r in asked] == ["c", "d", "e"]
    assert asked[0].verdict_reason.startswith(
        "limit call 'mail/send' 2 per 1d per agent, then ask in layer 'app': 2 of 2 used")
    # The approved one counted (3), over the limit; the denied ones did not (still 3).
    assert asked[2].verdict_reason.split(": ")[1].startswith("3 of 2 used")
    finished = [r for r in await _records(store) if r.status is CallStatus.FINISHED]
    assert [r.verdict["quota"][0]["count"] for r in finished if r.verdict] == [1, 2, 3]


async def test_refused_and_denied_calls_do_not_count(store: Store, tmp_path: Path) -> None:
    policy = (_policy(count=1).layer("rules").deny(hr.Act.CALL, "mail/send", when='to == "x"')
              .ask(hr.Act.CALL, "mail/send", when='to == "y"'))
    script = [calls([("mail/send", {"to": "x"}), ("mail/send", {"to": 5}),
                     ("mail/send", {"to": "y"})]), calls([("mail/send", {"to": "z"})])]
    agent = hr.Agent(Scripted([*script, reply("done")]), [send], policy=policy,
                     workspace=tmp_path, name="mailer")
    await agent.run("mail", store=store, approver=hr.DenyAll("no"))
    assert SENT == ["z"]  # the only call that started, and the limit of 1 let it


async def test_keys_count_apart_per_run_and_together_globally(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "runs.db")
    per_run = _policy(key="run")
    for _ in range(2):
        await _agent([["a", "b", "c"]], per_run, tmp_path).run("m", store=store)
    assert len(SENT) == 4
    SENT.clear()
    together = _policy(key="global", count=3)
    await _agent([["a", "b"]], together, tmp_path, name="one").run("m", store=store)
    await _agent([["c", "d"]], together, tmp_path, name="two").run("m", store=store)
    assert SENT == ["a", "b", "c"]
    SENT.clear()
    per_agent = _policy(key="agent", count=1)
    await _agent([["a", "b"]], per_agent, tmp_path, name="one").run("m", store=store)
    await _agent([["c", "d"]], per_agent, tmp_path, name="two").run("m", store=store)
    assert SENT == ["a", "c"]
    await store.close()


async def test_a_limit_in_a_sub_agents_policy_is_kept_by_contain() -> None:
    root = Policy.permissive()
    child = Policy().layer("child").limit("call", "mail/send", 1, per="1h")
    contained = root.contain(child)
    assert [limit for limit, _ in contained.limits] == [Limit(hr.Act.CALL, "mail/send", 1,
                                                              per="1h")]
    assert contained.limits_for([hr.Action(hr.Act.CALL, "MAIL/send")]) != ()  # any case


def test_limits_round_trip_through_toml_and_refuse_nonsense() -> None:
    policy = _policy(then="ask")
    again = Policy.from_toml(policy.to_toml())
    assert again == policy and again.limits == policy.limits
    with pytest.raises(PolicyError, match="the count is a whole number"):
        Limit("call", "mail/send", 0, per="1d")
    with pytest.raises(PolicyError, match="a window is a number and a unit"):
        Limit("call", "mail/send", 5, per="1 day")
    with pytest.raises(PolicyError, match="unknown key 'user'"):
        Limit("call", "mail/send", 5, per="1d", key="user")
    with pytest.raises(PolicyError, match="'ask' or 'deny', not 'allow'"):
        Limit("call", "mail/send", 5, per="1d", effect=Effect.ALLOW)
    with pytest.raises(PolicyError, match=r"<policy>:4: policy.layers\[0\].limits\[0\]"):
        Policy.from_toml('[[policy.layers]]\nname = "a"\nlimits = [\n'
                         '  { rule = "call:a/b", max = 5, per = "forever" },\n]\n')
    text = Limit("exec", "deploy **", 3, per="1h").describe()
    assert text == "limit exec 'deploy **' 3 per 1h, then deny"


async def test_per_principal_counts_who_started_the_run(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "runs.db")
    policy = _policy(key="principal", count=1)
    await _agent([["a", "b"]], policy, tmp_path).run("m", store=store, principal="ann")
    await _agent([["c"]], policy, tmp_path, name="other").run("m", store=store,
                                                               principal="ann")
    await _agent([["d", "e"]], policy, tmp_path).run("m", store=store, principal="bob")
    assert SENT == ["a", "d"]
    with pytest.raises(hr.UserError, match="principal="):
        await _agent([["a"]], policy, tmp_path).run("m", store=store, principal=" ")
    await store.close()


def test_handrail_show_prints_each_calls_quota(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    from handrail.cli import main

    db = tmp_path / "runs.db"

    async def go() -> str:
        async with Store.open(db) as store:
            result = await _agent([["a", "b"]], _policy(count=1), tmp_path).run(
                "m", store=store)
            return result.run_id

    run_id = anyio.run(go)
    assert main(["show", run_id, "--store", str(db)]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines() if "quota:" in line]
    assert len(lines) == 2
    assert lines[0].startswith("quota: limit call 'mail/send' 1 per 1d per agent, then deny: "
                               "1 of 1 in ")
    assert lines[0].endswith("(agent=mailer)")
    assert lines[1].endswith("(agent=mailer) — full, not counted")


def test_the_documented_policy_files_load_and_mean_what_the_page_says() -> None:
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
    blocks = re.findall(r"^```toml\n(.*?)^```", page, flags=re.S | re.M)
    (conditions,) = [b for b in blocks if "when =" in b]
    (limits,) = [b for b in blocks if "limits = [" in b]
    bank = Policy.from_toml(conditions)
    transfer = hr.Action(hr.Act.CALL, "bank/transfer")
    assert bank.check(transfer, arguments={"target": "x", "amount": 501}).effect is Effect.ASK
    assert bank.check(transfer, arguments={"target": "x", "amount": 10001}).effect \
        is Effect.DENY
    assert bank.check(transfer, arguments={"target": "x", "amount": 5}).effect is Effect.ALLOW
    mail = Policy.from_toml(limits)
    assert [limit.describe() for limit, _ in mail.limits] == [
        "limit call 'mail/send' 20 per 1d per agent, then ask",
        "limit exec 'deploy **' 3 per 1h, then deny"]


async def test_a_call_rerun_after_an_interruption_is_counted_once(tmp_path: Path) -> None:
    import anyio

    stop = anyio.Event()
    ran: list[str] = []

    @hr.tool(server="mail", name="send", idempotent=True)
    async def send_once(to: str) -> str:
        """Send one email (idempotent: a rerun after a crash sends nothing twice)."""
        if not stop.is_set():
            stop.set()  # the run is cancelled while this call is in flight
            await anyio.sleep_forever()
        ran.append(to)
        return f"sent to {to}"

    def make() -> hr.Agent:
        return hr.Agent(Scripted([calls([("mail/send", {"to": "a"})]), reply("done")]),
                        [send_once], policy=_policy(count=1, key="global"),
                        workspace=tmp_path, name="mailer")

    async with Store.open(tmp_path / "runs.db") as store:
        first = await make().run("mail", store=store, cancel=stop)
        assert first.outcome.kind == "cancelled"
        (record,) = await store.calls(first.run_id)
        assert record.status is CallStatus.STARTED and record.verdict is not None
        assert record.verdict["quota"][0]["counted"] is True
        done = await hr.resume(store, first.run_id, agent=make())
        assert done.outcome == hr.Completed("done")
        (record,) = await store.calls(first.run_id)
        # Its one start was counted when it first started: the rerun is not a second one
        # (with a limit of 1, a second count would have refused it).
        assert ran == ["a"] and record.status is CallStatus.FINISHED
        assert record.verdict is not None and record.verdict["quota"][0]["counted"] is True
