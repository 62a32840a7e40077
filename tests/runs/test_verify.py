"""The verification gate: a run whose final answer fails its check is not Completed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import forks
import pytest

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.cli import main
from handrail.models import Scripted, Turn, UserMessage, call, reply
from handrail.runs import outcome_from_dict

pytestmark = pytest.mark.anyio

CHECK = "import sys\nv = open('answer.txt').read()\nprint('answer is', v)\n" \
        "print('want 42', file=sys.stderr)\nsys.exit(0 if v == '42' else 1)\n"
ARGV = [sys.executable, "check.py"]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text("41")
    (ws / "check.py").write_text(CHECK)
    return ws


def allowing(*, exec_: bool = True) -> hr.Policy:
    policy = hr.Policy.default().layer("test").allow(hr.Act.WRITE, "answer.txt")
    return policy.allow(hr.Act.EXEC, " ".join(ARGV)) if exec_ else policy


class Watch:
    """Scripted turns that note what the model was told last before answering."""

    def __init__(self) -> None:
        self.told: list[Any] = []

    def reply(self, text: str) -> Any:
        def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            self.told.append(messages[-1])
            return reply(text)

        return turn

    def fix(self) -> Any:
        def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            self.told.append(messages[-1])
            return call("workspace/write_file", {"path": "answer.txt", "content": "42"})

        return turn


def claims_twice_then_fixes(watch: Watch) -> Scripted:
    return Scripted([reply("fixed"), watch.reply("fixed, really"), watch.fix(),
                     reply("fixed now")])


async def test_a_command_check_fails_twice_is_sent_back_then_completes(workspace: Path) -> None:
    watch = Watch()
    store = hr.Store.memory()
    agent = hr.Agent(claims_twice_then_fixes(watch), workspace_tools(), policy=allowing(),
                     workspace=workspace, verify=hr.Verify.command(ARGV, timeout=30))
    result = await agent.run("make the answer 42", store=store)

    assert result.outcome == hr.Completed("fixed now")
    # Both failures went back to the model, as user messages with the exit code and output.
    told = [m for m in watch.told if isinstance(m, UserMessage)]
    assert len(told) == 2
    for i, message in enumerate(told, start=1):
        assert f"attempt {i} of 3" in message.text
        assert "exited with code 1" in message.text
        assert "answer is 41" in message.text and "want 42" in message.text
    # The record: every attempt in the run's events, each command a call through the gate.
    run = await store.run(result.run_id)
    attempts = [hr.VerificationAttempt.from_dict(e) for e in run.events
                if e.get("kind") == "verification"]
    assert [(a.attempt, a.passed, a.exit_code) for a in attempts] == [
        (1, False, 1), (2, False, 1), (3, True, 0)]
    calls = await store.calls(result.run_id)
    checks = [c for c in calls if c.tool == "workspace/exec"]
    assert [c.id for c in checks] == [a.call_id for a in attempts]
    assert all(c.verdict and c.verdict["effect"] == "allow" for c in checks)
    assert all(c.status is hr.CallStatus.FINISHED for c in checks)
    stored = await store.messages(result.run_id)
    assert sum(1 for m in stored if m["kind"] == "user") == 3  # the task and two failures


async def test_a_callable_check_sync_or_async_gates_completion(workspace: Path) -> None:
    seen: list[hr.VerifyContext] = []

    def sync_check(ctx: hr.VerifyContext) -> hr.Verified | hr.NotVerified:
        seen.append(ctx)
        value = (ctx.workspace / "answer.txt").read_text()
        return hr.Verified() if value == "42" else hr.NotVerified(f"answer.txt says {value}")

    async def async_check(ctx: hr.VerifyContext) -> hr.Verified | hr.NotVerified:
        return sync_check(ctx)

    for check in (sync_check, async_check):
        (workspace / "answer.txt").write_text("41")
        seen.clear()
        watch = Watch()
        agent = hr.Agent(claims_twice_then_fixes(watch), workspace_tools(), policy=allowing(),
                         workspace=workspace)
        result = await agent.run("make it 42", verify=hr.Verify.check(check))
        assert result.outcome == hr.Completed("fixed now")
        assert [c.attempt for c in seen] == [1, 2, 3]
        assert [c.answer for c in seen] == ["fixed", "fixed, really", "fixed now"]
        told = [m.text for m in watch.told if isinstance(m, UserMessage)]
        assert len(told) == 2 and all("answer.txt says 41" in t for t in told)


async def test_the_limit_ends_the_run_failed_with_every_attempt(workspace: Path) -> None:
    store = hr.Store.memory()
    agent = hr.Agent(Scripted([reply("done")] * 5), workspace_tools(), policy=allowing(),
                     workspace=workspace, verify=hr.Verify.command(ARGV),
                     max_verify_attempts=2)
    result = await agent.run("make it 42", store=store)

    outcome = result.outcome
    assert isinstance(outcome, hr.Failed)
    assert outcome.verification is not None
    assert [(a.attempt, a.passed) for a in outcome.verification.attempts] == [
        (1, False), (2, False)]
    assert "failed its verification 2 times" in outcome.error
    # Stored, the outcome comes back whole.
    run = await store.run(result.run_id)
    assert run.status is hr.RunStatus.FAILED
    back = outcome_from_dict(run.outcome or {})
    assert isinstance(back, hr.Failed) and back.verification is not None
    assert back.verification.attempts == outcome.verification.attempts
    assert run.steps == 2  # the model was not asked again after the last check


async def test_a_check_the_policy_denies_ends_the_run_failed(workspace: Path) -> None:
    policy = allowing().layer("no-exec").deny(hr.Act.EXEC, "**")
    (workspace / "answer.txt").write_text("42")  # the check would pass, were it allowed
    watch = Watch()
    store = hr.Store.memory()
    agent = hr.Agent(Scripted([reply("done"), watch.reply("done")]), workspace_tools(),
                     policy=policy, workspace=workspace, verify=hr.Verify.command(ARGV))
    result = await agent.run("make it 42", store=store)

    outcome = result.outcome
    assert isinstance(outcome, hr.Failed), outcome
    assert "cannot be verified" in outcome.error and "refused" in outcome.error
    assert "deny exec '**'" in outcome.error  # which rule, for the operator
    assert outcome.verification is not None
    assert [a.passed for a in outcome.verification.attempts] == [False]
    assert watch.told == []  # the model was not asked to "fix" a denial
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED and record.tool == "workspace/exec"
    assert (await store.run(result.run_id)).status is hr.RunStatus.FAILED


async def test_an_approver_denying_the_check_ends_the_run_failed(workspace: Path) -> None:
    agent = hr.Agent(Scripted([reply("done")]), workspace_tools(), policy=allowing(exec_=False),
                     workspace=workspace, verify=hr.Verify.command(ARGV))
    result = await agent.run("x", approver=hr.DenyAll())
    assert isinstance(result.outcome, hr.Failed)
    assert "cannot be verified" in result.outcome.error


async def test_an_ask_on_the_check_pauses_and_the_decision_continues_it(workspace: Path
                                                                      ) -> None:
    (workspace / "answer.txt").write_text("42")
    store = hr.Store.memory()
    agent = hr.Agent(Scripted([reply("done")]), workspace_tools(), policy=allowing(exec_=False),
                     workspace=workspace, verify=hr.Verify.command(ARGV))
    paused = await agent.run("x", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    (item,) = await store.pending()
    assert item.tool == "workspace/exec" and item.payload["target"].endswith("check.py")
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=agent)
    assert done.outcome == hr.Completed("done")
    run = await store.run(done.run_id)
    assert [e["passed"] for e in run.events if e.get("kind") == "verification"] == [True]


async def test_a_resumed_run_is_held_to_the_command_it_recorded(workspace: Path) -> None:
    """The resuming agent has no check (or another one): the recorded command still runs."""
    store = hr.Store.memory()
    model = Scripted([reply("done"), reply("done")])
    agent = hr.Agent(model, workspace_tools(), policy=allowing(exec_=False),
                     workspace=workspace, verify=hr.Verify.command(ARGV),
                     max_verify_attempts=1)
    paused = await agent.run("x", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    lenient = hr.Agent(model, workspace_tools(), policy=allowing(exec_=False),
                       workspace=workspace, verify=hr.Verify.command(["true"]))
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=lenient)
    assert isinstance(done.outcome, hr.Failed), done.outcome  # answer.txt still says 41
    assert done.outcome.verification is not None
    assert "check.py" in done.outcome.verification.attempts[0].reason


async def test_a_broken_check_never_completes_a_run(workspace: Path) -> None:
    def raises(ctx: hr.VerifyContext) -> hr.Verified:
        raise RuntimeError(f"cannot read {ctx.workspace / 'answer.txt'}")

    def wrong_type(ctx: hr.VerifyContext) -> bool:
        return True

    watch = Watch()
    agent = hr.Agent(Scripted([reply("a"), watch.reply("b")]), [], workspace=workspace,
                     max_verify_attempts=2)
    raised = await agent.run("x", verify=hr.Verify.check(raises))
    assert isinstance(raised.outcome, hr.Failed)
    # An exception is a failed attempt the model hears of (host paths scrubbed).
    (told,) = watch.told
    assert "RuntimeError" in told.text and str(workspace) not in told.text
    assert "answer.txt" in told.text

    result = await hr.Agent(Scripted([reply("a")]), [], workspace=workspace).run(
        "x", verify=hr.Verify.check(wrong_type))
    assert isinstance(result.outcome, hr.Failed)
    assert "returned True, not hr.Verified()" in result.outcome.error


async def test_a_check_past_its_timeout_is_a_failed_attempt(workspace: Path) -> None:
    gate = anyio.Event()

    async def hangs(ctx: hr.VerifyContext) -> hr.Verified:
        await gate.wait()
        return hr.Verified()

    agent = hr.Agent(Scripted([reply("a")]), [], workspace=workspace, max_verify_attempts=1)
    result = await agent.run("x", verify=hr.Verify.check(hangs, timeout=0.2))
    assert isinstance(result.outcome, hr.Failed) and result.outcome.verification
    assert "did not finish within 0.2s" in result.outcome.verification.attempts[0].reason


async def test_the_output_the_model_is_shown_is_bounded(workspace: Path) -> None:
    (workspace / "check.py").write_text("import sys\nprint('x' * 200000 + 'END')\nsys.exit(3)\n")
    watch = Watch()
    agent = hr.Agent(Scripted([reply("a"), watch.reply("b")]), workspace_tools(),
                     policy=allowing(), workspace=workspace,
                     verify=hr.Verify.command(ARGV), max_verify_attempts=2)
    result = await agent.run("x")
    (told,) = watch.told
    assert len(told.text) < hr.runs.VERIFY_OUTPUT_CHARS + 1000
    assert "exited with code 3" in told.text and "characters cut" in told.text
    assert isinstance(result.outcome, hr.Failed)


async def test_a_command_that_runs_too_long_is_killed_and_fails(workspace: Path) -> None:
    (workspace / "check.py").write_text("import time\ntime.sleep(60)\n")
    agent = hr.Agent(Scripted([reply("a")]), workspace_tools(), policy=allowing(),
                     workspace=workspace, verify=hr.Verify.command(ARGV, timeout=0.5),
                     max_verify_attempts=1)
    with anyio.fail_after(30):
        result = await agent.run("x")
    assert isinstance(result.outcome, hr.Failed) and result.outcome.verification
    assert "did not finish within 0.5s" in result.outcome.verification.attempts[0].reason


def test_bad_verify_arguments_are_refused_with_what_to_do(workspace: Path) -> None:
    with pytest.raises(hr.UserError, match="list of strings"):
        hr.Verify.command("pytest -q")
    with pytest.raises(hr.UserError, match=r"Verify\.command"):
        hr.Verify.command([])
    with pytest.raises(hr.UserError, match=r"Verify\.command"):
        hr.Verify.command(["pytest"], timeout=10_000)
    with pytest.raises(hr.UserError, match="one argument"):
        hr.Verify.check(lambda: hr.Verified())  # type: ignore[arg-type,misc]
    with pytest.raises(hr.UserError, match="timeout"):
        hr.Verify.check(lambda ctx: hr.Verified(), timeout=0)
    with pytest.raises(hr.UserError, match="max_verify_attempts"):
        hr.Agent(Scripted([]), [], workspace=workspace, max_verify_attempts=0)
    with pytest.raises(hr.UserError, match="verify="):
        hr.Agent(Scripted([]), [], workspace=workspace, verify=["pytest"])  # type: ignore[arg-type]
    with pytest.raises(hr.UserError, match="reason"):
        hr.NotVerified("")


def _named_check(ctx: hr.VerifyContext) -> hr.Verified:
    return hr.Verified()


def _other_check(ctx: hr.VerifyContext) -> hr.Verified:
    return hr.Verified()


async def test_a_run_checked_by_a_callable_resumes_only_with_it(workspace: Path) -> None:
    store = hr.Store.memory()
    tools = workspace_tools()
    first = hr.Agent(Scripted([call("workspace/write_file",
                                    {"path": "answer.txt", "content": "42"}), reply("done")]),
                     tools, workspace=workspace, verify=hr.Verify.check(_named_check))
    paused = await first.run("x", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    bare = hr.Agent(Scripted([call("workspace/write_file",
                                   {"path": "answer.txt", "content": "42"}), reply("done")]),
                    tools, workspace=workspace)
    other = hr.Agent(Scripted([]), tools, workspace=workspace,
                     verify=hr.Verify.check(_other_check))
    for agent in (bare, other):  # no check, or another one: the run would be held to less
        with pytest.raises(hr.ResumeRefused, match="_named_check"):
            await hr.resume_with_decision(store, paused.outcome.request_id,
                                          hr.Decision.approve(), agent=agent)
    assert (await store.pending())[0].state == "open"  # refused before anything was recorded
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=first)
    assert done.outcome == hr.Completed("done")


def test_show_lists_each_attempt_and_runs_flags_the_failure(
        workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    db = str(tmp_path / "runs.db")

    async def go() -> hr.RunResult:
        async with hr.Store.open(db) as store:
            agent = hr.Agent(Scripted([reply("done")] * 2), workspace_tools(),
                             policy=allowing(), workspace=workspace,
                             verify=hr.Verify.command(ARGV), max_verify_attempts=2)
            return await agent.run("make it 42", store=store)

    result = anyio.run(go)
    assert isinstance(result.outcome, hr.Failed)
    capsys.readouterr()
    assert main(["show", result.run_id, "--store", db]) == 0
    shown = capsys.readouterr().out
    assert "verification 1/2: failed" in shown and "verification 2/2: failed" in shown
    assert "exited with code 1" in shown and "answer is 41" in shown
    assert main(["runs", "--store", db]) == 0
    assert "failed verification (2 attempts)" in capsys.readouterr().out
    assert main(["show", result.run_id, "--store", db, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["verifications"]
    assert [e["attempt"] for e in listed] == [1, 2]


SCRIPT = Path(__file__).with_name("verifiable.py")


def _step(tmp: Path, *args: str) -> dict[str, Any]:
    code, stdout, stderr = forks.shared().run(
        SCRIPT, [str(tmp / "runs.db"), str(tmp / "ws"), *args], {}, tmp, timeout=120)
    assert code == 0, stderr
    return dict(json.loads(stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("kind", ["command", "check"])
def test_the_attempt_count_survives_a_process_exit(workspace: Path, tmp_path: Path,
                                                   kind: str) -> None:
    """Each process pauses mid-retry and exits; the next one continues the count."""
    first = _step(tmp_path, kind, "start")
    assert first["outcome"] == "awaiting_approval", first
    second = _step(tmp_path, kind, "decide", first["request_id"])
    if kind == "command":  # the first check failed, the model answered again, the 2nd asks
        assert second["outcome"] == "awaiting_approval", second
        assert second["attempts"] == [1]
        last = _step(tmp_path, kind, "decide", second["request_id"])
    else:
        last = second
    # max_verify_attempts=2: only a count carried across processes ends the run here.
    assert last["outcome"] == "failed", last
    assert last["attempts"] == [1, 2]
    assert len(set(last["pids"])) == len(last["pids"])  # each attempt in its own process
    assert last["told"] == 1  # the first failure reached the model, in a later process


async def test_a_check_cut_off_mid_run_is_run_again_on_resume(workspace: Path) -> None:
    """A command check in flight when the run stopped is re-run, not put to an operator."""
    started = workspace / "started"
    os.mkfifo(started)  # the program says it runs by writing here; the test reads it
    (workspace / "check.py").write_text(
        "import time\nwith open('started', 'w') as fh:\n    fh.write('x')\ntime.sleep(60)\n")

    def wait_started() -> str:
        with open(started) as fh:
            return fh.read()
    store = hr.Store.memory()
    model = Scripted([reply("done")])
    agent = hr.Agent(model, workspace_tools(), policy=allowing(), workspace=workspace,
                     verify=hr.Verify.command(ARGV))
    cancel = anyio.Event()
    outcome: list[hr.RunResult] = []

    async def drive() -> None:
        outcome.append(await agent.run("x", store=store, cancel=cancel))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            assert await anyio.to_thread.run_sync(wait_started, abandon_on_cancel=True) == "x"
            cancel.set()
    (stopped,) = outcome
    assert isinstance(stopped.outcome, hr.Cancelled)
    (record,) = await store.calls(stopped.run_id)
    assert record.status is hr.CallStatus.STARTED
    (workspace / "check.py").write_text(CHECK)
    (workspace / "answer.txt").write_text("42")
    with anyio.fail_after(60):
        done = await hr.resume(store, stopped.run_id, agent=agent)
    assert done.outcome == hr.Completed("done")
    (record,) = await store.calls(stopped.run_id)
    assert record.status is hr.CallStatus.FINISHED
    assert record.result and "answer is 42" in json.dumps(record.result)


async def test_no_approver_can_swap_the_check_for_one_that_passes(workspace: Path) -> None:
    def swap(request: hr.Request) -> hr.Decision:
        return hr.Decision.approve(modified={"argv": ["true"]})

    store = hr.Store.memory()
    agent = hr.Agent(Scripted([reply("done")]), workspace_tools(), policy=allowing(exec_=False),
                     workspace=workspace, verify=hr.Verify.command(ARGV))
    result = await agent.run("x", store=store, approver=hr.CallbackApprover(swap))
    assert isinstance(result.outcome, hr.Failed), result.outcome
    assert "runs exactly as configured" in result.outcome.error
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED
