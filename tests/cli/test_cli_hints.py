"""Every command the CLI prints for a person to paste is pasted, and works; nothing is silent.

Story: a new user followed the printed hints and they failed. The pause hint printed
`handrail deny ap-…` (which needs `--reason`); "decide with `handrail recover`" named no call
id and no option; `approve --no-resume` printed `handrail resume RUN --agent MODULE:OBJECT`, a
placeholder, though the run recorded its agent (and, on PostgreSQL, a worker continues it);
`approve` and `resume` exited 0 when the run paused again (`run` exits 3); `handrail run
< /dev/null` denied every ask "by StdinApprover", in a person's name, with nobody there;
`pending` after a `kill -9` said "nothing is pending" while a run was stopped; a Ctrl-C'd run
was listed as "stopped on an error"; an agent module raising `KeyError` at import dumped a
traceback from `approve`.

Each test runs the real `handrail` in a subprocess, collects the commands it printed, and runs
them one after the other, as a person would.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import forks
import pytest

HANDRAIL = [sys.executable, "-m", "handrail.cli"]

HINTS = textwrap.dedent('''
    import os

    import anyio

    import handrail as hr
    from handrail.models import Scripted, call, reply


    @hr.tool(server="ledger")
    async def transfer(target: str, amount: int) -> str:
        """Move money."""
        with open("effects.txt", "a") as f:
            f.write(f"{target} {amount}\\n")
        return f"moved {amount} to {target}"


    @hr.tool(server="ledger")
    async def slow(target: str) -> str:
        """Move money, slowly (it hangs while the file `block` exists)."""
        with open("effects.txt", "a") as f:
            f.write(f"slow {target}\\n")
        if os.path.exists("block"):
            await anyio.sleep_forever()
        return f"moved to {target}"


    @hr.tool(server="ops", interactions={"question"}, mutates=False)
    async def ask_name(ctx: hr.CallContext) -> str:
        """Ask for a name, then greet it."""
        name = await ctx.ask(hr.Question("Which name?"))
        return f"hello {name}"


    asker = hr.Agent(Scripted([call("ops/ask_name", {}), reply("greeted")]), [ask_name],
                     name="asker")
    twice = hr.Agent(Scripted([call("ledger/transfer", {"target": "bob", "amount": 5}),
                               call("ledger/transfer", {"target": "carol", "amount": 7}),
                               reply("paid both")]), [transfer], name="twice")
    crashy = hr.Agent(Scripted([call("ledger/slow", {"target": "bob"}), reply("done")]), [slow],
                      name="crashy")
''')


def cli_agents_env() -> dict[str, str]:
    return env(PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))


def env(**extra: str) -> dict[str, str]:
    out = {**os.environ, "COLUMNS": "200", **extra}
    out.pop("HANDRAIL_STORE", None)
    out.pop("HANDRAIL_AGENT", None)
    out.pop("FORCE_COLOR", None)
    return out


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`handrail ARGS` in `cwd`, stdin at /dev/null: a fork of a process that has imported
    handrail (tests/tools/forks.py), as `python -m handrail.cli` would run."""
    return forks.shared().run_module("handrail.cli", list(args), env=env(), cwd=cwd,
                                     timeout=120)


_BACKTICKED = re.compile(r"`(handrail [^`]+)`")
_ON_A_LINE = re.compile(r"^\s+(handrail (?!:)\S.*?)\s*$", re.M)


def hints(text: str) -> list[str]:
    """The commands printed for a person: `handrail ...` in backticks, or on a line of its own."""
    found = [*_BACKTICKED.findall(text), *_ON_A_LINE.findall(text)]
    return list(dict.fromkeys(found))


def paste(cwd: Path, hint: str) -> subprocess.CompletedProcess[str]:
    """Run a printed command exactly as printed (the shell's word splitting included)."""
    words = shlex.split(hint)
    assert words[0] == "handrail", hint
    assert not any(w in {"ID", "RUN", "TEXT", "MODULE:OBJECT"} for w in words), (
        f"a placeholder in a printed command: {hint}")
    return cli(cwd, *words[1:])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "hints.py").write_text(HINTS)
    return tmp_path


def _only(found: list[str], start: str) -> str:
    chosen = [h for h in found if h.startswith(start)]
    assert len(chosen) == 1, (start, found)
    return chosen[0]


