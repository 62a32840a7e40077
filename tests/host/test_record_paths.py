"""Where a call's record lives: the model's call id (and the run id) never choose a path."""

from __future__ import annotations

from pathlib import Path

import pytest

import handrail as hr

HOSTILE = ["call_1/../../../etc", "a/b", "ok/..", "call_0_0/", "x\0y", "dir\\..\\up", ".",
           "..", "", "c" * 65, "call 1", "ca\nll", "é"]


@pytest.mark.parametrize("call_id", HOSTILE)
def test_a_call_id_that_is_not_a_short_plain_token_becomes_a_digest(
        tmp_path: Path, call_id: str) -> None:
    path = hr.host.record_dir(tmp_path, "run1", 3, call_id)
    assert path.parent == tmp_path / "run1" / "3"
    assert path.name.startswith("h-") and len(path.name) == 26, path.name
    assert path.name.isascii() and "/" not in path.name and path.name.strip(".") == path.name


def test_distinct_hostile_ids_get_distinct_folders_and_plain_ids_are_kept(tmp_path: Path) -> None:
    names = {hr.host.record_dir(tmp_path, "r", 0, c).name for c in HOSTILE}
    assert len(names) == len(HOSTILE)
    for plain in ("call_0_0", "toolu_01ABC-x.y", "c" * 64):
        assert hr.host.record_dir(tmp_path, "r", 0, plain) == tmp_path / "r" / "0" / plain


def test_a_run_id_is_made_safe_as_well(tmp_path: Path) -> None:
    path = hr.host.record_dir(tmp_path, "../outside", 0, "call_0_0")
    assert path.parent.parent.parent == tmp_path
    assert path.parent.parent.name.startswith("h-")


@pytest.mark.anyio
async def test_input_json_holds_the_arguments_performed_not_the_models(tmp_path: Path) -> None:
    import json
    import types

    from handrail.host._records import CallRecords

    records = CallRecords(tmp_path)
    # An approval that edited the arguments: what runs is what the record says.
    record = types.SimpleNamespace(id="r1:0:call_0_0", run_id="r1", turn=0, call_id="call_0_0",
                                   tool="fs/write", arguments='{"path": "model.txt"}',
                                   performed_arguments={"path": "person.txt"})
    await records.before_execute(record)
    written = json.loads((tmp_path / "r1" / "0" / "call_0_0" / "input.json").read_text())
    assert written == {"id": "call_0_0", "tool": "fs/write", "input": {"path": "person.txt"}}
    record = types.SimpleNamespace(id="r1:0:call_0_1", run_id="r1", turn=0, call_id="call_0_1",
                                   tool="fs/write", arguments='{"path": "model.txt"}',
                                   performed_arguments=None)
    await records.before_execute(record)
    written = json.loads((tmp_path / "r1" / "0" / "call_0_1" / "input.json").read_text())
    assert written["input"] == {"path": "model.txt"}
