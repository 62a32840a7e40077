"""The tool control (issue 19): an adjudicator asked about every granted, valid call.

Round trips with a Python callable (sync and async) and a shell script; adjudicators that
crash, hang or babble each refuse (fail closed); a hold parks the run for a person and a
person's approval overrides it; the manifest pins the control and its digest covers it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import handrail as hr
from handrail.approval import CallableControl, adjudicate
from handrail.models import Scripted, ToolResultMessage, call, calls, reply

pytestmark = pytest.mark.anyio

EXECUTED: list[dict[str, Any]] = []


@hr.tool(server="ledger", mutates=False)
async def balance(account: str) -> int:
    """Read a balance."""
    return {"alice": 120, "bob": 7}[account]


@hr.tool(server="ledger", name="transfer")
async def transfer(source: str, target: str, amount: int) -> str:
    """Move money."""
    EXECUTED.append({"source": source, "target": target, "amount": amount})
    return f"moved {amount}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    EXECUTED.clear()


ALLOW_ALL = hr.Policy.default().layer("app").allow("call", "ledger/*")

MOVE = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 5})


def agent(turns: list[Any], control: Any, *, policy: hr.Policy | None = None,
          **kw: Any) -> hr.Agent:
    return hr.Agent(Scripted(turns), [balance, transfer], policy=policy or ALLOW_ALL,
                    control=control, **kw)


def tool_results(messages: Sequence[Any]) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


def seen(into: list[list[ToolResultMessage]]) -> Any:
    def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Any:
        into.append(tool_results(messages))
        return reply("done")

    return turn


def by_amount(query: dict[str, Any]) -> dict[str, Any]:
    """A sync control: small transfers pass, large ones are held, negative ones refused."""
    QUERIES.append(query)
    if query["tool"] != "ledger/transfer":
        return {"decision": "pass", "reason": "reads are fine"}
    amount = query["input"]["amount"]
    if amount < 0:
        return {"decision": "refuse", "reason": "negative amounts are fraud"}
    if amount > 100:
        return {"decision": "hold", "reason": f"{amount} is over the 100 limit"}
    return {"decision": "pass", "reason": ""}


async def by_amount_async(query: dict[str, Any]) -> dict[str, Any]:
    await anyio.lowlevel.checkpoint()
    return by_amount(query)


QUERIES: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def _clear_queries() -> None:
    QUERIES.clear()


SCRIPT = r"""#!/bin/sh
# A control in shell: the query arrives on stdin as one JSON object.
query=$(cat)
echo "$query" >> "$(dirname "$0")/queries.log"
case "$query" in
  *'"amount":-'*) echo '{"decision": "refuse", "reason": "negative amounts are fraud"}' ;;
  *'"amount":500'*) echo '{"decision": "hold", "reason": "500 is over the 100 limit"}' ;;
  *) echo '{"decision": "pass", "reason": "ok"}' ;;
