"""Issue 33: the SQLite store is private: `.handrail/` 0700, `runs.db`, `-wal`, `-shm` 0600.

The story: `runs.db` and its `-wal` and `-shm` were created 0644 in a 0755 `.handrail/`,
though they hold pending writes' bytes and tool output: every user of the machine could
read them (the disk records were already 0600/0700).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import handrail as hr
from handrail.models import Scripted, reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the usual one: new files 0644, folders 0755, unless told
    try:
        yield
    finally:
        os.umask(old)


async def test_a_new_store_is_readable_by_its_user_only(tmp_path: Path,
                                                        usual_umask: None) -> None:
    db = tmp_path / "project" / ".handrail" / "runs.db"
    async with hr.Store.open(db) as store:
        await hr.Agent(Scripted([reply("done")]), []).run("hello", store=store)
        files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in db.parent.iterdir()}
        assert {"runs.db", "runs.db-wal", "runs.db-shm"} <= set(files), files
        assert all(mode == 0o600 for mode in files.values()), files
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


async def test_an_existing_store_keeps_its_mode(tmp_path: Path, usual_umask: None) -> None:
    db = tmp_path / "shared.db"
    db.touch(mode=0o640)  # an operator's choice (a group that reads it)
    async with hr.Store.open(db):
        pass
    assert stat.S_IMODE(db.stat().st_mode) == 0o640
