"""`handrail manifest check` with `[[servers]]`: the servers' tools are checked with the code's,
and a server's read-only hints against the grants."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp_servers import FIXTURE_SERVER, python_bin

from handrail.cli import main

TOOLS = '''
import handrail as hr

@hr.tool(mutates=False)
def add(a: int, b: int) -> int:
    """Add."""
    return a + b

box = hr.Toolbox([add])
'''


def manifest(time_server: str, extra: str = "") -> str:
    return f"""
[[tools]]
ref = "local/add"
description = "Add."
mutates = false

[[tools]]
ref = "time/get_current_time"
description = "Now."
mutates = false

[[tools]]
ref = "time/convert_time"
description = "Convert."
{extra}
[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{time_server}", "exec:{sys.executable} {FIXTURE_SERVER}"]

[[servers]]
name = "time"
command = "{time_server}"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "app.py").write_text(TOOLS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_granted_server_tools_pass_and_a_stricter_grant_is_a_note(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "handrail.toml").write_text(manifest(python_bin("mcp-server-time")))
    assert main(["manifest", "check", "app:box"]) == 0
    out = capsys.readouterr().out
    assert "note: tool 'time/convert_time'" in out and "hints it is read-only" in out
    assert "OK:" in out


def test_a_read_only_grant_the_server_does_not_hint_is_a_problem(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = f"""
[[tools]]
ref = "fx/echo"
description = "Echo."
mutates = false

[[servers]]
name = "fx"
command = "{sys.executable}"
args = ["{FIXTURE_SERVER}"]
"""
    (project / "handrail.toml").write_text(manifest(python_bin("mcp-server-time"), extra))
    assert main(["manifest", "check", "app:box"]) == 1
    out = capsys.readouterr().out
    assert "tool 'fx/echo' is granted with mutates = false" in out


def test_a_grant_the_server_does_not_offer_is_drift(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = manifest(python_bin("mcp-server-time")).replace('ref = "time/convert_time"',
                                                           'ref = "time/convert_tiem"')
    (project / "handrail.toml").write_text(text)
    assert main(["manifest", "check", "app:box"]) == 1
    assert "'time/convert_tiem' is granted" in capsys.readouterr().out


def test_an_awaited_grant_the_server_does_not_list_yet_is_a_note(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = """
[[tools]]
ref = "time/in_a_later_release"
description = "Not listed yet."
awaited = true
[tools.arguments]
type = "object"
"""
    (project / "handrail.toml").write_text(manifest(python_bin("mcp-server-time"), extra))
    assert main(["manifest", "check", "app:box"]) == 0
    out = capsys.readouterr().out
    assert "note: tool 'time/in_a_later_release' is awaited" in out and "OK:" in out
