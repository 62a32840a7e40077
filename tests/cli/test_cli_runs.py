"""The `handrail` command: the demo end to end across processes, and each run command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import forks
import pytest

from handrail.cli import main

HANDRAIL = [sys.executable, "-m", "handrail.cli"]


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("HANDRAIL_STORE", None)
    # A fork of a process that has imported handrail (tests/tools/forks.py), stdin at
    # /dev/null, as `python -m handrail.cli` would run.
    return forks.shared().run_module("handrail.cli", list(args), env=env, cwd=cwd)


@pytest.mark.slow
def test_demo_defers_a_write_and_the_printed_command_finishes_it(tmp_path: Path) -> None:
    demo = cli(tmp_path, "demo")
    assert demo.returncode == 0, demo.stderr
    assert "awaiting_approval" in demo.stdout
    assert "sandbox: auto" in demo.stdout
    approve = re.search(r" approve (\S+)", demo.stdout)
    run = re.search(r" show (\S+)", demo.stdout)
    assert approve and run
    assert (tmp_path / ".handrail" / "runs.db").exists()

    pending = cli(tmp_path, "pending", "--json")
    (item,) = json.loads(pending.stdout)
    assert item["id"] == approve.group(1) and item["tool"] == "workspace/write_file"
    assert item["payload"]["target"] == "NOTES.md"

    shown = cli(tmp_path, "show", run.group(1), "--json")
    calls = json.loads(shown.stdout)["calls"]
    assert [c["verdict"]["effect"] for c in calls] == ["allow", "deny", "ask"]
    assert "this-must-never-reach-the-model" not in shown.stdout

    done = cli(tmp_path, "approve", approve.group(1))
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout and "wrote NOTES.md" in done.stdout
    again = cli(tmp_path, "approve", approve.group(1))
    assert again.returncode == 1 and "already decided" in again.stderr
    assert cli(tmp_path, "pending").stdout.strip() == "nothing is pending"
    runs = json.loads(cli(tmp_path, "runs", "--json").stdout)
    assert [r["status"] for r in runs] == ["completed"]


@pytest.mark.slow
def test_deny_without_resume_records_then_resume_continues(tmp_path: Path) -> None:
    demo = cli(tmp_path, "demo", "--store", str(tmp_path / "s.db"))
    request = re.search(r" approve (\S+)", demo.stdout)
    run = re.search(r" show (\S+)", demo.stdout)
    assert request and run
    denied = cli(tmp_path, "deny", request.group(1), "--reason", "not today", "--no-resume",
                 "--store", str(tmp_path / "s.db"))
    assert denied.returncode == 0 and "recorded" in denied.stdout
    resumed = cli(tmp_path, "resume", run.group(1), "--store", str(tmp_path / "s.db"))
    assert resumed.returncode == 0, resumed.stderr
    assert "could not write NOTES.md" in resumed.stdout and "not today" in resumed.stdout


def test_errors_are_one_line_with_exit_code_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    import anyio

    from handrail.store import Store

    anyio.run(Store.open(tmp_path / "x.db").close)
    code = main(["show", "nope", "--store", str(tmp_path / "x.db")])
    assert code == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_recover_needs_exactly_one_choice(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["recover", "x", "--retry", "--abort", "--store", str(tmp_path / "x.db")])


AGENT_MODULE = '''
import handrail as hr
from handrail.models import Scripted, call, reply

@hr.tool(server="ops", interactions={"question"}, mutates=False)
async def pick(ctx: hr.CallContext) -> str:
    """Pick a colour."""
    return await ctx.ask(hr.Question("Which colour?", choices=["red", "blue"]))

def build(run=None):
    model = Scripted([call("ops/pick", {}),
                      lambda messages, tools: reply("picked " + messages[-1].result.render_text())])
    return hr.Agent(model, [pick], name="picker")
'''


@pytest.mark.slow
def test_an_answer_is_recorded_then_resume_continues_with_the_named_agent(tmp_path: Path) -> None:
    (tmp_path / "picker.py").write_text(AGENT_MODULE)
    script = ("import anyio, handrail as hr, picker\n"
              "async def main():\n"
              "    async with hr.Store.open('.handrail/runs.db') as store:\n"
              "        r = await picker.build().run('pick', store=store)\n"
              "        print(r.outcome.kind, r.outcome.question_id)\n"
              "anyio.run(main)\n")
    started = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "PYTHONPATH": "."})
    kind, question_id = started.stdout.split()
    assert kind == "awaiting_answer"
    pending = json.loads(cli(tmp_path, "pending", "--kind", "question", "--json").stdout)
    assert pending[0]["payload"]["question"] == "Which colour?"
    no_agent = cli(tmp_path, "answer", question_id, "blue")
    # Without --agent the run recorded no ref: the answer is recorded, the run waits.
    assert no_agent.returncode == 0 and "recorded" in no_agent.stdout
    run_id = json.loads(cli(tmp_path, "runs", "--json").stdout)[0]["id"]
    done = cli(tmp_path, "resume", run_id, "--agent", "picker:build")
    assert done.returncode == 0, done.stderr
    assert "picked blue" in done.stdout