esac
"""


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def shell_control(tmp_path: Path) -> hr.CommandControl:
    return hr.CommandControl([str(script(tmp_path / "adjudicate.sh", SCRIPT))], timeout=30)


def controls(tmp_path: Path) -> list[Any]:
    return [by_amount, by_amount_async,
            hr.CommandControl([str(script(tmp_path / "adjudicate.sh", SCRIPT))], timeout=30)]


@pytest.fixture(params=["sync", "async", "shell"])
def control(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return controls(tmp_path)[["sync", "async", "shell"].index(request.param)]


# ------------------------------------------------------------------ round trips


async def test_pass_runs_the_call_and_records_the_control(control: Any) -> None:
    store = hr.Store.memory()
    got: list[list[ToolResultMessage]] = []
    result = await agent([MOVE, seen(got)], control).run("pay", store=store)
    assert result.outcome == hr.Completed("done")
    assert EXECUTED == [{"source": "alice", "target": "bob", "amount": 5}]
    (record,) = await store.calls(result.run_id)
    assert record.verdict is not None and record.verdict["control"]["decision"] == "pass"
    assert record.verdict["effect"] == "allow"


async def test_the_query_is_the_documented_object(tmp_path: Path) -> None:
    store = hr.Store.memory()
    result = await agent([MOVE, reply("done")], by_amount, name="payer").run(
        "pay", store=store)
    (query,) = QUERIES
    assert query == {"id": "call_0_0", "run_id": result.run_id, "agent": "payer",
                     "tool": "ledger/transfer",
                     "input": {"source": "alice", "target": "bob", "amount": 5},
                     "actions": [{"act": "call", "target": "ledger/transfer"}]}
    # The command reads exactly the same object.
    log = tmp_path / "queries.log"
    shell = hr.CommandControl([str(script(tmp_path / "adjudicate.sh", SCRIPT))], timeout=30)
    await agent([MOVE, reply("done")], shell, name="payer").run("pay", store=store)
    assert {k: v for k, v in json.loads(log.read_text()).items() if k != "run_id"} == \
        {k: v for k, v in query.items() if k != "run_id"}


async def test_refuse_is_a_model_visible_error_not_sent(control: Any) -> None:
    store = hr.Store.memory()
    got: list[list[ToolResultMessage]] = []
    negative = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": -5})
    result = await agent([negative, seen(got)], control).run("pay", store=store)
    assert result.outcome == hr.Completed("done")
    assert EXECUTED == []
    (message,) = got[0]
    assert message.result.is_error
    assert "negative amounts are fraud" in message.result.render_text()
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED
    assert record.disposition == "not_sent"
    assert record.error == "refused by the tool control: negative amounts are fraud"


async def test_a_pass_still_goes_through_the_policy(control: Any) -> None:
    deny = ALLOW_ALL.deny("call", "ledger/transfer")
    store = hr.Store.memory()
    got: list[list[ToolResultMessage]] = []
    result = await agent([MOVE, seen(got)], control, policy=deny).run("pay", store=store)
    assert result.outcome == hr.Completed("done") and EXECUTED == []
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED
    assert record.verdict is not None and record.verdict["effect"] == "deny"
    assert record.verdict["control"]["decision"] == "pass"


async def test_a_pass_still_goes_to_the_approver_when_the_policy_asks(control: Any) -> None:
    ask = hr.Policy.default().layer("app").ask("call", "ledger/transfer")
    result = await agent([MOVE, reply("done")], control, policy=ask).run(
        "pay", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.AwaitingApproval) and EXECUTED == []


async def test_hold_parks_the_run_and_a_persons_approval_overrides_it(
        control: Any, tmp_path: Path) -> None:
    big = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 500})
    got: list[list[ToolResultMessage]] = []
    async with hr.Store.open(tmp_path / "runs.db") as store:
        # The agent's approver approves everything: a hold is not its to decide.
        held = await agent([big, seen(got)], control).run("pay", store=store,
                                                           approver=hr.ApproveAll())
        assert isinstance(held.outcome, hr.AwaitingApproval)
        assert EXECUTED == []
        (item,) = await store.pending(kind="approval")
        request = hr.Request.from_dict(item.payload)
        assert request.held == "500 is over the 100 limit"
        assert "500 is over the 100 limit" in request.verdict_reason
        # A resume with a deciding approver leaves it parked too.
        again = await hr.resume(store, held.run_id, agent=agent([big, seen(got)], control),
                                approver=hr.ApproveAll())
        assert again.outcome == held.outcome and EXECUTED == []
        done = await hr.resume_with_decision(store, held.outcome.request_id,
                                             hr.Decision.approve(),
                                             agent=agent([big, seen(got)], control))
    assert done.outcome == hr.Completed("done")
    assert EXECUTED == [{"source": "alice", "target": "bob", "amount": 500}]


async def test_a_person_can_deny_a_hold(control: Any) -> None:
    store = hr.Store.memory()
    big = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 500})
    got: list[list[ToolResultMessage]] = []
    held = await agent([big, seen(got)], control).run("pay", store=store)
    assert isinstance(held.outcome, hr.AwaitingApproval)
    done = await hr.resume_with_decision(store, held.outcome.request_id,
                                         hr.Decision.deny("no"),
                                         agent=agent([big, seen(got)], control))
    assert done.outcome == hr.Completed("done") and EXECUTED == []
    assert "no" in got[0][0].result.render_text()


async def test_the_control_is_asked_again_on_resume_and_for_a_modified_approval() -> None:
    store = hr.Store.memory()
    big = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 500})
    got: list[list[ToolResultMessage]] = []
    held = await agent([big, seen(got)], by_amount).run("pay", store=store)
    assert isinstance(held.outcome, hr.AwaitingApproval)
    assert len(QUERIES) == 1
    # The person approves a modification the control refuses: refused, never performed.
    done = await hr.resume_with_decision(
        store, held.outcome.request_id,
        hr.Decision.approve(modified={"source": "alice", "target": "bob", "amount": -1}),
        agent=agent([big, seen(got)], by_amount))
    assert done.outcome == hr.Completed("done") and EXECUTED == []
    # Asked on resume (the recorded arguments), then for the modified ones.
    assert [q["input"]["amount"] for q in QUERIES] == [500, 500, -1]
    assert "negative amounts are fraud" in got[0][0].result.render_text()


async def test_a_control_that_refuses_on_resume_wins_over_the_approval() -> None:
    store = hr.Store.memory()
    big = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 500})
    frozen: list[str] = []

    def accounts(query: dict[str, Any]) -> dict[str, Any]:
        # The same control (the run's recorded one), whose answer changed while it paused.
        if frozen:
            return {"decision": "refuse", "reason": "frozen account"}
        return by_amount(query)

    held = await agent([big, reply("x")], accounts).run("pay", store=store)
    assert isinstance(held.outcome, hr.AwaitingApproval)
    frozen.append("bob")
    done = await hr.resume_with_decision(store, held.outcome.request_id,
                                         hr.Decision.approve(),
                                         agent=agent([big, reply("done")], accounts))
    assert done.outcome == hr.Completed("done") and EXECUTED == []


async def test_a_resume_under_another_control_is_refused_naming_it() -> None:
    """Issue 32: the control is a piece of the run's recorded governance."""
    store = hr.Store.memory()
    big = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 500})
    held = await agent([big, reply("x")], by_amount).run("pay", store=store)
    assert isinstance(held.outcome, hr.AwaitingApproval)

    def another(query: dict[str, Any]) -> dict[str, Any]:
        return {"decision": "pass", "reason": ""}

    for control in (another, None):
        with pytest.raises(hr.ResumeRefused, match=r"tool control python test_control\.by_amount"):
            await hr.resume_with_decision(store, held.outcome.request_id,
                                          hr.Decision.approve(),
                                          agent=agent([big, reply("done")], control))
    assert (await store.pending_item(held.outcome.request_id)).state == "open"
    assert EXECUTED == []


