"""The per-call disk record, and an injected write paused and resumed across processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, call, calls, reply

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("hostable.py")
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]}


def load(path: Path) -> Any:
    return json.loads(path.read_text())


@hr.tool(server="local", name="py")
def py_tool(n: int) -> str:
    """A Python tool."""
    return f"n={n}"


class Host:
    def tools(self) -> list[hr.InjectedTool]:
        return [hr.InjectedTool("put", SCHEMA, "Write a note.", actions=lambda i: [
            hr.Action(hr.Act.WRITE, "notes.txt", content=i["text"].encode())])]

    async def route(self, c: hr.RoutedCall) -> hr.RoutedCapture:
        raise AssertionError("a refused write must never be routed")


async def test_records_after_a_run_python_spawned_and_refused(tmp_path: Path,
                                                              workspace: Path) -> None:
    prog = tmp_path / "bin"
    prog.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write(b'\\xffraw')\n"
                    "sys.stderr.write('warn')\n")
    prog.chmod(0o755)
    spawned = hr.SubprocessTool("bin", [str(prog)], {"type": "object"}, "Bin.")
    policy = (hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/*")
              .deny(hr.Act.WRITE, "notes.txt"))
    records = tmp_path / "records"
    agent = hr.Agent(Scripted([calls([("local/py", {"n": 1}), ("local/bin", {})]),
                               call("local/put", {"text": "TOP SECRET CONTENT"}),
                               reply("done")]),
                     [py_tool, spawned], injection=Host(), policy=policy, workspace=workspace,
                     records_dir=records)
    store = hr.Store.memory()
    with anyio.fail_after(60):
        result = await agent.run("go", store=store)
    assert isinstance(result.outcome, hr.Completed)
    run = records / result.run_id
    py_dir, bin_dir = run / "0" / "call_0_0", run / "0" / "call_0_1"
    put_dir = run / "1" / "call_1_0"

    assert load(py_dir / "input.json") == {"id": "call_0_0", "tool": "local/py",
                                            "input": {"n": 1}}
    out = load(py_dir / "output.json")
    assert (out["stdout"], out["stderr"], out["exit_code"], out["signal"]) == ("n=1", "", 0,
                                                                                None)
    assert out["verdict"]["status"] == "finished" and out["verdict"]["policy"]["effect"] == \
        "allow"
    assert out["started"] <= out["ended"]

    out = load(bin_dir / "output.json")
    assert base64.b64decode(out["stdout"]["base64"]) == b"\xffraw"  # raw, not replaced
    assert out["stderr"] == "warn"
    assert out["source"] == "subprocess"

    assert "TOP SECRET" not in (put_dir / "input.json").read_text()
    # What the refused call's input keeps instead: the digest of its arguments, said so.
    [put] = [c for c in await store.calls(result.run_id) if c.call_id == "call_1_0"]
    assert put.arguments_digest
    assert load(put_dir / "input.json") == {"id": "call_1_0", "tool": "local/put", "input": {
        "redacted": "a refused call's record keeps only the digest",
        "digest": put.arguments_digest}}
    out = load(put_dir / "output.json")
    assert out["verdict"]["status"] == "refused"
    assert out["verdict"]["policy"]["effect"] == "deny"
    assert "TOP SECRET" not in json.dumps(out)
    leftovers = [p for p in records.rglob("*") if p.name.startswith(".")]
    assert leftovers == []  # atomic writes leave no temporary files


async def test_a_lone_plain_calls_input_is_on_disk_before_its_body_runs(tmp_path: Path,
                                                                      workspace: Path) -> None:
    """Issue 38: the fast path's body without a context of its own still has its input
    written first (the records' `before_execute`), as every call's is."""
    records = tmp_path / "records"
    seen: list[bool] = []

    @hr.tool(server="local", name="double", mutates=False)
    async def double(n: int) -> int:
        """Double it."""
        seen.extend(p.name == "input.json" for p in records.rglob("*.json"))
        return 2 * n

    agent = hr.Agent(Scripted([call("local/double", {"n": 2}), reply("done")]), [double],
                     policy=hr.Policy.default(), workspace=workspace, records_dir=records)
    result = await agent.run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    assert seen == [True]  # input.json, and nothing else yet
    path = records / result.run_id / "0" / "call_0_0"
    assert load(path / "input.json") == {"id": "call_0_0", "tool": "local/double",
                                         "input": {"n": 2}}
    assert load(path / "output.json")["stdout"] == "4"


async def test_the_model_sees_the_record_path_in_the_marker(tmp_path: Path,
                                                            workspace: Path) -> None:
    prog = tmp_path / "bin"
    prog.write_text(f"#!{sys.executable}\nprint('x' * 5000)\n")
    prog.chmod(0o755)
    tool = hr.SubprocessTool("bin", [str(prog)], {"type": "object"}, "Bin.")
    records = tmp_path / "records"
    agent = hr.Agent(Scripted([call("local/bin", {}), reply("done")]), [tool],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/*"),
                     workspace=workspace, records_dir=records, output_head_bytes=100,
                     output_tail_bytes=100)
    store = hr.Store.memory()
    result = await agent.run("go", store=store)
    (record,) = await store.calls(result.run_id)
    assert record.result is not None
    text = record.result["content"][0]["text"]
    path = records / result.run_id / "0" / "call_0_0" / "output.json"
    assert f"full record: {path}]" in text
    assert len(load(path)["stdout"]) == 5001  # the record keeps everything


def test_a_hostile_call_id_cannot_choose_the_record_path(tmp_path: Path) -> None:
    path = hr.host.record_dir(tmp_path, "run1", 0, "../../../etc/passwd")
    assert path.parent == tmp_path / "run1" / "0"
    assert path.name.startswith("h-")


def drive(tmp: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp / "runs.db"),
                           str(tmp / "records"), str(tmp / "effects"), *args],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout.strip().splitlines()
    assert out, proc.stderr
    return dict(json.loads(out[-1]))


@pytest.mark.slow
def test_an_injected_write_pauses_resumes_in_another_process_and_is_routed_once(
        tmp_path: Path) -> None:
    paused = drive(tmp_path, "start")
    assert paused["outcome"] == "awaiting_approval", paused
    assert not (tmp_path / "effects").exists()  # nothing routed before the decision
    request = paused["detail"]["request_id"]
    done = drive(tmp_path, "decide", request)
    assert done["outcome"] == "completed", done
    again = drive(tmp_path, "decide", request)
    assert again.get("error") == "AlreadyDecided", again
    assert (tmp_path / "effects").read_text() == "secret note\n"
    record = tmp_path / "records" / done["run_id"] / "0" / "call_0_0"
    assert load(record / "output.json")["stdout"] == "stored"
    assert load(record / "input.json")["input"] == {"text": "secret note"}


@pytest.mark.slow
def test_a_sigkill_mid_call_leaves_input_and_no_output(tmp_path: Path) -> None:
    fifo = tmp_path / "running"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path / "runs.db"),
                             str(tmp_path / "records"), str(tmp_path / "effects"), "hang",
                             str(fifo)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    with open(fifo) as fh:  # the tool's program is running once its pid arrives
        program = int(fh.readline())
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        os.kill(program, signal.SIGKILL)  # orphaned by the SIGKILL: ours to clean up
    (call_dir,) = (tmp_path / "records").glob("*/0/call_0_0")
    assert load(call_dir / "input.json") == {"id": "call_0_0", "tool": "local/hang",
                                              "input": {}}
    assert not (call_dir / "output.json").exists()


async def test_handrail_show_prints_each_calls_record_path(
        tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from handrail.cli import main

    records = tmp_path / "records"
    db = tmp_path / "runs.db"
    agent = hr.Agent(Scripted([calls([("local/py", {"n": 1}), ("local/py", {"n": 2})]),
                               reply("done")]), [py_tool],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/*"),
                     workspace=workspace, records_dir=records)
    async with hr.Store.open(str(db)) as store:
        result = await agent.run("go", store=store)
    capsys.readouterr()
    assert await anyio.to_thread.run_sync(main, ["show", result.run_id, "--store", str(db)]) == 0
    shown = capsys.readouterr().out
    for call_id in ("call_0_0", "call_0_1"):
        path = records / result.run_id / "0" / call_id
        assert f"record: {path}" in shown
        assert (path / "output.json").exists()
