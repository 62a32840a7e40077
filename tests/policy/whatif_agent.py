"""A realistic agent the what-if tests record: reads, writes, exec, net, an MCP tool, a sub-agent.

`record(store, ...)` runs it several times against a store, under `CURRENT` and an approver
that approves some asks and denies others, so the record holds every outcome: allowed,
approved, denied by a person, refused by the policy (a deny rule, the secrets layer, the NET
default), a sub-agent's calls under their agent path.
"""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.models import Scripted, Turn, calls, reply

FIXTURE_SERVER = Path(__file__).resolve().parents[1] / "mcp" / "fixture_server.py"

class Copy(hr.Tool, server="repo", name="copy"):
    """Copy a workspace file: a tool touching two paths (its call has two actions)."""

    source: str
    """The file read."""
    target: str
    """The file written."""

    def actions(self) -> list[hr.Action]:
        """Reads one path, writes another."""
        return [hr.Action(hr.Act.READ, self.source), hr.Action(hr.Act.WRITE, self.target)]

    def run(self, ctx: hr.CallContext) -> str:
        """Copy (a sync body: the tool layer runs it in a worker thread)."""
        root = Path(ctx.workspace or ".")
        (root / self.target).write_bytes((root / self.source).read_bytes())
        return f"copied {self.source} to {self.target}"


CURRENT = (hr.Policy.default().layer("app")
           .deny(hr.Act.WRITE, "src/generated/**")
           .allow(hr.Act.WRITE, "notes/**")
           .allow(hr.Act.CALL, "agents/**")
           .allow(hr.Act.CALL, "fx/echo"))
"""The policy the agent ran under (plus NET to the local server, added per port)."""


def current(port: int) -> hr.Policy:
    """`CURRENT` allowing the local HTTP server."""
    return CURRENT.allow(hr.Act.NET, f"127.0.0.1:{port}")


def workspace(root: Path) -> Path:
    """A small project: sources, docs, a secret, and a link the tests re-point later."""
    ws = root / "ws"
    for rel, text in {"README.md": "# demo\n", "src/app.py": "print('v0')\n",
                      "src/util.py": "X = 1\n", "docs/plan.md": "plan\n",
                      ".env": "TOKEN=secret\n", "notes/real.md": "real\n",
                      "docs/other.md": "other\n"}.items():
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (ws / "alias.md").symlink_to(ws / "notes" / "real.md")
    return ws


def turns(i: int, port: int) -> list[Turn]:
    """One run's scripted turns (every run does the same kinds of calls)."""
    return [
        calls([("workspace/read_file", {"path": "src/app.py"}),
               ("workspace/list_dir", {"path": "."}),
               ("workspace/read_file", {"path": "README.md"}),
               ("workspace/read_file", {"path": "alias.md"})]),
        calls([("workspace/write_file", {"path": f"notes/n{i}.md", "content": f"note {i}\n"}),
               ("workspace/write_file", {"path": "src/app.py", "content": f"print('v{i}')\n"}),
               ("workspace/write_file", {"path": "src/generated/out.py", "content": "x\n"}),
               ("workspace/write_file", {"path": "docs/plan.md", "content": "new plan\n"})]),
        calls([("workspace/read_file", {"path": ".env"}),
               ("workspace/exec", {"argv": ["echo", f"hi {i}"]}),
               ("workspace/exec", {"argv": ["ls", "-a"]})]),
        calls([("workspace/fetch", {"url": f"http://127.0.0.1:{port}/status"}),
               ("workspace/fetch", {"url": "https://example.com/"}),
               ("fx/echo", {"text": f"t{i}"}),
               ("agents/helper", {"task": "tidy the tests"})]),
        calls([("repo/copy", {"source": "src/app.py", "target": "src/app_copy.py"}),
               ("repo/copy", {"source": "README.md", "target": "docs/README.md"}),
               ("workspace/write_file", {"path": "src/models.py", "content": "M = 1\n"}),
               ("workspace/edit_file", {"path": "src/util.py", "old": "X = 1", "new": "X = 1"}),
               ("workspace/write_file", {"path": "src/views.py", "content": "V = 1\n"})]),
        reply("done"),
    ]


def helper_turns() -> list[Turn]:
    """The sub-agent's turns."""
    return [calls([("workspace/read_file", {"path": "src/util.py"}),
                   ("workspace/write_file", {"path": "tests/test_util.py",
                                             "content": "def test(): pass\n"})]),
            reply("tidied")]


def agent(ws: Path, i: int, port: int, mcp: Any, policy: hr.Policy) -> hr.Agent:
    """The agent of run `i`: fresh scripted models (a run consumes its script)."""
    helper = hr.Agent(Scripted(helper_turns()), workspace_tools(), name="helper",
                      workspace=ws, sandbox="off")
    tools = [*workspace_tools(), helper.as_tool(), Copy]
    return hr.Agent(Scripted(turns(i, port)), [hr.Toolbox(tools), mcp], name="coder",
                    policy=policy, workspace=ws, sandbox="off")


def approve(request: hr.Request) -> hr.Decision:
    """A person: approves sources, tests and `echo`; denies docs and `ls`."""
    target = request.target
    if request.act is hr.Act.WRITE:
        if target.startswith(("src/", "tests/")):
            return hr.Decision.approve()
        return hr.Decision.deny("not the docs")
    if request.act is hr.Act.EXEC:
        if target.startswith("/usr/bin/echo") or target.startswith("/bin/echo"):
            return hr.Decision.approve()
        return hr.Decision.deny("no listing")
    return hr.Decision.deny("no")


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def http_server() -> Iterator[int]:
    """A local HTTP server on a free port (its port), stopped at the end."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def mcp_argv(marker: Path) -> Sequence[str]:
    """The fixture MCP server's command line."""
    return (sys.executable, str(FIXTURE_SERVER), str(marker))


async def record(store: hr.Store, ws: Path, port: int, mcp: Any, *, runs: int,
                 policy: hr.Policy | None = None,
                 approver: hr.Approver | None = None) -> list[hr.RunResult]:
    """Run the agent `runs` times against `store`; the results."""
    out = []
    for i in range(runs):
        a = agent(ws, i, port, mcp, policy or current(port))
        out.append(await a.run(f"task {i}", store=store,
                               approver=approver or hr.CallbackApprover(approve)))
    return out