async def test_the_control_sees_only_granted_valid_calls() -> None:
    bad = call("ledger/transfer", {"source": "alice"})  # missing fields
    unknown = call("ledger/nope", {})
    result = await agent([bad, unknown, reply("done")], by_amount).run(
        "pay", store=hr.Store.memory())
    assert result.outcome == hr.Completed("done")
    assert QUERIES == []


# ------------------------------------------------------------------ fails closed


async def refused_by(control: Any) -> tuple[str, str]:
    """Run one transfer under `control`; the model's text and the record's error."""
    store = hr.Store.memory()
    got: list[list[ToolResultMessage]] = []
    result = await agent([MOVE, seen(got)], control).run("pay", store=store)
    assert result.outcome == hr.Completed("done")
    assert EXECUTED == []
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED and record.disposition == "not_sent"
    assert record.verdict is not None and record.verdict["control"]["failed"] is True
    text = got[0][0].result.render_text()
    assert got[0][0].result.is_error
    assert record.error is not None
    return text, record.error


async def test_a_crashing_command_refuses(tmp_path: Path) -> None:
    crash = script(tmp_path / "crash.sh", "#!/bin/sh\necho 'boom: no config' >&2\nexit 3\n")
    text, error = await refused_by(hr.CommandControl([str(crash)]))
    assert "exited with code 3" in error and "boom: no config" in error
    assert "could not check this call" in text


async def test_a_command_killed_by_a_signal_after_printing_pass_refuses(tmp_path: Path) -> None:
    # Its answer was written, but it did not end well (the machine's OOM killer, a crash in
    # its cleanup): an exit that is not 0 fails closed, a signal as much as an exit code.
    killed = script(tmp_path / "killed.sh", '#!/bin/sh\ncat > /dev/null\n'
                    'echo \'{"decision": "pass", "reason": "fine"}\'\nkill -9 $$\n')
    _, error = await refused_by(hr.CommandControl([str(killed)]))
    assert "was killed by signal 9" in error