@pytest.mark.slow
def test_the_pause_hints_work_and_approve_exits_3_when_the_run_pauses_again(project: Path
                                                                             ) -> None:
    run = cli(project, "run", "hints:twice", "pay bob and carol", "--defer")
    assert run.returncode == 3, run.stderr
    found = hints(run.stdout)
    approve = _only(found, "handrail approve ")
    deny = _only(found, "handrail deny ")
    assert "--reason" in deny
    # The first approval: the run continues and pauses again on carol's transfer: exit 3,
    # like `run`, and the next hints are printed.
    first = paste(project, approve)
    assert first.returncode == 3, (first.stdout, first.stderr)
    assert (project / "effects.txt").read_text() == "bob 5\n"
    # The deny hint of the second pause, pasted as it is: the model reads the reason.
    second = paste(project, _only(hints(first.stdout), "handrail deny "))
    assert second.returncode == 0, (second.stdout, second.stderr)
    assert "completed" in second.stdout
    assert (project / "effects.txt").read_text() == "bob 5\n"
    # The first pause's deny hint, pasted after the request was decided: a clear refusal.
    late = paste(project, deny)
    assert late.returncode == 1 and "already decided" in late.stderr


@pytest.mark.slow
def test_resume_exits_3_when_the_run_is_still_paused(project: Path) -> None:
    run = json.loads(cli(project, "run", "hints:twice", "pay", "--defer", "--json").stdout)
    resumed = cli(project, "resume", run["run_id"])
    assert resumed.returncode == 3, (resumed.stdout, resumed.stderr)
    assert _only(hints(resumed.stdout), "handrail approve ")


@pytest.mark.slow
def test_no_resume_prints_a_resume_command_that_works(project: Path) -> None:
    run = json.loads(cli(project, "run", "hints:twice", "pay", "--defer", "--json").stdout)
    recorded = cli(project, "approve", run["outcome"]["request_id"], "--no-resume")
    assert recorded.returncode == 0, recorded.stderr
    resume = _only(hints(recorded.stdout), "handrail resume ")
    assert resume == f"handrail resume {run['run_id']}"  # the run recorded its agent
    again = paste(project, resume)
    assert again.returncode == 3, (again.stdout, again.stderr)  # carol's transfer asks


def _killed_mid_call(project: Path) -> str:
    """`handrail run hints:crashy` SIGKILLed while its call runs; the run's id."""
    (project / "block").write_text("")
    proc = subprocess.Popen([*HANDRAIL, "run", "hints:crashy", "pay", "--approve", "all",
                             "--json"], cwd=project, env=env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        # The line, not the file: `open("a")` creates the file before the line is written,
        # and a kill in between left no effect to count (seen once under a CPU hog).
        effects = project / "effects.txt"
        while not (effects.exists() and "slow bob" in effects.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    (project / "block").unlink()
    (run,) = json.loads(cli(project, "runs", "--json").stdout)
    return str(run["id"])


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--retry", "--completed", "--abort"])
def test_after_a_kill_pending_says_so_and_the_recover_hints_work(project: Path,
                                                                 option: str) -> None:
    run_id = _killed_mid_call(project)
    pending = cli(project, "pending")
    assert pending.returncode == 0
    assert "nothing is pending" not in pending.stdout
    assert f"run {run_id} is stopped" in pending.stdout
    resumed = paste(project, _only(hints(pending.stdout), "handrail resume "))
    assert resumed.returncode == 3, (resumed.stdout, resumed.stderr)  # a call in doubt
    listed = cli(project, "pending").stdout
    assert "started_at" not in listed and re.search(r"in doubt: started 20\d\d-", listed), listed
    found = hints(resumed.stdout)
    recover = [h for h in found if h.startswith("handrail recover ")]
    assert {h.split()[3] for h in recover} == {"--retry", "--completed", "--abort"}, found
    assert len({h.split()[2] for h in recover}) == 1  # the call's id, in each
    done = paste(project, _only(recover, f"handrail recover {recover[0].split()[2]} {option}"))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "completed" in done.stdout
    runs = json.loads(cli(project, "runs", "--json").stdout)
    assert runs[0]["status"] == "completed"
    slow_calls = (project / "effects.txt").read_text().count("slow bob")
    assert slow_calls == (2 if option == "--retry" else 1)


@pytest.mark.slow
def test_run_without_a_terminal_asks_nobody_and_denies_nothing(project: Path) -> None:
    run = cli(project, "run", "hints:twice", "pay bob")  # stdin at /dev/null
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert "not a terminal" in run.stdout + run.stderr
    assert not (project / "effects.txt").exists()
    (listed,) = json.loads(cli(project, "runs", "--json").stdout)
    assert listed["status"] == "awaiting_approval"
    shown = json.loads(cli(project, "show", listed["id"], "--json").stdout)
    assert [(c["decision"] or {}).get("kind") for c in shown["calls"]] == ["defer"]
    assert "StdinApprover" not in json.dumps(shown)
    # What it printed finishes the run.
    approve = paste(project, _only(hints(run.stdout), "handrail approve "))
    assert approve.returncode == 3 and (project / "effects.txt").read_text() == "bob 5\n"


def test_stdin_approver_at_end_of_input_defers_never_denies() -> None:
    import io

    import anyio

    import handrail as hr

    request = hr.Request(act=hr.Act.CALL, target="ledger/transfer", content=None,
                         tool="ledger/transfer", arguments={}, call_id="c", agent="a")
    approver = hr.StdinApprover(input=io.StringIO(""), output=io.StringIO())
    decision = anyio.run(approver.decide, request)
    assert decision.kind == "defer"


def _paused_cli_agents_run(tmp_path: Path) -> tuple[str, str]:
    """A store (path) holding a run of `cli_agents:working` paused on an approval; its id."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = str(tmp_path / "runs.db")
    made = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import anyio, handrail as hr, cli_agents
            async def go():
                async with hr.Store.open({db!r}) as store:
                    record = hr.RunRecord(id="x", task="t", workspace={str(workspace)!r})
                    result = await cli_agents.working(record).run("run it", store=store)
                    print(result.outcome.request_id)
            anyio.run(go)""")], capture_output=True, text=True, env=cli_agents_env(),
        timeout=120, check=True)
    return db, made.stdout.strip()


