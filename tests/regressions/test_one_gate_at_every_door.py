"""Issue 32: each door assembled its own partial gate and silently dropped a piece.

The promise is that every tool call passes the same gate. Tried as a careful user and as an
attacker would, it held for `Agent.run` in one process, but each door added since assembled
its own gate: `handrail serve` never asked the manifest's pinned `[control]` (a control that
refuses everything was never started, the call ran), ran a served agent's programs under
sandbox "auto" whatever the agent said, and confined paths to the folder it was started in;
a sub-agent's calls never met the root's control, a child at sandbox "auto" under a root at
"required" read `.env`, and a child's tool the root's manifest does not grant ran, no drift
reported; a run decided from another folder continued there (`handrail approve` in folder B
overwrote B/config.yml while the person had been shown a diff against A/config.yml); and
`handrail --store X serve` (and `inbox`, `worker`) ignored the global `--store`.

Now a run's governance is one value (`handrail.gate.Governance`), derived once when the run
starts, recorded with it, and carried by every door. The matrix of every door against every
piece is `tests/doors/test_doors.py`; here, each bullet of the issue as it was seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import handrail as hr
from handrail.builtin import WriteFile
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

HANDRAIL = [sys.executable, "-m", "handrail.cli"]

REFUSER = "import sys, json; sys.stdin.readline(); " \
          "print(json.dumps({'decision': 'refuse', 'reason': 'refuses everything'}))"


def _path(where: Path) -> str:
    return os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")])


def _box_module(tmp_path: Path) -> None:
    (tmp_path / "served_box.py").write_text(
        "import handrail as hr\n"
        "from pathlib import Path\n\n"
        "@hr.tool(server='local', name='touch', mutates=False)\n"
        "def touch() -> str:\n"
        "    '''Leave a mark.'''\n"
        "    Path('touched').write_text('x')\n"
        "    return 'touched'\n\n"
        "box = hr.Toolbox([touch])\n")


@pytest.mark.slow
async def test_serve_asks_the_manifests_pinned_control(tmp_path: Path) -> None:
    from mcp.client.stdio import stdio_client

    from mcp import ClientSession, StdioServerParameters

    _box_module(tmp_path)
    (tmp_path / "handrail.toml").write_text(
        '[[tools]]\nref = "local/touch"\ndescription = "Leave a mark."\nmutates = false\n\n'
        f"[control]\ncommand = {json.dumps([sys.executable, '-c', REFUSER])}\n")
    env = {**os.environ, "PYTHONPATH": _path(tmp_path)}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "handrail.cli", "serve", "served_box:box",
                                      "--stdio", "--store", str(tmp_path / "runs.db")],
        env=env, cwd=str(tmp_path))
    with open(tmp_path / "serve.stderr", "w") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("touch", {})
    assert result.is_error
    assert "refuses everything" in result.content[0].text  # type: ignore[union-attr]
    assert not (tmp_path / "touched").exists()
    assert "control command" in (tmp_path / "serve.stderr").read_text()


def test_serve_refuses_a_workspace_flag_that_contradicts_the_agent(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "served_agent.py").write_text(
        "import handrail as hr\nfrom handrail.models import Scripted, reply\n"
        f"agent = hr.Agent(Scripted([reply('x')]), [], workspace={str(tmp_path / 'ws')!r})\n")
    done = subprocess.run([*HANDRAIL, "serve", "served_agent:agent", "--workspace", ".",
                           "--stdio", "--store", "memory"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": _path(tmp_path)})
    assert done.returncode == 1
    assert "the agent works in" in done.stderr and "--workspace" in done.stderr


def test_a_root_manifest_that_does_not_grant_a_childs_tool_is_drift(tmp_path: Path) -> None:
    child = hr.Agent(Scripted([reply("x")]), [WriteFile], workspace=tmp_path, name="kid")
    manifest = hr.Manifest.from_toml(
        '[[tools]]\nref = "agents/kid"\ndescription = "Delegate."\n')
    with pytest.raises(hr.ManifestDrift, match="workspace/write_file"):
        hr.Agent(Scripted([reply("x")]), [child.as_tool()], workspace=tmp_path,
                 manifest=manifest)
    # Granted, the tree builds, and `manifest check` reads the tree's tools (tools_of_tree).
    whole = hr.Manifest.from_toml(
        '[[tools]]\nref = "agents/kid"\ndescription = "Delegate."\n\n'
        '[[tools]]\nref = "workspace/write_file"\ndescription = "Write."\n')
    root = hr.Agent(Scripted([reply("x")]), [child.as_tool()], workspace=tmp_path,
                    manifest=whole)
    assert {str(i.spec.id) for i in root.tools_of_tree().impls()} == {
        "agents/kid", "workspace/write_file"}


async def test_a_resume_whose_recorded_workspace_is_gone_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = hr.Policy.default()  # a write asks: the run pauses
    agent = hr.Agent(Scripted([call("workspace/write_file", {"path": "a", "content": "x"}),
                               reply("done")]), [WriteFile], policy=policy, workspace=ws)
    store = hr.Store.memory()
    paused = await agent.run("write", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    ws.rename(tmp_path / "moved")
    other = hr.Agent(Scripted([reply("done")]), [WriteFile], policy=policy, workspace=tmp_path)
    with pytest.raises(hr.ResumeRefused, match="workspace"):
        await hr.resume_with_decision(store, paused.outcome.request_id,
                                      hr.Decision.approve(), agent=other)
    assert (await store.pending_item(paused.outcome.request_id)).state == "open"
    assert not (tmp_path / "a").exists()


async def test_a_run_decided_from_another_folder_writes_in_its_own(
        tmp_path: Path) -> None:
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    (a / "config.yml").write_text("old")
    (b / "config.yml").write_text("B's own")
    turns = [call("workspace/write_file", {"path": "config.yml", "content": "new"}),
             reply("done")]
    store = hr.Store.memory()
    paused = await hr.Agent(Scripted(turns), [WriteFile], workspace=a).run("edit", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(),
                                         agent=hr.Agent(Scripted(turns), [WriteFile],
                                                        workspace=b))
    assert done.outcome == hr.Completed("done")
    assert (a / "config.yml").read_text() == "new"
    assert (b / "config.yml").read_text() == "B's own"
    resumed = [e for e in (await store.run(done.run_id)).events if e["kind"] == "resumed"]
    assert resumed[-1]["governance"]["workspace"] == {"recorded": str(a), "agent": str(b)}


@pytest.mark.parametrize("command", ["serve", "inbox", "worker", "approve", "run"])
def test_the_global_store_is_the_subcommands_store(command: str) -> None:
    from handrail.cli import build_parser

    tail = {"approve": ["ap-1"], "run": ["m:a", "task"]}.get(command, [])
    before = build_parser().parse_args(["--store", "X.db", command, *tail])
    after = build_parser().parse_args([command, *tail, "--store", "Y.db"])
    assert before.store == "X.db" and after.store == "Y.db"


def _refuse_controlled(query: dict[str, object]) -> dict[str, str]:
    """A root's control: a write of controlled.txt is refused."""
    arguments = query["input"]
    if query["tool"] == "workspace/write_file" and isinstance(arguments, dict) and \
            arguments.get("path") == "controlled.txt":
        return {"decision": "refuse", "reason": "controlled"}
    return {"decision": "pass", "reason": ""}