async def test_a_missing_command_refuses(tmp_path: Path) -> None:
    _, error = await refused_by(hr.CommandControl([str(tmp_path / "absent")]))
    assert "could not start" in error


async def test_a_hanging_command_refuses_and_its_process_group_is_killed(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    hang = script(tmp_path / "hang.sh",
                  f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\nsleep 300\n")
    # Refused at its timeout, not after the program's 300 s: the error says so, and the
    # program's group is dead below (no clock asserted).
    _, error = await refused_by(hr.CommandControl([str(hang)], timeout=1))
    assert "timed out after 1s" in error
    child = int(pids.read_text())
    # The background child of the program is gone too (killed with its group, reaped by
    # init): poll its state without sleeping for coordination.
    with anyio.fail_after(10):
        # Another process's state: there is no event to wait on.
        while _alive(child):  # noqa: ASYNC110
            await anyio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("output", "why"), [
    ('{"decision": "pass", "reason": "a"}\n{"decision": "pass", "reason": "b"}\n',
     "exactly one JSON line, it printed 2"),
    ("", "exactly one JSON line, it printed 0"),
    ("yes\n", "not JSON"),
    ('{"decision": "allow", "reason": ""}\n', "must be 'pass', 'refuse' or 'hold'"),
    ('["pass"]\n', "answered list"),
    ('{"decision": "pass", "reason": "", "extra": 1}\n', "unknown key(s) ['extra']"),
    ('{"decision": "pass", "reason": 5}\n', "reason must be a string"),
])
async def test_a_babbling_command_refuses(tmp_path: Path, output: str, why: str) -> None:
    (tmp_path / "out.txt").write_text(output)
    babble = script(tmp_path / "babble.sh", f"#!/bin/sh\ncat > /dev/null\ncat {tmp_path}/out.txt\n")
    _, error = await refused_by(hr.CommandControl([str(babble)]))
    assert why in error


async def test_an_oversized_answer_refuses_without_being_read_whole(tmp_path: Path) -> None:
    # An endless answer: the read stops at the bound, and the program is killed.
    # Refused at the bound, not at the 30 s timeout (which would say "timed out").
    flood = script(tmp_path / "flood.sh", "#!/bin/sh\nyes pass\n")
    _, error = await refused_by(hr.CommandControl([str(flood)], max_output_bytes=1000,
                                                  timeout=30))
    assert "exceeds 1000 bytes" in error


async def test_a_python_control_that_raises_or_answers_badly_refuses() -> None:
    def raises(query: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("database down")

    _, error = await refused_by(raises)
    assert "RuntimeError: database down" in error
    _, error = await refused_by(lambda q: "pass")
    assert "answered str" in error

    async def hangs(query: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    _, error = await refused_by(CallableControl(hangs, timeout=0.5))
    assert "timed out after 0.5s" in error


async def test_a_long_reason_is_cut() -> None:
    verdict = await adjudicate(CallableControl(
        lambda q: {"decision": "refuse", "reason": "x" * 50_000}), {})
    assert verdict.decision == "refuse" and len(verdict.reason) < 1100


async def test_bad_control_arguments_are_clear_errors() -> None:
    with pytest.raises(hr.UserError, match="argv"):
        hr.CommandControl("./adjudicate.sh")  # type: ignore[arg-type]
    with pytest.raises(hr.UserError, match="argv"):
        hr.CommandControl([])
    with pytest.raises(hr.UserError, match="timeout"):
        hr.CommandControl(["x"], timeout=0)
    with pytest.raises(hr.UserError, match="control="):
        agent([], 42)


# ------------------------------------------------------------------ the manifest pins it


MANIFEST = """
[agent]
name = "payer"

[[tools]]
ref = "ledger/balance"
mutates = false

[[tools]]
ref = "ledger/transfer"
"""


def test_control_section_is_covered_by_the_digest_and_round_trips() -> None:
    plain = hr.Manifest.from_toml(MANIFEST)
    assert "control" not in plain.canonical()  # digests of manifests without one unchanged
    pinned = hr.Manifest.from_toml(MANIFEST + '\n[control]\ncommand = ["./adj.sh"]\n')
    assert pinned.control.command == ("./adj.sh",)
    other = hr.Manifest.from_toml(MANIFEST + '\n[control]\ncommand = ["./adj.sh", "-v"]\n')
    slow = hr.Manifest.from_toml(MANIFEST + '\n[control]\ncommand = ["./adj.sh"]\n'
                                 'timeout = 9\n')
    assert len({plain.digest, pinned.digest, other.digest, slow.digest}) == 4
    assert hr.Manifest.from_toml(slow.to_toml()) == slow


@pytest.mark.parametrize(("text", "message"), [
    ('[control]\ncommand = "./adj.sh"\n', "command in [control] must be a non-empty array"),
    ("[control]\ncommand = []\n", "command in [control] must be a non-empty array"),
    ('[control]\ncommand = ["x"]\ntimeout = -1\n', "timeout in [control] must be a positive"),
    ("[control]\ntimeout = 3\n", "needs command"),
    ('[control]\ncommand = ["x"]\nshell = true\n', "unknown key 'shell'"),
])
def test_a_bad_control_section_is_refused(text: str, message: str) -> None:
    with pytest.raises(hr.ManifestError, match=re.escape(message)):
        hr.Manifest.from_toml(MANIFEST + "\n" + text)


async def test_a_manifest_pins_its_control(tmp_path: Path) -> None:
    adj = script(tmp_path / "adjudicate.sh", SCRIPT)
    reviewed = hr.Manifest.from_toolbox(hr.Toolbox([balance, transfer])).to_toml()
    manifest = hr.Manifest.from_toml(reviewed + f'\n[control]\ncommand = ["{adj}"]\n'
                                     "timeout = 20\n")
    negative = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": -5})
    pinned = hr.Agent(Scripted([negative, reply("done")]), [balance, transfer],
                      policy=ALLOW_ALL, manifest=manifest)
    store = hr.Store.memory()
    result = await pinned.run("pay", store=store)
    (record,) = await store.calls(result.run_id)
    assert record.error == "refused by the tool control: negative amounts are fraud"
    # The same control, said again, is accepted; a different one is refused.
    hr.Agent(Scripted([]), [balance, transfer], manifest=manifest,
             control=hr.CommandControl([str(adj)], timeout=20))
    with pytest.raises(hr.UserError, match="pins the tool control"):
        hr.Agent(Scripted([]), [balance, transfer], manifest=manifest, control=by_amount)
    with pytest.raises(hr.UserError, match="pins the tool control"):
        hr.Agent(Scripted([]), [balance, transfer], manifest=manifest,
                 control=hr.CommandControl([str(adj)]))


async def test_a_command_runs_in_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    where = script(tmp_path / "where.sh",
                   "#!/bin/sh\ncat >/dev/null\npwd > ../cwd.txt\n"
                   'echo \'{"decision": "pass", "reason": ""}\'\n')
    await agent([MOVE, reply("done")], hr.CommandControl([str(where)]),
                workspace=ws).run("pay", store=hr.Store.memory())
    assert Path((tmp_path / "cwd.txt").read_text().strip()) == ws.resolve()
    assert os.getcwd() != str(ws)


# ------------------------------------------------------------------ across processes

PAYER = '''
import handrail as hr
from pathlib import Path
from handrail.models import Scripted, call, reply

HERE = Path(__file__).resolve().parent

@hr.tool(server="ledger", name="transfer")
async def transfer(source: str, target: str, amount: int) -> str:
    """Move money."""
    (HERE / "paid.txt").write_text(f"{amount}")
    return f"moved {amount}"

def build(run=None):
    model = Scripted([call("ledger/transfer", {"source": "a", "target": "b", "amount": 500}),
                      lambda messages, tools: reply("paid: " + messages[-1].result.render_text())])
    return hr.Agent(model, [transfer], name="payer", ref="payer:build",
                    policy=hr.Policy.default().layer("app").allow("call", "ledger/*"),
                    control=hr.CommandControl([str(HERE / "adjudicate.sh")], timeout=30))
'''


@pytest.mark.slow
def test_a_hold_is_approved_from_the_cli_in_another_process(tmp_path: Path) -> None:
    script(tmp_path / "adjudicate.sh", SCRIPT)
    (tmp_path / "payer.py").write_text(PAYER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    env.pop("HANDRAIL_STORE", None)
    start = ("import anyio, handrail as hr, payer\n"
             "async def main():\n"
             "    async with hr.Store.open('.handrail/runs.db') as store:\n"
             "        r = await payer.build().run('pay', store=store,"
             " approver=hr.ApproveAll())\n"
             "        print(r.outcome.kind, r.outcome.request_id)\n"
             "anyio.run(main)\n")
    started = subprocess.run([sys.executable, "-c", start], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env=env)
    assert started.returncode == 0, started.stderr
    kind, request_id = started.stdout.split()
    assert kind == "awaiting_approval"
    assert not (tmp_path / "paid.txt").exists()
    pending = subprocess.run([sys.executable, "-m", "handrail.cli", "pending", "--json"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120,
                             env=env)
    (item,) = json.loads(pending.stdout)
    assert item["payload"]["held"] == "500 is over the 100 limit"
    approved = subprocess.run([sys.executable, "-m", "handrail.cli", "approve", request_id],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=env)
    assert approved.returncode == 0, approved.stderr
    assert "paid: moved 500" in approved.stdout
    assert (tmp_path / "paid.txt").read_text() == "500"
    # Asked when the call was made, and again by the process that resumed it.
    assert len((tmp_path / "queries.log").read_text().splitlines()) == 2


async def test_a_turns_calls_are_put_to_the_control_together() -> None:
    # Each answer waits until all three were asked: asked one after another, the first would
    # time out (and refuse).
    asked: list[str] = []
    everyone = anyio.Event()

    async def together(query: dict[str, Any]) -> dict[str, Any]:
        asked.append(query["id"])
        if len(asked) == 3:
            everyone.set()
        await everyone.wait()
        return {"decision": "pass", "reason": ""}

    three = calls([("ledger/balance", {"account": "alice"}),
                   ("ledger/balance", {"account": "bob"}),
                   ("ledger/balance", {"account": "alice"})])
    got: list[list[ToolResultMessage]] = []
    result = await agent([three, seen(got)], CallableControl(together, timeout=5)).run(
        "sum", store=hr.Store.memory())
    assert result.outcome == hr.Completed("done")
    assert [m.result.is_error for m in got[0]] == [False, False, False]


async def test_a_childs_own_control_adds_its_refusal_to_its_roots_pass(tmp_path: Path) -> None:
    # A tree's calls go to the root's control first, then to the child's own: a child's
    # control can only add refusals (docs/control.md, docs/subagents.md). Here the root's
    # passes everything and the child's refuses its write: the write is refused.
    from handrail.builtin import WriteFile

    asked: list[str] = []

    def root_control(query: dict[str, Any]) -> dict[str, str]:
        asked.append(f"root {query['tool']}")
        return {"decision": "pass", "reason": ""}

    def kid_control(query: dict[str, Any]) -> dict[str, str]:
        asked.append(f"kid {query['tool']}")
        return {"decision": "refuse", "reason": "the kid writes nothing"}

    allow = (hr.Policy.default().layer("app").allow(hr.Act.WRITE, "**")
             .allow(hr.Act.CALL, "agents/*"))
    kid = hr.Agent(Scripted([call("workspace/write_file", {"path": "kid.txt", "content": "x"}),
                             reply("kid done")]),
                   [WriteFile], policy=allow, workspace=tmp_path, name="kid",
                   control=kid_control)
    root = hr.Agent(Scripted([call("agents/kid", {"task": "go"}), reply("done")]),
                    [kid.as_tool()], policy=allow, workspace=tmp_path, name="root",
                    control=root_control)
    store = hr.Store.memory()
    result = await root.run("go", store=store)
    assert result.outcome == hr.Completed("done")
    assert not (tmp_path / "kid.txt").exists()
    assert asked == ["root agents/kid", "root workspace/write_file", "kid workspace/write_file"]
    [child] = [r for r in await store.runs() if r.depth == 1]
    [write] = await store.calls(child.id)
    assert write.status is hr.CallStatus.REFUSED and write.verdict is not None
    assert write.verdict["control"] == {"decision": "refuse",
                                        "reason": "the kid writes nothing"}
