"""Act and Action: what a call touches."""

import pytest

import handrail as hr


def test_actions() -> None:
    assert hr.Action(hr.Act.WRITE, "a.txt", b"x").describe() == "write a.txt"
    exec_action = hr.Action(hr.Act.EXEC, ["git", "status"])  # type: ignore[arg-type]
    assert exec_action.target == ("git", "status")
    assert exec_action.describe() == "exec git status"


def test_action_targets_are_checked() -> None:
    with pytest.raises(TypeError, match="never a shell string"):
        hr.Action(hr.Act.EXEC, "rm -rf /")
    with pytest.raises(TypeError, match="must be a string"):
        hr.Action(hr.Act.READ, ("a", "b"))
    with pytest.raises(TypeError, match=r"hr\.Act"):
        hr.Action("read", "a")  # type: ignore[arg-type]
