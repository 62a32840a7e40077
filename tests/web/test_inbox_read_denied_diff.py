"""Issue 33: the inbox's diff of a pending write never shows a READ-denied file's contents.

The story: a pending write to a file the policy denies for READ showed the file's current
contents, in the diff, to everyone signed in to the inbox (a write to `.env`, approved or
not, must not be how its secrets are read).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

import handrail as hr

pytest.importorskip("starlette")

from handrail.web._inbox import _action_diff, _read_policy

NOTE = "no diff: the current file is READ-denied"


def write(target: str, content: bytes) -> dict[str, object]:
    return {"act": "write", "target": target,
            "content": base64.b64encode(content).decode("ascii")}


def test_a_read_denied_file_is_not_shown(tmp_path: Path) -> None:
    (tmp_path / "diary.txt").write_text("my secret diary\n")
    (tmp_path / "notes.txt").write_text("plain notes\n")
    policy = hr.Policy.default().layer("app").deny(hr.Act.READ, "diary.txt")
    hidden = _action_diff(write("diary.txt", b"new\n"), str(tmp_path), "workspace/write_file",
                          {}, policy)
    assert [(d.kind, d.text) for d in hidden] == [("note", NOTE)]
    shown = _action_diff(write("notes.txt", b"new\n"), str(tmp_path), "workspace/write_file",
                         {}, policy)
    assert any("plain notes" in d.text for d in shown)


def test_an_edit_of_a_read_denied_file_is_not_shown(tmp_path: Path) -> None:
    (tmp_path / "diary.txt").write_text("my secret diary\n")
    policy = hr.Policy.default().layer("app").deny(hr.Act.READ, "diary.txt")
    out = _action_diff({"act": "write", "target": "diary.txt"}, str(tmp_path),
                       "workspace/edit_file", {"path": "diary.txt", "old": "secret",
                                               "new": "public"}, policy)
    assert [d.text for d in out] == [NOTE]


def test_without_a_recorded_policy_the_default_one_decides(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("API_KEY=must-not-leak\n")
    out = _action_diff(write(".env", b"API_KEY=x\n"), str(tmp_path), "workspace/write_file",
                       {}, _read_policy(None, None))
    assert [d.text for d in out] == [NOTE]
    assert "must-not-leak" not in repr(out)
