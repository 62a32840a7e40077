"""`handrail manifest check` / `update` on a manifest whose tools are its `[[servers]]` (issue 36).

The story: `manifest update` on such a manifest removed all 9 grants and the `[[servers]]`
table, inlined the default policy, and `check` then said OK with 0 tools (after `check` had
recommended running `update`); `check` needed a MODULE even for a servers-only manifest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp_servers import python_bin

import handrail as hr
from handrail.cli import main


def servers_only(time_server: str) -> str:
    return f"""# reviewed by hand: keep this comment
[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{time_server}"]

[[servers]]
name = "time"
command = "{time_server}"

[[tools]]
ref = "time/get_current_time"
description = "Now, as I wrote it."
mutates = true

[[tools]]
ref = "time/convert_time"
description = "Convert."
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "handrail.toml").write_text(servers_only(python_bin("mcp-server-time")))
    return tmp_path


@pytest.mark.timeout(600)  # three starts of the server, on a loaded machine
def test_check_and_update_need_no_module_for_a_servers_only_manifest(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifest", "check"]) == 0
    assert "OK: the 1 server(s) it declares match handrail.toml (2 tools" in \
        capsys.readouterr().out
    before = (project / "handrail.toml").read_text()
    assert main(["manifest", "update"]) == 0
    after = (project / "handrail.toml").read_text()
    updated = hr.Manifest.from_toml(after)
    # The grants the server offers stay (their schemas pinned), and so does everything else.
    assert [str(g.ref) for g in updated.grants] == ["time/get_current_time",
                                                    "time/convert_time"]
    assert all(g.arguments is not None for g in updated.grants)
    assert [s.name for s in updated.servers] == ["time"]
    assert after.startswith(before.split("[[tools]]")[0])  # comment, extends, servers: as written
    assert 'extends = "default"' in after and "Now, as I wrote it." in after
    assert main(["manifest", "check", "--strict"]) == 0


def test_check_without_a_module_or_servers_says_what_to_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "handrail.toml").write_text(
        '[[tools]]\nref = "local/add"\ndescription = "Add."\n')
    assert main(["manifest", "check"]) != 0
    assert "name the code to compare with handrail.toml (MODULE:OBJECT)" in \
        capsys.readouterr().err


def test_update_keeps_an_awaited_grant_nothing_lists_yet(project: Path) -> None:
    text = (project / "handrail.toml").read_text() + """
[[tools]]
ref = "time/extra"
description = "Later."
awaited = true
[tools.arguments]
type = "object"
"""
    (project / "handrail.toml").write_text(text)
    assert main(["manifest", "update"]) == 0
    refs = [str(g.ref) for g in hr.Manifest.load("handrail.toml").grants]
    assert "time/extra" in refs


@pytest.mark.timeout(600)  # two starts of the server
def test_init_servers_grants_what_the_servers_offer_for_review(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (project / "handrail.toml").read_text().split("[[tools]]")[0]
    (project / "handrail.toml").write_text(text)
    assert main(["manifest", "init", "--servers"]) == 0
    written = hr.Manifest.load("handrail.toml")
    assert sorted(str(g.ref) for g in written.grants) == ["time/convert_time",
                                                          "time/get_current_time"]
    # Hints are never trusted: granted as mutating, with schemas pinned, for a person to review.
    assert all(g.mutates and g.arguments is not None for g in written.grants)
    assert [s.name for s in written.servers] == ["time"]
    assert (project / "handrail.toml").read_text().startswith(text)
    assert main(["manifest", "check"]) == 0


def test_init_servers_needs_servers_declared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["manifest", "init", "--servers"]) != 0
    assert "reads the [[servers]] of handrail.toml" in capsys.readouterr().err
