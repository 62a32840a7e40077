"""Issue 23: a program the policy lets run is confined by the same policy (docs/sandbox.md).

Every test drives a real agent (scripted model, the built-in workspace tools, the default
policy, the exec approved by `hr.ApproveAll`) and looks at what the program itself could do,
from its exit code and output, and at what the host filesystem holds afterwards.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, call, reply
from handrail.sandbox import _landlock, find_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(find_bwrap()[0] is None,
                       reason=f"no working bubblewrap here: {find_bwrap()[1]}"),
]

PY = sys.executable
SECRET = "API_KEY=must-not-leak"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "config").write_text("[remote]\n")
    (root / ".env").write_text(SECRET)
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('app')\n")
    (root / "deep" / "er").mkdir(parents=True)
    (root / "deep" / "er" / ".env.local").write_text(SECRET)
    return root.resolve()


async def run_exec(tmp_path: Path, ws: Path, argv: list[str], *,
                   policy: hr.Policy | None = None, **agent: Any) -> dict[str, Any]:
    """Run one approved exec of `argv` through an agent; the exec's structured result."""
    model = Scripted([call("workspace/exec", {"argv": argv, "timeout": 60}), reply("done")])
    a = hr.Agent(model, hr.builtin.workspace_tools(), workspace=ws,
                 policy=policy or hr.Policy.default(), **agent)
    async with hr.Store.open(tmp_path / "runs.db") as store:
        done = await a.run("run it", store=store, approver=hr.ApproveAll())
        assert done.outcome == hr.Completed("done")
        (record,) = await store.calls(done.run_id)
    assert record.result is not None
    out: dict[str, Any] = record.result["structured"]
    return out


async def test_cat_dotenv_fails_inside_the_program(tmp_path: Path, ws: Path) -> None:
    out = await run_exec(tmp_path, ws, ["cat", ".env", "deep/er/.env.local"])
    assert out["exit_code"] != 0
    assert SECRET not in out["stdout"]
    assert out["sandbox"]["mechanism"] == "bwrap"
    assert {".env", "deep/er/.env.local", ".git/config"} <= set(out["sandbox"]["hidden"])


async def test_python_open_dotenv_fails(tmp_path: Path, ws: Path) -> None:
    out = await run_exec(tmp_path, ws, [PY, "-c", "print(open('.env').read())"])
    assert out["exit_code"] != 0
    assert SECRET not in out["stdout"]
    assert "PermissionError" in out["stderr"]


async def test_a_link_made_inside_does_not_reach_the_hidden_file(tmp_path: Path,
                                                                 ws: Path) -> None:
    script = ("import os; os.symlink('.env', 'innocent'); "
              "print(open('innocent').read())")
    out = await run_exec(tmp_path, ws, [PY, "-c", script])
    assert SECRET not in out["stdout"]
    assert out["exit_code"] != 0


async def test_writing_outside_the_workspace_fails(tmp_path: Path, ws: Path) -> None:
    script = "open('../outside.txt', 'w').write('x')"
    out = await run_exec(tmp_path, ws, [PY, "-c", script])
    assert out["exit_code"] != 0
    assert "Read-only file system" in out["stderr"]
    assert not (tmp_path / "outside.txt").exists()


async def test_writing_git_config_fails(tmp_path: Path, ws: Path) -> None:
    # The default policy's secrets layer denies READ and WRITE of **/.git/config.
    assert hr.Policy.default().check(hr.Action(hr.Act.WRITE, ".git/config"),
                                     workspace=ws).effect is hr.Effect.DENY
    out = await run_exec(tmp_path, ws, ["sh", "-c", "echo '[x]' >> .git/config"])
    assert out["exit_code"] != 0
    assert (ws / ".git" / "config").read_text() == "[remote]\n"


async def test_a_write_denied_file_is_read_only_but_readable(tmp_path: Path,
                                                             ws: Path) -> None:
    policy = hr.Policy.default().layer("app").deny(hr.Act.WRITE, "src/**")
    script = ("print(open('src/app.py').read(), end=''); "
              "open('src/app.py', 'a').write('tampered')")
    out = await run_exec(tmp_path, ws, [PY, "-c", script], policy=policy)
    assert out["stdout"] == "print('app')\n"
    assert out["exit_code"] != 0
    assert (ws / "src" / "app.py").read_text() == "print('app')\n"
    assert "src" in out["sandbox"]["read_only"]


