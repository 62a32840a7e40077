"""Issue 23: programs as tools (`hr.SubprocessTool`, loaded folders) are confined like `exec`.

A real agent (scripted model, the default policy plus an allow of `call local/*`) calls a tool
whose program is a shell script; what the script could read is in its output, and how it was
confined is in the call record's metadata and the disk record's `output.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.models import Scripted, call, reply
from handrail.sandbox import _landlock, find_bwrap

pytestmark = pytest.mark.anyio

needs_bwrap = pytest.mark.skipif(find_bwrap()[0] is None,
                                 reason=f"no working bubblewrap here: {find_bwrap()[1]}")

SECRET = "API_KEY=must-not-leak"
SCRIPT = "#!/bin/sh\ncat src/app.txt\ncat .env\necho \"exit=$?\"\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / ".env").write_text(SECRET)
    (root / "src" / "app.txt").write_text("ordinary\n")
    return root.resolve()


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    """A tool folder outside the workspace (in /tmp, as a test's tmp_path is)."""
    folder = tmp_path / "tools" / "peek"
    folder.mkdir(parents=True)
    run = folder / "run"
    run.write_text(SCRIPT)
    run.chmod(0o755)
    (folder / "schema.json").write_text('{"type": "object"}')
    (folder / "description.md").write_text("Peek at files.")
    return folder.parent


async def run_tool(tmp_path: Path, ws: Path, tools: list[Any], **agent: Any
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One call of `local/peek` through an agent: (the call's result, its output.json)."""
    policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/*")
    records = tmp_path / "records"
    a = hr.Agent(Scripted([call("local/peek", {}), reply("done")]), tools, workspace=ws,
                 policy=policy, records_dir=records, **agent)
    async with hr.Store.open(tmp_path / "runs.db") as store:
        done = await a.run("peek", store=store)
        assert done.outcome == hr.Completed("done")
        (record,) = await store.calls(done.run_id)
    assert record.result is not None
    (output,) = (records / done.run_id).glob("*/*/output.json")
    disk: dict[str, Any] = json.loads(output.read_text())
    return record.result, disk


def text_of(result: dict[str, Any]) -> str:
    return "".join(i.get("text", "") for i in result["content"])


@needs_bwrap
async def test_a_loaded_program_cannot_read_dotenv_but_reads_workspace_files(
        tmp_path: Path, ws: Path, tools_dir: Path) -> None:
    result, disk = await run_tool(tmp_path, ws, hr.load_tool_dir(tools_dir))
    text = text_of(result)
    assert "ordinary" in text
    assert SECRET not in text and SECRET not in json.dumps(disk)
    assert "exit=0" not in text  # cat .env failed inside the program
    sandbox = result["metadata"]["handrail.sandbox"]
    assert sandbox["mechanism"] == "bwrap" and ".env" in sandbox["hidden"]
    assert disk["sandbox"] == sandbox


@needs_bwrap
async def test_a_subprocess_tool_with_its_own_cwd_is_confined_and_starts_there(
        tmp_path: Path, ws: Path) -> None:
    tool = hr.SubprocessTool("peek", ["sh", "-c", "pwd; cat app.txt ../.env"],
                             {"type": "object"}, "Peek.", cwd=ws / "src")
    result, _ = await run_tool(tmp_path, ws, [tool])
    text = text_of(result)
    assert f"{ws}/src\n" in text and "ordinary" in text and SECRET not in text
    assert result["metadata"]["handrail.sandbox"]["mechanism"] == "bwrap"


@needs_bwrap
async def test_a_cwd_in_tmp_outside_the_workspace_is_refused_clearly(
        tmp_path: Path, ws: Path) -> None:
    marker = tmp_path / "ran"
    tool = hr.SubprocessTool("peek", ["touch", str(marker)], {"type": "object"}, "Peek.",
                             cwd=tmp_path)
    result, _ = await run_tool(tmp_path, ws, [tool])
    assert result["is_error"] and not marker.exists()
    assert "private" in text_of(result) and "nothing was started" in text_of(result)


async def test_off_is_recorded(tmp_path: Path, ws: Path, tools_dir: Path) -> None:
    result, disk = await run_tool(tmp_path, ws, hr.load_tool_dir(tools_dir), sandbox="off")
    assert SECRET in text_of(result)  # unconfined: exactly what "off" means
    assert result["metadata"]["handrail.sandbox"]["mode"] == "off"
    assert disk["sandbox"]["mechanism"] == "none"


async def test_required_without_any_mechanism_refuses_and_starts_nothing(
        tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDRAIL_BWRAP", str(tmp_path / "no-such-bwrap"))
    monkeypatch.setattr(_landlock, "abi", lambda: 0)
    marker = ws / "ran"
    tool = hr.SubprocessTool("peek", ["touch", str(marker)], {"type": "object"}, "Peek.")
    result, _ = await run_tool(tmp_path, ws, [tool], sandbox="required")
    assert not marker.exists()
    assert result["is_error"]
    text = text_of(result)
    assert "local/peek" in text and "sandbox='required'" in text
    assert "bubblewrap not found" in text and "nothing was started" in text


PROBE = """
import json, os, socket, sys
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = type(exc).__name__
attempt("open_env", lambda: open(".env").read())
attempt("write_outside", lambda: open("../outside.txt", "w").write("x"))
attempt("write_git_config", lambda: open(".git/config", "a").write("x"))
attempt("connect", lambda: socket.create_connection(
    ("127.0.0.1", int(os.environ["PORT"])), timeout=5).close())
attempt("read_ordinary", lambda: open("src/app.txt").read())
attempt("write_ordinary", lambda: open("src/new.txt", "w").write("made"))
print(json.dumps(out))
"""


@needs_bwrap
async def test_a_subprocess_tool_meets_every_deny_inside_the_program(
        tmp_path: Path, ws: Path) -> None:
    import socket
    import sys

    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        tools = [
            hr.SubprocessTool("peek", [sys.executable, "-c", PROBE], {"type": "object"},
                              "Probe.", env={"PORT": str(port)}),
            hr.SubprocessTool("peek", ["sh", "-c", "cat .env; echo cat=$?"],
                              {"type": "object"}, "Cat.", server="sh"),
        ]
        result, _ = await run_tool(tmp_path, ws, tools[:1])
        shell = hr.Agent(Scripted([call("sh/peek", {}), reply("done")]), tools[1:],
                         workspace=ws, policy=hr.Policy.default().layer("app").allow(
                             hr.Act.CALL, "sh/*"))
        async with hr.Store.open(tmp_path / "sh.db") as store:
            done = await shell.run("cat", store=store)
            (cat,) = await store.calls(done.run_id)
    text = text_of(result)
    probe = json.loads(text.split("\n", 1)[1])
    assert probe == {"open_env": "PermissionError", "write_outside": probe["write_outside"],
                     "write_git_config": probe["write_git_config"],
                     "connect": probe["connect"], "read_ordinary": "ok",
                     "write_ordinary": "ok"}, probe
    assert probe["write_outside"] != "ok" and probe["write_git_config"] != "ok"
    assert probe["connect"] != "ok"
    assert not (ws.parent / "outside.txt").exists()
    assert (ws / ".git" / "config").read_text() == "[core]\n"
    assert (ws / "src" / "new.txt").read_text() == "made"
    assert cat.result is not None
    assert SECRET not in json.dumps(cat.result) and "cat=0" not in text_of(cat.result)
    assert (ws / ".env").read_text() == SECRET  # outside the sandbox it is there


@needs_bwrap
def test_what_a_program_needs_from_tmp_is_visible_read_only_and_nothing_else(
        tmp_path: Path, ws: Path) -> None:
    # A checkout or a venv in /tmp (CI often has one) must still run: the program, the
    # modules beside a script it is given, and the running Python are bound in read-only.
    # The rest of the private /tmp stays hidden, and none of it is writable.
    import subprocess
    import sys

    from handrail.sandbox import wrap

    code = tmp_path / "code"
    code.mkdir()
    (code / "helper.py").write_text("WORD = 'imported'\n")
    (code / "main.py").write_text(
        "import os, sys\nimport helper\nprint(helper.WORD)\n"
        "print('secret visible' if os.path.exists(sys.argv[1]) else 'secret hidden')\n"
        "try:\n    open(os.path.join(os.path.dirname(__file__), 'new.txt'), 'w')\n"
        "    print('wrote beside the script')\n"
        "except OSError:\n    print('read-only')\n")
    other = tmp_path / "other"
    other.mkdir()
    secret = other / "secret.txt"
    secret.write_text("must not be seen")
    argv, record = wrap([sys.executable, str(code / "main.py"), str(secret)],
                        policy=hr.Policy.default(), workspace=ws, mode="required")
    assert record["mechanism"] == "bwrap"
    done = subprocess.run(argv, cwd=ws, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # `secret` is an argument too, so its folder would be bound: name it by a path that
    # is not an argument to check the rest of /tmp stays hidden.
    assert done.stdout.splitlines()[0] == "imported"
    assert done.stdout.splitlines()[2] == "read-only"
    # Wrapped with an argument that binds nothing, then pointed at the secret.
    unbound, _ = wrap([sys.executable, str(code / "main.py"), "/nowhere"],
                      policy=hr.Policy.default(), workspace=ws, mode="required")
    hidden = subprocess.run([*unbound[:-1], str(secret)], cwd=ws, capture_output=True,
                            text=True, timeout=60)
    assert hidden.returncode == 0, hidden.stderr
    assert hidden.stdout.splitlines()[1] == "secret hidden"
    assert not (code / "new.txt").exists()


def test_a_script_beside_the_workspace_runs_and_its_neighbours_stay_hidden(
        tmp_path: Path, ws: Path) -> None:
    # `tmp/server.py` next to the workspace `tmp/ws` (an MCP server a manifest starts, say):
    # the folder holding both cannot be bound (it would show everything beside the
    # workspace), so the script alone is, read-only.
    import subprocess
    import sys

    from handrail.sandbox import wrap

    script = tmp_path / "server.py"
    script.write_text(
        "import os, sys\nprint('ran')\n"
        "print('neighbour visible' if os.path.exists(sys.argv[1]) else 'neighbour hidden')\n")
    neighbour = tmp_path / "neighbour.txt"
    neighbour.write_text("must not be seen")
    argv, record = wrap([sys.executable, str(script), "/nowhere"],
                        policy=hr.Policy.default(), workspace=ws, mode="required")
    assert record["mechanism"] == "bwrap"
    done = subprocess.run([*argv[:-1], str(neighbour)], cwd=ws, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ran", "neighbour hidden"]
