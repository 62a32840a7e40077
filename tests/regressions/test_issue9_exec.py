"""Issue 9 §5 (EXEC): the program word is canonicalised before matching, an allow by bare
name admits only a program found on PATH, and the exec tool runs exactly what was decided."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.policy import Effect, Policy

X = hr.Act.EXEC


def _program(directory: Path, name: str, says: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f'#!/bin/sh\necho {says} "$0" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only our own `git` and `rm` (plus /bin for /bin/sh)."""
    bin_ = (tmp_path / "bin").resolve()
    _program(bin_, "git", "PATH-git")
    _program(bin_, "rm", "PATH-rm")
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}/bin")
    return bin_


def effect(policy: Policy, argv: tuple[str, ...], ws: Path) -> Effect:
    return policy.check(hr.Action(X, argv), workspace=ws).effect


def test_a_deny_pinned_to_a_path_catches_every_spelling_of_it(ws: Path, bindir: Path) -> None:
    policy = Policy.permissive().layer("x").deny(X, f"{bindir}/git push **")
    b = str(bindir)
    for program in (b + "/git", "/" + b + "/git", b + "//git", f"{b}/../bin/git",
                    f"{b}/./git", "git", os.path.relpath(bindir / "git", ws)):
        assert effect(policy, (program, "push", "origin"), ws) is Effect.DENY, program
    assert effect(policy, (b + "/git", "status"), ws) is Effect.ALLOW


def test_a_relative_program_is_taken_against_the_workspace(ws: Path, bindir: Path) -> None:
    _program(ws / "sub", "x", "ws-x")
    policy = Policy.permissive().layer("x").deny(X, "sub/x **")
    for program in ("sub/x", "./sub/x", "sub/../sub/x", "./sub//x", str(ws / "sub" / "x")):
        assert effect(policy, (program, "a"), ws) is Effect.DENY, program


def test_a_link_to_a_denied_program_is_denied_by_what_it_runs(ws: Path, bindir: Path) -> None:
    (ws / "innocent").symlink_to(bindir / "rm")
    policy = Policy.permissive().layer("x").deny(X, "rm -rf*")
    assert effect(policy, ("./innocent", "-rf", "."), ws) is Effect.DENY


def test_an_allow_by_bare_name_admits_only_the_program_on_path(
    ws: Path, bindir: Path, tmp_path: Path
) -> None:
    policy = Policy.default().layer("app").allow(X, "git status")  # exec default: ask
    assert effect(policy, ("git", "status"), ws) is Effect.ALLOW
    v = policy.check(hr.Action(X, ("git", "status")), workspace=ws)
    assert v.target == f"{bindir}/git status"  # the file that will run is what is recorded
    _program(tmp_path / "scratch" / "x", "git", "model-git")
    _program(ws, "git", "ws-git")
    for program in ("../scratch/x/git", str(tmp_path / "scratch" / "x" / "git"), "./git",
                    "git/../git", str(bindir / "git")):
        assert effect(policy, (program, "status"), ws) is Effect.ASK, program
    # A bare name found nowhere on PATH is not allowed either (nothing would run).
    assert effect(Policy.default().layer("a").allow(X, "nosuch **"), ("nosuch",), ws) \
        is Effect.ASK


@pytest.mark.parametrize("entry", [".", "", "ws"])
def test_path_entries_in_the_workspace_are_never_searched(
    ws: Path, bindir: Path, monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    _program(ws, "tool", "ws-tool")
    spelled = str(ws) if entry == "ws" else entry
    monkeypatch.setenv("PATH", f"{spelled}{os.pathsep}{bindir}")
    policy = Policy.default().layer("app").allow(X, "tool **")
    assert effect(policy, ("tool",), ws) is Effect.ASK


async def _run_exec(ws: Path, argv: list[str]) -> hr.ToolResult:
    box = hr.Toolbox(workspace_tools())
    handler = box.handler("workspace/exec", workspace=ws)
    out = await handler.step(hr.Invoke("call-1", {"argv": argv}))
    assert isinstance(out, hr.Finished)
    return out.result


@pytest.mark.anyio
async def test_the_exec_tool_runs_the_program_that_was_decided(ws: Path, bindir: Path) -> None:
    result = await _run_exec(ws, ["git", "status"])
    assert result.structured["stdout"] == f"PATH-git {bindir}/git status\n"
    result = await _run_exec(ws, ["//" + str(bindir)[1:] + "/../bin/git", "x"])
    assert result.structured["stdout"] == f"PATH-git {bindir}/git x\n"


@pytest.mark.anyio
async def test_the_exec_tool_never_finds_a_program_in_the_workspace_by_name(
    ws: Path, bindir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _program(ws, "tool", "ws-tool")
    monkeypatch.setenv("PATH", f".{os.pathsep}{bindir}{os.pathsep}/bin")
    result = await _run_exec(ws, ["tool"])
    assert result.is_error and "not found on PATH" in result.render_text()
    assert (await _run_exec(ws, ["./tool"])).structured["stdout"].startswith("ws-tool ")


@pytest.mark.anyio
async def test_the_exec_tool_refuses_a_program_linked_in_the_workspace(
    ws: Path, bindir: Path
) -> None:
    (ws / "g").symlink_to(bindir / "git")
    result = await _run_exec(ws, ["./g", "push"])
    assert result.is_error and "symbolic link inside the workspace" in result.render_text()
