"""mcp-server-git (PyPI) behind `handrail serve`: a `git_commit` asks, is approved from another
process, and lands exactly once; reads pass without asking."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp_servers import Served, python_bin, serve, text

pytestmark = pytest.mark.anyio

MANIFEST = """
[[tools]]
ref = "git/git_status"
description = "Show the working tree status."
mutates = false

[[tools]]
ref = "git/git_commit"
description = "Record the staged changes as a commit."

[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{server} --repository {repo}"]

[[servers]]
name = "git"
names = "prefixed"            # shown as models see them (issue 36: default upstream)
command = "{server}"
args = ["--repository", "{repo}"]

[servers.actions]
git_commit = [{{ act = "write", argument = "repo_path" }}]
git_status = [{{ act = "read", argument = "repo_path" }}]
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    repo = tmp_path_factory.mktemp("repo").resolve()
    git(repo, "init", "-q", ".")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "Test")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "initial")
    (repo / "b.txt").write_text("b\n")
    git(repo, "add", "b.txt")
    manifest = MANIFEST.format(server=python_bin("mcp-server-git"), repo=repo)
    # Unconfined: git reads .git/config, which the default policy hides from programs as a
    # secret (docs/sandbox.md); this test is about the gateway, not the sandbox.
    async with serve(repo, "--workspace", str(repo), "--approval-timeout", "60",
                     "--sandbox", "off", manifest=manifest) as s:
        yield s


async def test_status_is_read_without_asking(served: Served) -> None:
    tools = {t.name for t in (await served.session.list_tools()).tools}
    assert tools == {"git--git_status", "git--git_commit"}  # only the grants
    result = await served.call("git--git_status", {"repo_path": str(served.root)})
    assert not result.is_error and "b.txt" in text(result)


async def test_a_commit_asks_is_approved_elsewhere_and_lands_once(served: Served) -> None:
    repo = served.root
    before = git(repo, "rev-list", "--count", "HEAD").strip()
    box: list[object] = []
    async with anyio.create_task_group() as tg:

        async def client() -> None:
            box.append(await served.call("git--git_commit",
                                         {"repo_path": str(repo), "message": "add b"}))

        tg.start_soon(client)
        item = await served.wait_pending("git/git_commit", set())
        assert item.payload["act"] == "write"
        assert git(repo, "rev-list", "--count", "HEAD").strip() == before  # not yet
        await served.cli("approve", item.id)
    [result] = box
    assert not text(result).startswith("awaiting"), text(result)
    assert git(repo, "log", "-1", "--format=%s").strip() == "add b"
    assert int(git(repo, "rev-list", "--count", "HEAD")) == int(before) + 1


async def test_a_commit_outside_the_workspace_is_refused(served: Served) -> None:
    result = await served.call("git--git_commit", {"repo_path": "/", "message": "x"})
    assert result.is_error
    assert "not permitted" in text(result)
