"""docs/cli.md names every command, with its first lines, and the exit codes each can give.

Story: docs/cli.md covered three of fourteen commands, no page listed the exit codes, and
`approve`/`resume` exited 0 when the run paused again while `run` exited 3.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from handrail.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()


def _commands() -> dict[str, str]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {c.dest: str(c.help) for c in action._choices_actions}
    raise AssertionError("no subcommands")


def _table(heading: str) -> list[list[str]]:
    section = CLI_DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def test_every_command_is_in_the_table_with_its_first_lines() -> None:
    rows: dict[str, str] = {}
    section = CLI_DOC.split("## Exit codes", 1)[0]
    for line in section.splitlines():
        found = re.match(r"\| `handrail ([a-z-]+)[^`]*` \| (.*) \|$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    commands = _commands()
    assert set(rows) == set(commands)
    for name, help_text in commands.items():
        assert rows[name] == help_text, name  # the same first line as `handrail --help`


def test_the_exit_code_table_covers_every_command() -> None:
    table = _table("Exit codes")
    codes = {int(r[0]): r[2] for r in table}
    assert set(codes) == {0, 1, 2, 3, 130, 141}
    for code in (0, 1, 2, 130, 141):
        assert codes[code] == "every command"
    paused = {c.strip("` ") for c in codes[3].split(",")}
    assert paused == {"run", "approve", "deny", "answer", "resume", "recover"}


def test_the_documented_usage_and_error_codes(tmp_path: Path) -> None:
    env = {**os.environ}
    env.pop("HANDRAIL_STORE", None)

    def code(*args: str) -> int:
        return subprocess.run([sys.executable, "-m", "handrail.cli", *args], cwd=tmp_path,
                              env=env, capture_output=True, timeout=120).returncode

    assert code() == 2
    assert code("deny", "ap-1") == 2  # --reason is required
    assert code("show", "nope") == 1  # no store here: one line on stderr
