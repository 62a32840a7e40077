"""Taint survives a real process exit: the page is read by one process, the send it steers
is checked by another, which never saw the page but rebuilds the index from the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import forks
import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("taintable.py")


def drive(db: Path, *args: str) -> dict[str, Any]:
    code, stdout, stderr = forks.shared().run(SCRIPT, [str(db), *args], {}, db.parent)
    assert code == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_send_is_asked_about_in_the_process_that_resumes(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = drive(db, "start")
    assert first["outcome"] == "awaiting_approval"
    second = drive(db, "decide", first["detail"]["request_id"])
    assert second["outcome"] == "completed"
    assert not any("sent" in entry for entry in second["asked"]), second["asked"]
    (asked,) = second["asked"]  # nothing was sent; the one request was the send's
    assert asked["tool"] == "mail/send"
    (taint,) = asked["taint"]
    assert (taint["pointer"], taint["value"], taint["source_call"], taint["source_tool"]) == (
        "/to", "attacker@example.com", "call_0_0", "web/read_page")
