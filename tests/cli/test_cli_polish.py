"""The CLI's small promises: --version, help on every argument, ids in full or by a unique
prefix, and the demo's workspace removed unless --keep."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import forks
import pytest

import handrail as hr
from handrail.cli import build_parser, main

HANDRAIL = [sys.executable, "-m", "handrail.cli"]


def cli(cwd: Path, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("HANDRAIL_STORE", None)
    # A fork of a process that has imported handrail (tests/tools/forks.py), stdin at
    # /dev/null, as `python -m handrail.cli` would run.
    return forks.shared().run_module("handrail.cli", list(args), env=env, cwd=cwd)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    # A bare `--version` is answered before the parser is built; after another option it is
    # argparse's action. Both print the installed distribution's version.
    from importlib.metadata import version

    assert hr.__version__ == version("handrail")  # pyproject reads it from handrail/__init__
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"handrail {hr.__version__}"
    with pytest.raises(SystemExit) as exited:
        main(["--store", "unused.db", "--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"handrail {hr.__version__}"


def _parsers(parser: argparse.ArgumentParser, path: str
             ) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_parsers(sub, f"{path} {name}"))
    return found


def test_every_argument_of_every_command_has_help() -> None:
    missing = [f"{path}: {action.dest}" for path, parser in _parsers(build_parser(), "handrail")
               for action in parser._actions
               if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
               and not action.help]
    assert missing == []


@pytest.mark.slow
def test_ids_are_shown_in_full_and_a_unique_prefix_is_accepted(tmp_path: Path) -> None:
    demo = cli(tmp_path, "demo", "--keep")
    assert demo.returncode == 0, demo.stderr
    run_id = re.search(r" show (\S+)", demo.stdout)
    request = re.search(r" approve (\S+)", demo.stdout)
    assert run_id and request
    listed = cli(tmp_path, "runs", columns=60)
    assert run_id.group(1) in listed.stdout  # a narrow terminal never cuts an id
    shown = cli(tmp_path, "show", run_id.group(1)[:6], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["id"] == run_id.group(1)
    short = cli(tmp_path, "show", run_id.group(1)[:3])
    assert short.returncode == 1 and "no run" in short.stderr
    done = cli(tmp_path, "approve", request.group(1)[:8])
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout


@pytest.mark.anyio
async def test_an_ambiguous_prefix_is_refused_naming_the_candidates(tmp_path: Path) -> None:
    from handrail.cli._runs import run_id
    from handrail.store import Batch, RunRecord, RunStatus

    store = hr.Store.open(tmp_path / "runs.db")
    for suffix in ("aa", "bb"):
        await store.write(Batch(run=RunRecord(
            id=f"abcd12{suffix}", task="t", status=RunStatus.READY, policy={})))
    with pytest.raises(hr.UserError, match="start of 2 run ids"):
        await run_id(store, "abcd12")
    assert await run_id(store, "abcd12b") == "abcd12bb"
    with pytest.raises(hr.NotFound):
        await run_id(store, "ffff")
    await store.close()


@pytest.mark.slow
def test_the_demo_workspace_is_removed_when_the_run_ends_unless_kept(tmp_path: Path) -> None:
    demo = cli(tmp_path, "demo")
    workspace = re.search(r"workspace (\S+)", demo.stdout)
    request = re.search(r" approve (\S+)", demo.stdout)
    run_id = re.search(r" show (\S+)", demo.stdout)
    assert workspace and request and run_id
    assert Path(workspace.group(1)).is_dir()  # the paused run still needs it
    # Its closing lines say how to keep the workspace to look at NOTES.md afterwards.
    assert "demo --keep` keeps it" in demo.stdout.strip().splitlines()[-1]
    assert cli(tmp_path, "approve", request.group(1)).returncode == 0
    assert not Path(workspace.group(1)).exists()
    shown = cli(tmp_path, "show", run_id.group(1))
    assert shown.returncode == 0 and "completed" in shown.stdout

    kept = cli(tmp_path, "demo", "--keep")
    workspace = re.search(r"workspace (\S+)", kept.stdout)
    request = re.search(r" approve (\S+)", kept.stdout)
    assert workspace and request
    assert cli(tmp_path, "approve", request.group(1)).returncode == 0
    assert (Path(workspace.group(1)) / "NOTES.md").is_file()
    assert kept.stdout.strip().splitlines()[-1].startswith("The workspace is kept")
