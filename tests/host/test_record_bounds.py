"""Issue 33: the disk record's bound holds on disk and in memory, escaped form included.

The story: the per-call record kept 64 MiB of a stream, but JSON escapes a control byte as
six (`\\u0001`): a program printing 1.3 GB of them made an 805 MB `output.json`, and the
whole escaped string was built in memory first (about 1 GB of RSS).
"""

from __future__ import annotations

import base64
import json
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.host import CallSlot, _process
from handrail.host._records import CallRecords
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

LIMIT = 1024 * 1024


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(_process, "RECORD_LIMIT_BYTES", LIMIT)
    return LIMIT


async def test_a_program_printing_control_bytes_stays_within_the_bound_on_disk(
        tmp_path: Path, workspace: Path, small_limit: int) -> None:
    prog = tmp_path / "bin"
    prog.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"sys.stdout.buffer.write(b'\\x01' * {3 * LIMIT})\n"
                    f"sys.stderr.buffer.write('é'.encode() * {LIMIT})\n")
    prog.chmod(0o755)
    tool = hr.SubprocessTool("bin", [str(prog)], {"type": "object"}, "Bin.")
    records = tmp_path / "records"
    agent = hr.Agent(Scripted([call("local/bin", {}), reply("done")]), [tool],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/*"),
                     workspace=workspace, records_dir=records, sandbox="off")
    with anyio.fail_after(120):
        result = await agent.run("go", store=hr.Store.memory())
    path = records / result.run_id / "0" / "call_0_0" / "output.json"
    # Two streams of at most LIMIT each, and a few hundred bytes of the rest.
    assert path.stat().st_size <= 2 * LIMIT + 4096
    out = json.loads(path.read_text())
    assert set(out["stdout"]) == {"\x01"} and len(out["stdout"]) * 6 <= LIMIT
    assert out["cut"]["stdout"]["kept_bytes"] == len(out["stdout"])
    assert set(out["stderr"]) == {"é"}  # a character is never split
    assert out["cut"]["stderr"]["kept_bytes"] == len(out["stderr"].encode())
    assert out["exit_code"] == 0


def fake_record() -> Any:
    return SimpleNamespace(call_id="c", tool="local/bin", model_name="local/bin",
                           performed_arguments={}, arguments="{}", arguments_digest="d",
                           result={"content": [], "is_error": False}, started_at=1.0,
                           ended_at=2.0, verdict={}, decision=None, disposition=None,
                           error=None, id="c", run_id="r", turn=0)


@pytest.mark.parametrize("data", [b"\x01" * (4 * LIMIT), b"\xff" * (4 * LIMIT)],
                         ids=["escaped", "base64"])
def test_writing_the_record_holds_no_escaped_copy_in_memory(
        tmp_path: Path, small_limit: int, data: bytes) -> None:
    slot = CallSlot(path=tmp_path, stdout=data, stderr=b"", exit_code=0, source="subprocess")
    records = CallRecords(tmp_path)
    tracemalloc.start()
    try:
        records._write_output(tmp_path, fake_record(), slot, "finished")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A chunk at a time (its escaped form, a few hundred KB): never the stream whole (4 MiB
    # here), nor its escaped form (24 MiB).
    assert peak < 2 * LIMIT
    out = json.loads((tmp_path / "output.json").read_text())
    kept = out["cut"]["stdout"]["kept_bytes"]
    assert 0 < kept < len(data) and out["cut"]["stdout"]["total_bytes"] == len(data)
    if isinstance(out["stdout"], dict):
        assert base64.b64decode(out["stdout"]["base64"]) == data[:kept]
    else:
        assert out["stdout"].encode() == data[:kept]
    assert (tmp_path / "output.json").stat().st_size <= LIMIT + 4096


def test_a_record_within_the_bound_is_kept_whole(tmp_path: Path) -> None:
    data = "naïve \x00 \n tab\t".encode() * 1000
    slot = CallSlot(path=tmp_path, stdout=data, stderr=b"\xffraw", exit_code=0)
    CallRecords(tmp_path)._write_output(tmp_path, fake_record(), slot, "finished")
    out = json.loads((tmp_path / "output.json").read_text())
    assert out["stdout"].encode() == data
    assert base64.b64decode(out["stderr"]["base64"]) == b"\xffraw"
    assert "cut" not in out


def test_a_binary_stream_past_the_bound_stays_within_it_base64_wrapper_included(
        tmp_path: Path, small_limit: int) -> None:
    # Bytes that are not UTF-8 are kept as {"base64": "..."}: the bound holds for that whole
    # value, its wrapper included, and the bytes kept are the stream's first.
    data = bytes(range(256)) * (2 * small_limit // 256)
    slot = CallSlot(path=tmp_path, stdout=data, stderr=b"", exit_code=0)
    CallRecords(tmp_path)._write_output(tmp_path, fake_record(), slot, "finished")
    out = json.loads((tmp_path / "output.json").read_text())
    kept = base64.b64decode(out["stdout"]["base64"])
    assert len(json.dumps(out["stdout"])) <= small_limit
    assert kept == data[:len(kept)] and len(kept) >= small_limit // 2
    assert out["cut"]["stdout"] == {"kept_bytes": len(kept), "total_bytes": len(data)}