@hr.tool(server="local", name="ping")
def _ping() -> str:
    """Mutating: the default policy asks."""
    return "pong"


def _tree(ws: Path, *, root_control: object) -> hr.Agent:
    allow = (hr.Policy.default().layer("app").allow(hr.Act.WRITE, "**")
             .allow(hr.Act.CALL, "agents/*"))
    kid = hr.Agent(Scripted([call("local/ping", {}),
                             call("workspace/write_file", {"path": "controlled.txt",
                                                           "content": "x"}),
                             reply("kid done")]),
                   [WriteFile, _ping], policy=allow, workspace=ws, name="kid")
    return hr.Agent(Scripted([call("agents/kid", {"task": "go"}), reply("done")]),
                    [kid.as_tool()], policy=allow, workspace=ws, name="root",
                    control=root_control)


async def test_a_resumed_tree_is_still_governed_by_its_root(tmp_path: Path) -> None:
    store = hr.Store.memory()
    paused = await _tree(tmp_path, root_control=_refuse_controlled).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    # Another process's tree without the root's control: refused, naming it, nothing decided.
    with pytest.raises(hr.ResumeRefused, match="tool control"):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=_tree(tmp_path, root_control=None))
    assert (await store.pending_item(paused.outcome.request_id)).state == "open"
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(),
                                         agent=_tree(tmp_path, root_control=_refuse_controlled))
    assert done.outcome == hr.Completed("done")
    assert not (tmp_path / "controlled.txt").exists()
    child = [r for r in await store.runs() if r.depth == 1]
    [write] = [c for c in await store.calls(child[0].id) if c.tool == "workspace/write_file"]
    assert write.status is hr.CallStatus.REFUSED and write.verdict is not None
    assert write.verdict["control"]["decision"] == "refuse"