async def test_ordinary_files_are_read_and_written(tmp_path: Path, ws: Path) -> None:
    script = ("import os; print(open('src/app.py').read(), end=''); "
              "open('new.txt', 'w').write('made'); os.makedirs('build/x'); "
              "open('build/x/o', 'w').write('o'); open('/tmp/scratch', 'w').write('t')")
    out = await run_exec(tmp_path, ws, [PY, "-c", script])
    assert out["exit_code"] == 0, out["stderr"]
    assert out["stdout"] == "print('app')\n"
    assert (ws / "new.txt").read_text() == "made"
    assert (ws / "build" / "x" / "o").read_text() == "o"


@pytest.fixture
def server() -> Iterator[int]:
    """A TCP server on the host's loopback that answers 'hello' to every connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(5)
    sock.close()


CONNECT = ("import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), "
           "timeout=5); print(s.recv(5).decode())")


async def test_a_net_deny_holds_inside_the_program(tmp_path: Path, ws: Path,
                                                   server: int) -> None:
    out = await run_exec(tmp_path, ws, [PY, "-c", CONNECT, str(server)])
    assert out["exit_code"] != 0
    assert "hello" not in out["stdout"]
    assert out["sandbox"]["network"] == "none"


async def test_a_net_allow_gives_the_host_network_with_a_warning(tmp_path: Path, ws: Path,
                                                                 server: int) -> None:
    policy = hr.Policy.default().layer("app").allow(hr.Act.NET, "example.org")
    out = await run_exec(tmp_path, ws, [PY, "-c", CONNECT, str(server)], policy=policy)
    assert out["stdout"].strip() == "hello"
    assert out["sandbox"]["network"] == "host"
    assert any("network" in w for w in out["sandbox"]["warnings"])


async def test_off_is_explicit_and_recorded(tmp_path: Path, ws: Path) -> None:
    out = await run_exec(tmp_path, ws, ["cat", ".env"], sandbox="off")
    assert out["stdout"] == SECRET  # unconfined: exactly what "off" means
    assert out["sandbox"]["mode"] == "off"
    assert out["sandbox"]["mechanism"] == "none"


@pytest.fixture
def no_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without bubblewrap: the lookup points at a path that does not exist."""
    monkeypatch.setenv("HANDRAIL_BWRAP", str(tmp_path / "no-such-bwrap"))


