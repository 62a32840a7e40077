"""Issue 32: one gate at every door. Each door × each piece of a run's governance.

The doors: a run in this process; a resume in another process; `handrail approve`; the
inbox's decision; `handrail worker` on PostgreSQL; `handrail serve` over stdio and over HTTP;
a sub-agent at depth 1 and at depth 2. The pieces (`governed.py`): a deny rule, a control's
refusal, `sandbox="required"` where bubblewrap is unusable, the workspace, an ungranted tool,
`taint = "deny"`. Every cell makes the attempt through its door and checks, from the store
and the files, that the piece held.

A door that continues a run does so from ANOTHER folder (`elsewhere`, the process's working
directory) with the agent as that process rebuilds it (`governed.rebuild`: its own folder,
sandbox "auto", a permissive policy): it must carry the run's recorded governance whole.
The subprocess cells are `slow`; they run in the default suite. A process that only runs and
ends (a resume, `handrail approve`) is a fork of the suite's fork server (tests/tools/forks.py:
a process of its own, handrail already imported); servers and workers are started anew.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import forks
import governed
import pytest
from http_serving import serving_http, token_of

import handrail as hr
from handrail.tools import ToolId

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
HANDRAIL = [sys.executable, "-m", "handrail.cli"]


@dataclass
class Place:
    """Where a cell happens: the run's workspace, another folder, the store."""

    root: Path
    ws: Path
    """The workspace the run starts in (holds a `.env` with the secret)."""
    elsewhere: Path
    """The folder of the process that continues the run (or serves it)."""
    db: Path

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                   [str(HERE), os.environ.get("PYTHONPATH", "")]),
               "GOVERNED_WS": str(self.ws)}
        env.pop("HANDRAIL_STORE", None)
        env.pop("HANDRAIL_AGENT", None)
        return env


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Place:
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    ws.mkdir()
    elsewhere.mkdir()
    (ws / ".env").write_text(governed.SECRET)
    # A machine whose bubblewrap is unusable: the lookup names a file that does not exist
    # (this process and every one it starts).
    monkeypatch.setenv("HANDRAIL_BWRAP", str(tmp_path / "no-such-bwrap"))
    return Place(tmp_path, ws, elsewhere, tmp_path / "runs.db")


# ------------------------------------------------------------------ what must hold


def check(piece: str, calls: list[hr.CallRecord], place: Place) -> None:
    """That `piece` held: from the call records of every run, and the files."""
    tried = [c for c in calls if c.tool in {t for t, _ in governed.ATTEMPTS[piece]}]
    assert len(tried) == len(governed.ATTEMPTS[piece]), [(c.tool, c.status) for c in calls]
    folders = (place.ws, place.elsewhere, place.root)
    if piece == "deny":
        [write] = tried
        assert write.status is hr.CallStatus.REFUSED and write.verdict is not None
        assert write.verdict["effect"] == "deny", write.verdict
        assert not any((f / "blocked.txt").exists() for f in folders)
    elif piece == "control":
        [write] = tried
        assert write.status is hr.CallStatus.REFUSED and write.verdict is not None
        assert write.verdict.get("control", {}).get("decision") == "refuse", write.verdict
        assert not any((f / "controlled.txt").exists() for f in folders)
    elif piece == "sandbox":
        [program] = tried
        assert governed.SECRET not in json.dumps(program.result), program.result
        assert program.result is not None and program.result["is_error"], program.result
        assert "sandbox='required'" in json.dumps(program.result)
    elif piece == "workspace":
        note, escape = tried
        assert note.status is hr.CallStatus.FINISHED, note.error
        assert (place.ws / "note.txt").read_text() == "here"
        assert not (place.elsewhere / "note.txt").exists()
        assert escape.status is hr.CallStatus.REFUSED
        assert not any((f / "escape.txt").exists() for f in (*folders, place.root.parent))
    elif piece == "ungranted":
        [launch] = tried
        assert launch.status is hr.CallStatus.REFUSED
        assert launch.error is not None and "not granted" in launch.error
        assert not any((f / "launched.txt").exists() for f in folders)
    elif piece == "taint":
        read, send = tried
        assert read.status is hr.CallStatus.FINISHED
        assert send.status is hr.CallStatus.REFUSED and send.verdict is not None
        assert send.verdict["effect"] == "deny", send.verdict  # deny, not an ask
        assert not any((f / "sent.txt").exists() for f in folders)
    else:  # pragma: no cover
        raise AssertionError(piece)


async def all_calls(store: hr.Store) -> list[hr.CallRecord]:
    """The calls of every run in the store (a tree's runs included), oldest run first."""
    runs = sorted(await store.runs(limit=100), key=lambda r: (r.depth, r.created_at))
    return [c for r in runs for c in await store.calls(r.id)]


async def finished(store: hr.Store, run_id: str) -> hr.RunRecord:
    """The run once it has completed (or failed): read until then."""
    with anyio.fail_after(120):
        while True:
            run = await store.run(run_id)
            if run.status in (hr.RunStatus.COMPLETED, hr.RunStatus.FAILED):
                return run
            await anyio.sleep(0.05)


