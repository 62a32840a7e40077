"""What the CLI says is what is, and what it shows is what will happen.

Stories (issues 9 §4, §6 and 10 §4, §5): `pending`/`show` printed model-chosen argv raw (escape
sequences made an exec display as `exec git status`); a mistyped `HANDRAIL_STORE` created an
empty store; an approve whose model then failed left `pending` empty and `runs` saying
`running`; `--store` worked only after the command; `runs --status bogus` and `runs --json |
head` printed tracebacks; `approve` on a question said "not a approval"; every decision was
recorded as made by "cli".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.cli import main
from handrail.cli._display import argv_text, needs_escape, printable, printable_json
from handrail.store import Store

sys.path.insert(0, str(Path(__file__).parent))  # cli_agents, as `--agent cli_agents:...`

import cli_agents  # importable once its folder is on the path

# Every character that may not reach a terminal as it is.
_FORBIDDEN = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F),
                               *range(0x2066, 0x206A), *range(0x200B, 0x2010), 0xFEFF,
                               0x2028, 0x2029)]


def _clean(text: str) -> bool:
    return not any(c in text for c in _FORBIDDEN if c != "\n")


# No deadline: on a loaded 2-core machine one example can take longer than hypothesis's
# default 200 ms (a scheduling pause, not slow code), and the test failed with DeadlineExceeded.
_UNHURRIED = settings(deadline=None)


@_UNHURRIED
@given(st.text())
def test_printable_text_holds_no_control_or_bidi_character(text: str) -> None:
    out = printable(text)
    assert not any(c in out for c in _FORBIDDEN)
    assert not any(0xD800 <= ord(c) < 0xE000 for c in out)
    out.encode("utf-8")  # a terminal can be sent it
    # Unambiguous: text without anything to escape is shown exactly as it is.
    if not any(needs_escape(c) for c in text):
        assert out == text


@_UNHURRIED
@given(st.recursive(st.text() | st.integers() | st.none(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_printable_json_is_the_same_json_and_holds_no_control_character(value: Any) -> None:
    out = printable_json(value)
    assert not any(c in out for c in _FORBIDDEN)
    assert json.loads(out) == value


def test_argv_is_shown_as_the_quoted_list_it_is() -> None:
    shown = argv_text(cli_agents.HOSTILE_ARGV)
    assert json.loads(shown) == cli_agents.HOSTILE_ARGV
    assert shown.startswith('["echo", "planted\\u001b[2K\\r') and _clean(shown)


# ------------------------------------------------------------- end to end


def _run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def paused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """A store holding a run paused on the hostile exec: (store path, run id, request id)."""
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.delenv("HANDRAIL_STORE", raising=False)
    monkeypatch.delenv("HANDRAIL_AGENT", raising=False)
    monkeypatch.chdir(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = str(tmp_path / "runs.db")

    async def go() -> tuple[str, str]:
        async with Store.open(db) as store:
            record = hr.RunRecord(id="x", task="t", workspace=str(workspace))
            result = await cli_agents.working(record).run("run it", store=store)
            assert isinstance(result.outcome, hr.AwaitingApproval)
            return result.run_id, result.outcome.request_id

    run_id, request_id = anyio.run(go)
    return db, run_id, request_id


def test_pending_and_show_print_a_hostile_argv_escaped(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, run_id, _ = paused
    for command in (["pending"], ["show", run_id]):
        code, out, err = _run_cli(capsys, *command, "--store", db)
        assert code == 0, err
        assert _clean(out), repr(out)
        assert '["echo", "planted\\u001b[2K\\r\\u001b[1Aexec git status\\u202e' in out
        assert "\\\\" not in out  # escaped once, never twice


def test_reading_commands_never_create_a_store(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    typo = tmp_path / "no" / "such" / "runs.db"
    monkeypatch.setenv("HANDRAIL_STORE", str(typo))
    for command in (["runs"], ["pending"], ["show", "r1"], ["approve", "p1"]):
        code, _, err = _run_cli(capsys, *command)
        assert code == 1 and "no handrail store at" in err and "HANDRAIL_STORE" in err
    assert not (tmp_path / "no").exists()


def test_store_is_accepted_before_and_after_the_command(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, run_id, _ = paused
    for args in (["--store", db, "runs", "--json"], ["runs", "--json", "--store", db]):
        code, out, err = _run_cli(capsys, *args)
        assert code == 0, err
        assert [r["id"] for r in json.loads(out)] == [run_id]


def test_a_bad_status_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["runs", "--status", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "awaiting_approval" in err


def test_approve_on_a_question_names_the_right_command(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, _, request_id = paused
    code, _, err = _run_cli(capsys, "answer", request_id, "yes", "--store", db)
    assert code == 1 and "is an approval, not a question" in err
    assert "handrail approve" in err


def test_a_decision_records_who_made_it(paused: tuple[str, str, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    db, run_id, request_id = paused
    code, out, err = _run_cli(capsys, "approve", request_id, "--as", "alice",
                              "--agent", "cli_agents:working", "--store", db)
    assert code == 0, err
    assert "completed" in out and _clean(out)
    code, out, _ = _run_cli(capsys, "show", run_id, "--store", db)
    assert "decision: approve by alice" in out


def test_the_default_decider_is_the_os_user_at_this_host(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    db, _, request_id = paused
    code, _, err = _run_cli(capsys, "deny", request_id, "--reason", "no", "--no-resume",
                              "--store", db)
    assert code == 0, err

    async def who() -> str | None:
        async with Store.open(db) as store:
            return (await store.pending_item(request_id)).decided_by

    decided_by = anyio.run(who)
    assert decided_by is not None and decided_by.endswith("@" + socket.gethostname())
    assert decided_by != "cli"


def test_an_approve_whose_run_cannot_continue_says_so_and_leaves_it_ready(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, run_id, request_id = paused
    code, _, err = _run_cli(capsys, "approve", request_id, "--agent", "cli_agents:no_key",
                            "--store", db)
    assert code == 1
    assert "the decision was recorded" in err and "OPENAI_API_KEY" in err
    assert f"handrail resume {run_id}" in err
    code, out, _ = _run_cli(capsys, "runs", "--json", "--store", db)
    (run,) = json.loads(out)
    assert (run["status"], run["outcome"]) == ("ready", None)
    code, out, _ = _run_cli(capsys, "runs", "--store", db)
    assert "ready (stopped on an error" in out
    code, out, _ = _run_cli(capsys, "resume", run_id, "--agent", "cli_agents:working",
                            "--store", db)
    assert code == 0 and "completed" in out


def test_answer_without_resume_leaves_a_ready_run(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, run_id, request_id = paused
    code, out, err = _run_cli(capsys, "approve", request_id, "--no-resume", "--store", db)
    assert code == 0, err
    assert f"handrail resume {run_id}" in out
    code, out, _ = _run_cli(capsys, "runs", "--store", db)
    assert "ready (decided, not yet continued)" in out
    code, out, _ = _run_cli(capsys, "pending", "--store", db)
    assert out.splitlines() == ["nothing waits for a person, but these runs have not finished:",
                                f"run {run_id} is ready (decided, not yet continued): "
                                f"`handrail resume {run_id} --store {db}`"]


def test_recover_retry_without_the_tool_keeps_the_call_in_doubt(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    db, run_id, request_id = paused

    async def crash() -> str:
        async with Store.open(db) as store:
            await store.decide(request_id, hr.Decision.approve().to_dict(), "op")
            (record,) = await store.calls(run_id)
            run = await store.run(run_id)
            await store.write(hr.store.Batch(
                run=dataclasses.replace(run, status=hr.RunStatus.RUNNING, owner="gone:1:x"),
                calls=[dataclasses.replace(record, status=hr.CallStatus.STARTED)]))
            return record.id

    call_id = anyio.run(crash)
    code, out, err = _run_cli(capsys, "resume", run_id, "--agent", "cli_agents:working",
                              "--store", db)
    assert code == 3 and "was in flight" in out, err
    code, out, err = _run_cli(capsys, "recover", call_id, "--retry",
                              "--agent", "cli_agents:without_exec", "--store", db)
    assert code == 1 and "stays in doubt" in err and "completed" not in out
    code, out, _ = _run_cli(capsys, "pending", "--json", "--store", db)
    assert [p["id"] for p in json.loads(out)] == [call_id]


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(paused: tuple[str, str, str]) -> None:
    db, _, _ = paused

    async def many() -> None:
        async with Store.open(db) as store:
            for i in range(400):
                await store.write(hr.store.Batch(run=hr.RunRecord(
                    id=f"r{i}", task="x" * 400, created_at=float(i))))

    anyio.run(many)
    env = {**os.environ, "HANDRAIL_STORE": db}
    proc = subprocess.Popen([sys.executable, "-m", "handrail.cli", "runs", "--json",
                             "--limit", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()  # what `| head -c 10` does
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_approve_with_a_missing_agent_module_records_nothing(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, _, request_id = paused
    code, _, err = _run_cli(capsys, "approve", request_id, "--agent", "no_such_module:agent",
                            "--store", db)
    assert code == 1 and "nothing was recorded" in err and "--no-resume" in err
    code, out, _ = _run_cli(capsys, "pending", "--json", "--store", db)
    assert [p["id"] for p in json.loads(out)] == [request_id]
    code, out, _ = _run_cli(capsys, "runs", "--json", "--store", db)
    assert json.loads(out)[0]["status"] == "awaiting_approval"


def test_ctrl_c_during_the_continued_run_says_it_is_ready(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, run_id, request_id = paused
    code, _, err = _run_cli(capsys, "approve", request_id, "--agent", "cli_agents:interrupted",
                            "--store", db)
    assert code == 130
    assert "the decision was recorded" in err and f"handrail resume {run_id}" in err
    code, out, _ = _run_cli(capsys, "runs", "--json", "--store", db)
    assert json.loads(out)[0]["status"] == "ready"


@pytest.mark.slow
def test_a_real_ctrl_c_leaves_the_run_ready(paused: tuple[str, str, str], tmp_path: Path) -> None:
    import signal
    import time

    db, run_id, request_id = paused
    marker = tmp_path / "asked"
    # PYTHONFAULTHANDLER: a process that does not stop dumps every thread's stack on the
    # SIGABRT below, so a failure says where it hung (seen once, under load, in a full CI run).
    env = {**os.environ, "HANDRAIL_TEST_MARKER": str(marker), "PYTHONFAULTHANDLER": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    # A terminal's Ctrl-C reaches a process whose SIGINT is as Python sets it up: a test run
    # started in the background (`cmd &` in a script) ignores SIGINT, and its children inherit
    # that (handrail then rightly leaves it ignored). The child starts with the default.
    proc = subprocess.Popen([sys.executable, "-m", "handrail.cli", "approve", request_id,
                             "--agent", "cli_agents:hang", "--store", db],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():  # the model was asked: the decision is recorded, the call ran
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=15)
            pytest.fail(f"one Ctrl-C did not stop `handrail approve` within 45 s; its stacks:\n"
                        f"{err}")
    finally:
        if proc.poll() is None:  # never leave it running into the next test
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "the decision was recorded" in err and f"handrail resume {run_id}" in err
    assert "Traceback" not in err

    async def status() -> tuple[hr.RunStatus, Any]:
        async with Store.open(db) as store:
            run = await store.run(run_id)
            return run.status, run.owner

    assert anyio.run(status) == (hr.RunStatus.READY, None)


def test_a_running_run_whose_process_is_gone_is_not_shown_as_running(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses
    import socket

    db, run_id, _ = paused
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()

    async def crash() -> None:
        async with Store.open(db) as store:
            run = await store.run(run_id)
            await store.write(hr.store.Batch(run=dataclasses.replace(
                run, status=hr.RunStatus.RUNNING, outcome=None,
                owner=f"{socket.gethostname()}:{dead}:x")))

    anyio.run(crash)
    code, out, _ = _run_cli(capsys, "runs", "--store", db)
    assert code == 0 and "stopped (its process is gone" in out


@pytest.mark.parametrize("extra", [["--no-resume"], ["--agent", "cli_agents:working"]])
def test_approve_with_a_malformed_remember_pattern_records_nothing(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str],
        extra: list[str]) -> None:
    db, run_id, request_id = paused
    # An unclosed bracket: malformed for every act (issue 9's 'a**' is, for paths and calls).
    code, _, err = _run_cli(capsys, "approve", request_id, "--remember", "a[b", *extra,
                            "--store", db)
    assert code == 1 and "cannot be applied" in err and "a[b" in err
    code, out, _ = _run_cli(capsys, "pending", "--json", "--store", db)
    assert [p["id"] for p in json.loads(out)] == [request_id]
    code, out, err = _run_cli(capsys, "approve", request_id, "--agent", "cli_agents:working",
                              "--store", db)
    assert code == 0 and f"run {run_id} completed" in out, err


_SGR = re.compile(r"\x1b\[[0-9;]*m")
_HOSTILE_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from(_FORBIDDEN), max_size=40)


def test_nothing_a_model_or_tool_wrote_reaches_the_terminal_raw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any text in any field a model or a tool fills: `runs`, `show`, `pending` print it inert."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)  # set below; restored at the end
    import contextlib
    import io
    import uuid

    from hypothesis import HealthCheck, Phase, settings

    # No shrinking: each example runs three commands on a real store, and the failing output
    # (in the assertion) already shows the offending character.
    @settings(max_examples=30, deadline=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(task=_HOSTILE_TEXT, name=_HOSTILE_TEXT, target=_HOSTILE_TEXT,
           argv=st.lists(_HOSTILE_TEXT, min_size=1, max_size=3), result=_HOSTILE_TEXT,
           call_id=_HOSTILE_TEXT)
    def check(task: str, name: str, target: str, argv: list[str], result: str,
              call_id: str) -> None:
        db = str(tmp_path / f"{uuid.uuid4().hex}.db")  # a run's task and agent are written once

        async def write() -> None:
            async with Store.open(db) as store:
                run = hr.RunRecord(id="r", task=task or "t", agent=name, model=name,
                                   status=hr.RunStatus.AWAITING_APPROVAL,
                                   outcome={"kind": "awaiting_approval", "request_id": call_id})
                call = hr.CallRecord(
                    id=f"r:{call_id}", run_id="r", call_id=call_id, turn=0, index=0,
                    model_name=name, tool=name, status=hr.CallStatus.FINISHED,
                    actions=[{"act": "read", "target": target}, {"act": "exec", "target": argv}],
                    verdict={"effect": "ask", "reason": target}, decided_by=name,
                    decision={"kind": "approve"},
                    result={"content": [{"kind": "text", "text": result}]}, error=result)
                item = hr.store.PendingItem(
                    id=call_id or "p", kind="approval", run_id="r", call_record=call.id,
                    agent=name, tool=name,
                    payload={"act": "exec", "target": target, "arguments": {name: argv},
                             "verdict_reason": result,
                             "actions": [{"act": "exec", "target": argv}]})
                messages = [("r", 0, {"kind": "user", "text": task}),
                            ("r", 1, {"kind": "assistant",
                                      "parts": [{"kind": "text", "text": result}]})]
                await store.write(hr.store.Batch(run=run, calls=[call], pending=[item],
                                                 messages=messages))

        anyio.run(write)
        for command in (["runs"], ["show", "r"], ["pending"]):
            shown = []
            # Plain, then styled as on a terminal: the styles are the only escape sequences,
            # and without them the text is the plain text, character for character.
            for colour in ("", "1"):
                out = io.StringIO()
                os.environ["FORCE_COLOR"] = colour
                try:
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                        assert main([*command, "--store", db]) == 0
                finally:
                    del os.environ["FORCE_COLOR"]
                shown.append(out.getvalue())
            plain, styled = shown
            assert _clean(plain), (command, plain)
            assert "\x1b[" in styled and _SGR.sub("", styled) == plain, (command, styled)

    check()


def test_a_failing_agent_factory_is_a_clear_error_and_records_nothing(
        paused: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    db, _, request_id = paused
    code, _, err = _run_cli(capsys, "approve", request_id, "--agent",
                            "cli_agents:broken_factory", "--store", db)
    assert code == 1 and "could not build the agent: KeyError" in err
    assert "nothing was recorded" in err
    code, out, _ = _run_cli(capsys, "pending", "--json", "--store", db)
    assert [p["id"] for p in json.loads(out)] == [request_id]


def test_recording_one_of_two_open_items_says_the_run_still_waits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from handrail.builtin import workspace_tools
    from handrail.models import Scripted, calls, reply

    db = str(tmp_path / "two.db")

    async def go() -> str:
        async with Store.open(db) as store:
            agent = hr.Agent(Scripted([calls([("workspace/exec", {"argv": ["echo", "a"]}),
                                              ("workspace/exec", {"argv": ["echo", "b"]})]),
                                       reply("ok")]), workspace_tools(), workspace=tmp_path)
            result = await agent.run("go", store=store)
            return result.run_id

    run_id = anyio.run(go)
    code, out, _ = _run_cli(capsys, "pending", "--json", "--store", db)
    first, second = (p["id"] for p in json.loads(out))
    code, out, err = _run_cli(capsys, "approve", first, "--no-resume", "--store", db)
    assert code == 0 and "still waits: awaiting_approval" in out, err
    code, out, err = _run_cli(capsys, "approve", second, "--no-resume", "--store", db)
    assert code == 0 and f"run {run_id} is ready" in out, err
