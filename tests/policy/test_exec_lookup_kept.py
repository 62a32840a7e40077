"""An EXEC check keeps its PATH lookup only while nothing it read on disk changed.

A repeated check does not look the program up again (`handrail.tools.WatchedAnswers`); each
change that would make a fresh lookup answer differently must be seen at the next check: a
program appearing earlier on PATH, the hit replaced, removed or made non-executable, a PATH
change, a symlink retargeted (the hit, its target, a PATH directory that is a link), a PATH
directory created. Every case runs on a real tree, and every answer is also compared to the
lookup done afresh.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import handrail as hr
from handrail.policy import _targets
from handrail.tools import WatchedAnswers

pytestmark = pytest.mark.skipif(
    not WatchedAnswers(attributes=True).keeps(), reason="no inotify: every lookup is done afresh"
)


def program(folder: Path, name: str = "tool", mode: int = 0o755) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def lookup(root: Path, name: str = "tool") -> str | None:
    kept = _targets.resolve_program(name, str(root)).path
    fresh = _targets._search_now(name, os.environ["PATH"], str(root))
    assert kept == fresh
    return kept


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = Path(os.path.realpath(tmp_path))
    (base / "ws").mkdir()
    (base / "early").mkdir()
    program(base / "late")
    monkeypatch.setenv("PATH", f"{base}/early:{base}/late")
    assert lookup(base / "ws") == f"{base}/late/tool"
    assert lookup(base / "ws") == f"{base}/late/tool"  # kept
    return base


def test_a_program_appearing_earlier_on_path_is_found(tree: Path) -> None:
    program(tree / "early")
    assert lookup(tree / "ws") == f"{tree}/early/tool"


def test_a_program_renamed_into_an_earlier_directory_is_found(tree: Path) -> None:
    os.rename(program(tree / "elsewhere"), tree / "early" / "tool")
    assert lookup(tree / "ws") == f"{tree}/early/tool"


def test_the_hit_replaced_removed_or_made_non_executable(tree: Path) -> None:
    program(tree / "early")
    assert lookup(tree / "ws") == f"{tree}/early/tool"
    (tree / "early" / "tool").chmod(0o644)  # no longer executable: the next one is found
    assert lookup(tree / "ws") == f"{tree}/late/tool"
    (tree / "early" / "tool").chmod(0o755)
    assert lookup(tree / "ws") == f"{tree}/early/tool"
    os.replace(program(tree / "x", mode=0o644), tree / "early" / "tool")
    assert lookup(tree / "ws") == f"{tree}/late/tool"
    (tree / "late" / "tool").unlink()
    assert lookup(tree / "ws") is None
    (tree / "late" / "tool").mkdir()  # a directory of that name is not a program
    assert lookup(tree / "ws") is None


def test_a_path_change_is_a_new_lookup(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program(tree / "other")
    monkeypatch.setenv("PATH", f"{tree}/other:{tree}/late")
    assert lookup(tree / "ws") == f"{tree}/other/tool"
    monkeypatch.setenv("PATH", f"{tree}/ws:{tree}/early")  # the workspace is never searched
    program(tree / "ws")
    assert lookup(tree / "ws") is None


def test_a_retargeted_link_is_followed_anew(tree: Path) -> None:
    runnable = program(tree / "opt", "a")
    plain = program(tree / "opt", "b", mode=0o644)
    (tree / "early" / "tool").symlink_to(runnable)
    assert lookup(tree / "ws") == f"{tree}/early/tool"
    new = tree / "early" / "tool.new"
    new.symlink_to(plain)
    os.replace(new, tree / "early" / "tool")  # `ln -sf`: the link now leads to a plain file
    assert lookup(tree / "ws") == f"{tree}/late/tool"
    plain.chmod(0o755)  # the link's target changed, not the link: seen too
    assert lookup(tree / "ws") == f"{tree}/early/tool"
    plain.unlink()  # dangling
    assert lookup(tree / "ws") == f"{tree}/late/tool"


def test_a_path_directory_that_is_a_link_retargeted(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / "empty").mkdir()
    program(tree / "full")
    (tree / "linked").symlink_to("empty")
    monkeypatch.setenv("PATH", f"{tree}/linked:{tree}/late")
    assert lookup(tree / "ws") == f"{tree}/late/tool"
    (tree / "linked").unlink()
    (tree / "linked").symlink_to("full")
    assert lookup(tree / "ws") == f"{tree}/linked/tool"
    # A PATH entry leading into the workspace is skipped, by the check and the run alike.
    (tree / "linked").unlink()
    (tree / "linked").symlink_to("ws")
    program(tree / "ws")
    assert lookup(tree / "ws") == f"{tree}/late/tool"


def test_a_path_directory_created_later_is_searched(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tree}/not/yet:{tree}/late")
    assert lookup(tree / "ws") == f"{tree}/late/tool"
    program(tree / "not" / "yet")
    assert lookup(tree / "ws") == f"{tree}/not/yet/tool"


def test_a_program_given_by_path_follows_its_link_anew(tree: Path) -> None:
    ws = tree / "ws"
    program(ws / "bin", "a")
    program(ws / "bin", "rm")
    (ws / "t").symlink_to("bin/a")
    policy = hr.Policy.default().layer("app").deny(hr.Act.EXEC, "rm **")
    action = hr.Action(hr.Act.EXEC, ("./t", "-f", "x"))
    assert policy.check(action, workspace=ws).effect is not hr.Effect.DENY
    assert policy.check(action, workspace=ws).effect is not hr.Effect.DENY
    (ws / "t").unlink()
    (ws / "t").symlink_to("bin/rm")  # now a link named t pointing at rm
    assert policy.check(action, workspace=ws).effect is hr.Effect.DENY


def test_the_verdict_names_the_program_found_now(tree: Path) -> None:
    policy = hr.Policy.default()
    action = hr.Action(hr.Act.EXEC, ("tool", "--flag"))
    assert policy.check(action, workspace=tree / "ws").target == f"{tree}/late/tool --flag"
    program(tree / "early")
    assert policy.check(action, workspace=tree / "ws").target == f"{tree}/early/tool --flag"