# ------------------------------------------------------------------ the doors


async def start(piece: str, place: Place, store: hr.Store) -> hr.PendingItem:
    """A run of the piece's original agent, paused at its first call (the ping)."""
    result = await governed.original(piece, place.ws).run(governed.TASK + piece, store=store)
    assert isinstance(result.outcome, hr.AwaitingApproval), result.outcome
    return await store.pending_item(result.outcome.request_id)


async def completed(store: hr.Store, run_id: str) -> list[hr.CallRecord]:
    run = await finished(store, run_id)
    assert run.status is hr.RunStatus.COMPLETED, run.outcome
    return await all_calls(store)


async def in_process(piece: str, place: Place) -> list[hr.CallRecord]:
    async with hr.Store.open(place.db) as store:
        result = await governed.original(piece, place.ws, pause=False).run(
            governed.TASK + piece, store=store)
        assert result.outcome == hr.Completed("done"), result.outcome
        return await all_calls(store)


async def another_process(piece: str, place: Place) -> list[hr.CallRecord]:
    async with hr.Store.open(place.db) as store:
        item = await start(piece, place, store)
    done = await anyio.to_thread.run_sync(lambda: forks.shared().run_code(
        "import sys, governed; governed.cli(sys.argv[1:])", [str(place.db), "resume", item.id],
        cwd=place.elsewhere, env=place.env()))
    assert done.returncode == 0, done.stderr
    async with hr.Store.open(place.db) as store:
        return await completed(store, item.run_id)


async def cli_approve(piece: str, place: Place) -> list[hr.CallRecord]:
    async with hr.Store.open(place.db) as store:
        item = await start(piece, place, store)
    # The global --store, before the command: the same option as after it.
    done = await anyio.to_thread.run_sync(lambda: forks.shared().run_module(
        "handrail.cli", ["--store", str(place.db), "approve", item.id], cwd=place.elsewhere,
        env=place.env()))
    assert done.returncode == 0, done.stderr
    async with hr.Store.open(place.db) as store:
        return await completed(store, item.run_id)


async def inbox_decide(piece: str, place: Place, monkeypatch: pytest.MonkeyPatch
                       ) -> list[hr.CallRecord]:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from handrail.web import create_app

    async with hr.Store.open(place.db) as store:
        item = await start(piece, place, store)
    monkeypatch.chdir(place.elsewhere)  # the inbox's process runs elsewhere

    def decide() -> None:
        store = hr.Store.open(place.db)
        app = create_app(store, agent_for=governed.rebuild, login_tokens=("t" * 24,),
                         default_user="alice", resume_runs=True)
        with TestClient(app, base_url="http://127.0.0.1:8765") as client:
            login = client.post("/login", data={"token": "t" * 24, "user": "alice"},
                                follow_redirects=False)
            assert login.status_code == 303, login.text
            csrf = re.search(r'data-csrf="([^"]+)"', client.get("/").text)
            assert csrf is not None
            answer = client.post(f"/items/{item.id}/approve", data={"csrf": csrf.group(1)},
                                 follow_redirects=False)
            assert answer.status_code in (200, 303), answer.text
            # The inbox continues the run in the background: wait for its end, app alive.
            anyio.run(lambda: _wait_finished(place.db, item.run_id))

    await anyio.to_thread.run_sync(decide)
    async with hr.Store.open(place.db) as store:
        return await completed(store, item.run_id)


async def _wait_finished(db: Path, run_id: str) -> None:
    async with hr.Store.open(db) as store:
        await finished(store, run_id)