@pytest.fixture
def no_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without Landlock."""
    monkeypatch.setattr(_landlock, "abi", lambda: 0)


async def required_refusal(tmp_path: Path, ws: Path) -> str:
    marker = ws / "ran"
    model = Scripted([call("workspace/exec", {"argv": ["touch", str(marker)]}), reply("done")])
    a = hr.Agent(model, hr.builtin.workspace_tools(), workspace=ws, sandbox="required")
    async with hr.Store.open(tmp_path / "runs.db") as store:
        done = await a.run("run it", store=store, approver=hr.ApproveAll())
        (record,) = await store.calls(done.run_id)
    assert not marker.exists()
    assert record.result is not None and record.result["is_error"]
    text = str(record.result)
    assert "sandbox='required'" in text and "bubblewrap not found" in text
    assert "nothing was started" in text
    return text


async def test_required_without_any_mechanism_refuses_and_names_what_is_missing(
        tmp_path: Path, ws: Path, no_bwrap: None, no_landlock: None) -> None:
    assert "no Landlock" in await required_refusal(tmp_path, ws)


async def test_auto_without_any_mechanism_runs_and_records_it(
        tmp_path: Path, ws: Path, no_bwrap: None, no_landlock: None) -> None:
    out = await run_exec(tmp_path, ws, ["true"])
    assert out["exit_code"] == 0
    assert out["sandbox"]["mechanism"] == "none"
    assert "bubblewrap not found" in out["sandbox"]["warnings"][0]


needs_landlock = pytest.mark.skipif(_landlock.abi() < 4, reason="needs Landlock ABI 4 or later")


@needs_landlock
async def test_required_refuses_when_landlock_cannot_hide_a_denied_file(
        tmp_path: Path, ws: Path, no_bwrap: None) -> None:
    assert "Landlock (the fallback) cannot enforce this" in await required_refusal(tmp_path, ws)


@needs_landlock
async def test_landlock_fallback_confines_writes_and_tcp(tmp_path: Path, ws: Path,
                                                         no_bwrap: None, server: int) -> None:
    script = ("import socket, sys\n"
              "open('made.txt', 'w').write('ok')\n"
              "for act in (lambda: open('../outside.txt', 'w'),"
              " lambda: socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)):\n"
              "    try:\n        act(); print('reached')\n"
              "    except OSError:\n        print('refused')\n")
    out = await run_exec(tmp_path, ws, [PY, "-c", script, str(server)])
    assert out["exit_code"] == 0, out["stderr"]
    assert out["stdout"].split() == ["refused", "refused"]
    assert (ws / "made.txt").read_text() == "ok"
    assert not (tmp_path / "outside.txt").exists()
    record = out["sandbox"]
    assert record["mechanism"] == "landlock" and record["network"] == "none"
    # What it cannot do is said, not hidden: .env stays readable under Landlock.
    assert ".env" in record["not_enforced"]
    assert any("READ-denied" in w for w in record["warnings"])


@needs_landlock
async def test_required_runs_under_landlock_when_nothing_is_left_unenforced(
        tmp_path: Path, no_bwrap: None) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    out = await run_exec(tmp_path, plain.resolve(), ["sh", "-c", "echo hi > a.txt; cat a.txt"],
                         sandbox="required")
    assert out["stdout"] == "hi\n"
    assert out["sandbox"]["mechanism"] == "landlock"


def test_agent_refuses_an_unknown_mode(ws: Path) -> None:
    with pytest.raises(hr.UserError, match="sandbox must be"):
        hr.Agent(Scripted([]), [], workspace=ws, sandbox="maybe")  # type: ignore[arg-type]


async def test_a_deny_added_while_paused_narrows_the_program(tmp_path: Path,
                                                             ws: Path) -> None:
    (ws / "notes.txt").write_text("private notes")
    step = call("workspace/exec", {"argv": ["cat", "notes.txt"]})

    def agent(policy: hr.Policy) -> hr.Agent:
        return hr.Agent(Scripted([step, reply("done")]), hr.builtin.workspace_tools(),
                        workspace=ws, policy=policy)

    async with hr.Store.open(tmp_path / "runs.db") as store:
        paused = await agent(hr.Policy.default()).run("run it", store=store)
        assert isinstance(paused.outcome, hr.AwaitingApproval)
        narrower = hr.Policy.default().layer("later").deny(hr.Act.READ, "notes.txt")
        done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                             hr.Decision.approve(), agent=agent(narrower))
        assert done.outcome == hr.Completed("done")
        (record,) = await store.calls(done.run_id)
    assert record.result is not None
    out = record.result["structured"]
    assert "private notes" not in out["stdout"]
    assert "notes.txt" in out["sandbox"]["hidden"]


def _alive_with(token: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                return True
    return False


def _wait_none_with(token: str) -> bool:
    deadline = time.monotonic() + 10
    while _alive_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_a_background_child_dies_with_the_program(tmp_path: Path, ws: Path) -> None:
    token = f"handrail-sandbox-child-{os.getpid()}-{time.monotonic_ns()}"
    script = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              f"'import time; time.sleep(30)', {token!r}]); print('started')")
    with anyio.fail_after(30):
        out = await run_exec(tmp_path, ws, [PY, "-c", script])
    assert out["stdout"] == "started\n"
    assert out["timed_out"] is False  # the pid namespace ends with its program
    assert await anyio.to_thread.run_sync(_wait_none_with, token)


async def test_the_program_holds_no_capabilities(tmp_path: Path, ws: Path) -> None:
    # bwrap started by root keeps root's capabilities unless told otherwise: the program
    # could then remount / read-write and undo every other rule here.
    out = await run_exec(tmp_path, ws, ["grep", "^CapEff", "/proc/self/status"])
    assert out["stdout"].split() == ["CapEff:", "0000000000000000"]


async def test_a_read_denied_folder_is_hidden_whole(tmp_path: Path, ws: Path) -> None:
    (ws / "private").mkdir()
    (ws / "private" / "k.txt").write_text(SECRET)
    policy = hr.Policy.default().layer("app").deny(hr.Act.READ, "private/**")
    script = ("import os\n"
              "for act in (lambda: os.listdir('private'), lambda: open('private/k.txt').read(),"
              " lambda: open('private/new', 'w').write('x')):\n"
              "    try:\n        print(act())\n    except OSError as e:\n"
              "        print(type(e).__name__)\n")
    out = await run_exec(tmp_path, ws, [PY, "-c", script], policy=policy)
    assert out["exit_code"] == 0, out["stderr"]
    assert SECRET not in out["stdout"]
    assert out["stdout"].split() == ["PermissionError", "PermissionError", "PermissionError"]
    assert not (ws / "private" / "new").exists()
    assert "private" in out["sandbox"]["hidden"]


def test_the_demo_says_which_sandbox_is_in_force(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from handrail.cli._demo import sandbox_line

    assert sandbox_line("auto").startswith("sandbox: auto — programs run in bubblewrap")
    assert sandbox_line("off").startswith("sandbox: off — programs run unconfined")
    monkeypatch.setenv("HANDRAIL_BWRAP", str(tmp_path / "no-such-bwrap"))
    if _landlock.abi():
        assert "Landlock ABI" in sandbox_line("auto")
        assert "READ denies NOT enforced" in sandbox_line("auto")
    monkeypatch.setattr("handrail.cli._demo.landlock_abi", lambda: 0)
    assert "UNCONFINED" in sandbox_line("auto") and "bubblewrap not found" in sandbox_line("auto")
    assert "will be refused" in sandbox_line("required")


async def test_the_run_store_in_the_workspace_is_out_of_reach(tmp_path: Path,
                                                              ws: Path) -> None:
    # `handrail` run from the project folder keeps its store at ./.handrail/runs.db: a program
    # that could write it could approve its own pending calls.
    store = ws / ".handrail"
    store.mkdir()
    script = ("import os, sqlite3\n"
              "for act in (lambda: os.listdir('.handrail'),"
              " lambda: sqlite3.connect('.handrail/runs.db').execute('create table t(x)')):\n"
              "    try:\n        act(); print('reached')\n"
              "    except (OSError, sqlite3.Error) as e:\n        print('refused')\n")
    model = Scripted([call("workspace/exec", {"argv": [PY, "-c", script]}), reply("done")])
    a = hr.Agent(model, hr.builtin.workspace_tools(), workspace=ws)
    async with hr.Store.open(store / "runs.db") as opened:
        done = await a.run("run it", store=opened, approver=hr.ApproveAll())
        (record,) = await opened.calls(done.run_id)
    assert record.result is not None
    out = record.result["structured"]
    assert out["stdout"].split() == ["refused", "refused"], out
    assert ".handrail" in out["sandbox"]["hidden"]


async def test_required_with_bubblewrap_runs_confined(tmp_path: Path, ws: Path) -> None:
    out = await run_exec(tmp_path, ws, ["cat", ".env"], sandbox="required")
    assert out["exit_code"] != 0 and SECRET not in out["stdout"]
    assert out["sandbox"]["mode"] == "required" and out["sandbox"]["mechanism"] == "bwrap"


async def test_a_confined_program_past_its_deadline_is_a_timeout_not_a_failed_start(
        ws: Path) -> None:
    # bwrap, terminated at the deadline, exits without its status report (255 here): that
    # must still read as the deadline, not as "the sandbox could not start it".
    capture = hr.host.ProcessCapture.new()
    argv, record = hr.sandbox.wrap([PY, "-c", "import time; time.sleep(60)"],
                                   policy=hr.Policy.default(), workspace=ws)
    assert record["mechanism"] == "bwrap"
    with anyio.fail_after(30):
        await hr.host.run_process(argv, capture, cwd=ws, timeout=0.5, grace=1, bwrap=True)
    assert capture.timed_out and capture.signal_ours
    assert capture.spawn_error is None, capture.spawn_error
    assert "Killed after the 0.5s timeout" in capture.envelope()


def test_bwrap_killed_by_us_without_its_report_is_not_a_failed_start() -> None:
    # Seen under load: bwrap terminated at a deadline exited 255 with no report at all.
    from handrail.host._process import _bwrap_status

    for ours, expected in ((True, None), (False, "could not start it")):
        capture = hr.host.ProcessCapture.new()
        capture.exit_code, capture.signal_ours = 255, ours
        read, write = os.pipe()
        os.close(write)  # bwrap wrote nothing
        _bwrap_status(read, capture)
        if expected is None:
            assert capture.spawn_error is None and capture.exit_code == 255
        else:
            assert capture.spawn_error is not None and expected in capture.spawn_error


async def test_a_model_cannot_read_tmp_by_naming_a_path_in_its_argv(tmp_path: Path,
                                                                      ws: Path) -> None:
    # A program a developer configures gets its script's folder in /tmp bound in; a model's
    # argv does not: naming a file must not be the way past the private /tmp.
    other = tmp_path / "other"
    other.mkdir()
    (other / "secret.txt").write_text(SECRET)
    out = await run_exec(tmp_path, ws, ["cat", str(other / "secret.txt")])
    assert out["exit_code"] != 0
    assert SECRET not in out["stdout"]
    assert "No such file" in out["stderr"]