@pytest.mark.slow
def test_when_the_run_cannot_continue_the_printed_resume_works(tmp_path: Path) -> None:
    db, request_id = _paused_cli_agents_run(tmp_path)
    failed = subprocess.run([*HANDRAIL, "approve", request_id, "--agent", "cli_agents:no_key",
                             "--store", db], capture_output=True, text=True,
                            env=cli_agents_env(), timeout=120, cwd=tmp_path)
    assert failed.returncode == 1 and "OPENAI_API_KEY" in failed.stderr
    (resume,) = [h for h in hints(failed.stderr) if h.startswith("handrail resume ")]
    assert f"--store {db}" in resume
    words = shlex.split(resume)
    done = subprocess.run([*HANDRAIL, *words[1:]], capture_output=True, text=True,
                          env=cli_agents_env(), timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "completed" in done.stdout, (done.stdout, done.stderr)


@pytest.mark.slow
def test_a_ctrl_c_d_run_is_not_called_stopped_on_an_error(tmp_path: Path) -> None:
    db, request_id = _paused_cli_agents_run(tmp_path)
    stopped = subprocess.run([*HANDRAIL, "approve", request_id, "--agent",
                              "cli_agents:interrupted", "--store", db], capture_output=True,
                             text=True, env=cli_agents_env(), timeout=120)
    assert stopped.returncode == 130, stopped.stderr
    listed = subprocess.run([*HANDRAIL, "runs", "--store", db], capture_output=True, text=True,
                            env=cli_agents_env(), timeout=120)
    assert "stopped on an error" not in listed.stdout
    assert "interrupted by Ctrl-C" in listed.stdout


@pytest.mark.slow
def test_an_agent_module_failing_at_import_is_one_line_and_records_nothing(project: Path
                                                                           ) -> None:
    run = json.loads(cli(project, "run", "hints:twice", "pay", "--defer", "--json").stdout)
    (project / "broken.py").write_text("import os\nKEY = os.environ['NO_SUCH_VARIABLE_HR']\n"
                                       "agent = None\n")
    out = cli(project, "approve", run["outcome"]["request_id"], "--agent", "broken:agent")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "KeyError" in out.stderr and "NO_SUCH_VARIABLE_HR" in out.stderr
    assert "nothing was recorded" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert json.loads(cli(project, "pending", "--json").stdout)[0]["id"] == \
        run["outcome"]["request_id"]


def test_on_a_store_workers_serve_no_resume_says_a_worker_continues(
        pg_url: str, project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    import handrail as hr
    from handrail.cli import main

    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    import hints  # type: ignore[import-not-found]

    async def go() -> str:
        async with hr.Store.open(pg_url) as store:
            result = await hints.twice.run("pay", store=store)
            return str(result.outcome.request_id)

    request_id = anyio.run(go)
    assert main(["approve", request_id, "--no-resume", "--store", pg_url]) == 0
    out = capsys.readouterr().out
    assert "a worker" in out and "handrail worker" in out
    assert "handrail resume" not in out and "MODULE:OBJECT" not in out


@pytest.mark.slow
def test_the_answer_hint_works(project: Path) -> None:
    run = cli(project, "run", "hints:asker", "greet", "--defer")
    assert run.returncode == 3, (run.stdout, run.stderr)
    answered = paste(project, _only(hints(run.stdout), "handrail answer "))
    assert answered.returncode == 0, (answered.stdout, answered.stderr)
    assert "completed" in answered.stdout
    (listed,) = json.loads(cli(project, "runs", "--json").stdout)
    shown = json.loads(cli(project, "show", listed["id"], "--json").stdout)
    assert "hello your answer" in json.dumps(shown["calls"])