async def worker_postgres(piece: str, place: Place, url: str) -> list[hr.CallRecord]:
    store = hr.Store.open(url)
    try:
        item = await start(piece, place, store)
    finally:
        await store.close()
    env = place.env()
    decided = await anyio.to_thread.run_sync(lambda: forks.shared().run_module(
        "handrail.cli", ["approve", item.id, "--no-resume", "--store", url],
        cwd=place.elsewhere, env=env))
    assert decided.returncode == 0, decided.stderr
    log = place.root / "worker.log"
    # A test's own process, started and ended here (its output to a file nobody blocks on).
    with open(log, "wb") as out:  # noqa: ASYNC230
        worker = subprocess.Popen(  # noqa: ASYNC220
            [*HANDRAIL, "--store", url, "worker", "--poll", "0.5"], cwd=place.elsewhere,
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        store = hr.Store.open(url)
        try:
            return await completed(store, item.run_id)
        finally:
            await store.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        started = json.loads(log.read_text().splitlines()[0])
        assert started["event"] == "worker_started" and "store" in started, started


# -- serve


def _serve_argv(piece: str, place: Place) -> list[str]:
    argv = [*HANDRAIL, "--store", str(place.db), "serve"]
    if piece == "ungranted":  # a toolbox whose tool the manifest does not grant
        (place.elsewhere / "handrail.toml").write_text(_manifest_text())
        return [*argv, "governed:ungranted_box"]
    argv.append(f"governed:served_{piece}")
    if piece == "sandbox":
        argv += ["--sandbox", "auto"]  # weaker than the agent's "required": the agent wins
    return argv


def _manifest_text() -> str:
    return "".join(f'[[tools]]\nref = "{ref}"\ndescription = "The tool {ref}."\n\n'
                   for ref in governed.TOOL_IDS)


async def _client_calls(session: Any, piece: str) -> None:
    await session.initialize()
    for tool, arguments in governed.ATTEMPTS[piece]:
        await session.call_tool(ToolId.parse(tool).model_name, arguments)


async def _served_calls(place: Place) -> list[hr.CallRecord]:
    async with hr.Store.open(place.db) as store:
        return await all_calls(store)


async def _refused_to_start(argv: list[str], place: Place) -> None:
    done = await anyio.run_process([*argv, "--stdio"], cwd=place.elsewhere, env=place.env(),
                                   check=False, stdin=subprocess.DEVNULL)
    said = done.stderr.decode()
    assert done.returncode != 0 and "host/launch" in said and "not granted" in said, said
    assert not (place.ws / "launched.txt").exists()


async def serve_stdio(piece: str, place: Place) -> list[hr.CallRecord] | None:
    from mcp.client.stdio import stdio_client

    from mcp import ClientSession, StdioServerParameters

    argv = _serve_argv(piece, place)
    if piece == "ungranted":
        await _refused_to_start(argv, place)
        return None
    params = StdioServerParameters(command=argv[0], args=[*argv[1:], "--stdio"],
                                   env=place.env(), cwd=str(place.elsewhere))
    with open(place.root / "serve.stderr", "w") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await _client_calls(session, piece)
    said = (place.root / "serve.stderr").read_text()
    assert f"store {place.db}" in said, said  # it says which store, at start
    return await _served_calls(place)


@contextlib.asynccontextmanager
async def _http_server(argv: list[str], place: Place) -> AsyncIterator[tuple[str, str]]:
    async with serving_http([*argv, "--http", "127.0.0.1:0"], cwd=place.elsewhere,
                            env=place.env()) as (url, said):
        assert f"store {place.db}" in said, said
        yield url, await token_of(said)


async def serve_http(piece: str, place: Place) -> list[hr.CallRecord] | None:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from mcp import ClientSession

    argv = _serve_argv(piece, place)
    if piece == "ungranted":
        await _refused_to_start(argv, place)
        return None
    async with _http_server(argv, place) as (url, token):
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as c, \
                streamable_http_client(url, http_client=c) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await _client_calls(session, piece)
    return await _served_calls(place)


async def sub_agent(piece: str, place: Place, depth: int,
                    monkeypatch: pytest.MonkeyPatch) -> list[hr.CallRecord]:
    monkeypatch.chdir(place.elsewhere)
    async with hr.Store.open(place.db) as store:
        result = await governed.tree(piece, place.ws, depth).run(governed.TASK + piece,
                                                                 store=store)
        assert result.outcome == hr.Completed("done"), result.outcome
        runs = await store.runs()
        assert sorted(r.depth for r in runs) == list(range(depth + 1))
        return await all_calls(store)


# ------------------------------------------------------------------ the matrix


FAST_DOORS = ("in_process", "inbox_decide", "sub_agent_1", "sub_agent_2")
SLOW_DOORS = ("another_process", "cli_approve", "worker_postgres", "serve_stdio",
              "serve_http")


def _cells() -> list[Any]:
    cells = []
    for door in (*FAST_DOORS, *SLOW_DOORS):
        marks = [pytest.mark.slow, pytest.mark.timeout(300)] if door in SLOW_DOORS else []
        cells.extend(pytest.param(door, piece, id=f"{door}-{piece}", marks=marks)
                     for piece in governed.PIECES)
    return cells


@pytest.mark.parametrize(("door", "piece"), _cells())
async def test_every_door_carries_every_piece(door: str, piece: str, place: Place,
                                               monkeypatch: pytest.MonkeyPatch,
                                               request: pytest.FixtureRequest) -> None:
    drive: dict[str, Callable[[], Awaitable[list[hr.CallRecord] | None]]] = {
        "in_process": lambda: in_process(piece, place),
        "another_process": lambda: another_process(piece, place),
        "cli_approve": lambda: cli_approve(piece, place),
        "inbox_decide": lambda: inbox_decide(piece, place, monkeypatch),
        "worker_postgres": lambda: worker_postgres(piece, place,
                                                   request.getfixturevalue("pg_url")),
        "serve_stdio": lambda: serve_stdio(piece, place),
        "serve_http": lambda: serve_http(piece, place),
        "sub_agent_1": lambda: sub_agent(piece, place, 1, monkeypatch),
        "sub_agent_2": lambda: sub_agent(piece, place, 2, monkeypatch),
    }
    calls = await drive[door]()
    if calls is not None:  # None: the door refused to start, and said why (checked)
        check(piece, calls, place)
