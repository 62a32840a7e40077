"""hr.ReadPath / hr.WritePath / hr.ExecArgv / hr.Url: the gate derives what a call touches.

The story (issue 10 §1): `@hr.tool(mutates=False) async def read_note(path: str)` under a
policy denying READ of `secrets/**` returned `secrets/key.txt`, because without `actions=` the
policy saw only `call local/read_note`. Typed path arguments make the safe thing the easy one.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply
from handrail.tools import unguarded_path_arguments

pytestmark = pytest.mark.anyio

RECEIVED: list[Any] = []


@hr.tool(server="notes", mutates=False)
async def read_note(path: hr.ReadPath) -> str:
    """Read a note."""
    RECEIVED.append(path)
    return path.read_text()


@pytest.fixture(autouse=True)
def _clear() -> None:
    RECEIVED.clear()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "secrets").mkdir(parents=True)
    (ws / "secrets" / "key.txt").write_text("SECRET-KEY\n")
    (ws / "notes").mkdir()
    (ws / "notes" / "a.txt").write_text("a note\n")
    return ws


async def run_one(workspace: Path, tool_id: str, arguments: dict[str, Any], tools: Any,
                  policy: hr.Policy) -> tuple[ToolResultMessage, hr.CallRecord]:
    seen: list[ToolResultMessage] = []

    def answer(messages: Sequence[Any], offered: Sequence[Any]) -> Turn:
        seen.extend(m for m in messages if isinstance(m, ToolResultMessage))
        return reply("done")

    store = hr.Store.memory()
    agent = hr.Agent(Scripted([call(tool_id, arguments), answer]), tools, policy=policy,
                     workspace=workspace)
    with anyio.fail_after(30):
        result = await agent.run("go", store=store)
    assert isinstance(result.outcome, hr.Completed)
    (record,) = await store.calls(result.run_id)
    return seen[0], record


def text(message: ToolResultMessage) -> str:
    return "".join(getattr(c, "text", "") for c in message.result.content)


async def test_a_read_path_argument_is_seen_by_the_policy(workspace: Path) -> None:
    policy = hr.Policy.default().layer("x").deny(hr.Act.READ, "secrets/**")
    seen, record = await run_one(workspace, "notes/read_note", {"path": "secrets/key.txt"},
                                 [read_note], policy)
    assert seen.result.is_error
    assert "SECRET" not in text(seen)
    assert RECEIVED == []
    assert record.status is hr.CallStatus.REFUSED
    # A call with several actions records each path's decided form beside it (what-if
    # replays that, never today's disk).
    assert {"act": "read", "target": "secrets/key.txt", "canonical": "secrets/key.txt"} in (
        record.actions or [])


async def test_a_spelling_that_leads_to_the_denied_file_is_denied_too(workspace: Path) -> None:
    (workspace / "notes" / "link").symlink_to("../secrets")
    policy = hr.Policy.default().layer("x").deny(hr.Act.READ, "secrets/**")
    for spelling in ("notes/../secrets/key.txt", "notes/link/key.txt", "./secrets//key.txt",
                     str(workspace / "secrets" / "key.txt")):
        seen, _ = await run_one(workspace, "notes/read_note", {"path": spelling},
                                [read_note], policy)
        assert seen.result.is_error and "SECRET" not in text(seen), spelling
    assert RECEIVED == []


async def test_the_body_receives_the_canonical_path_inside_the_workspace(
    workspace: Path,
) -> None:
    real = os.path.realpath(workspace)  # noqa: ASYNC240 - test setup
    seen, record = await run_one(workspace, "notes/read_note",
                                 {"path": "notes/../notes//a.txt"}, [read_note],
                                 hr.Policy.default())
    assert text(seen) == "a note\n"
    assert RECEIVED == [Path(real, "notes", "a.txt")]
    # The policy saw the READ (and the tool's own CALL): nothing it touches is hidden.
    assert record.verdict is not None and record.verdict["effect"] == "allow"


async def test_a_path_outside_the_workspace_never_reaches_the_body(
    workspace: Path, tmp_path: Path,
) -> None:
    (tmp_path / "outside.txt").write_text("OUT\n")
    seen, _ = await run_one(workspace, "notes/read_note", {"path": "../outside.txt"},
                            [read_note], hr.Policy.permissive())
    assert seen.result.is_error and "OUT" not in text(seen)
    assert RECEIVED == []


def test_the_schema_is_a_string_and_an_argv_an_array() -> None:
    @hr.tool(server="t")
    async def run(argv: hr.ExecArgv, out: hr.WritePath, url: hr.Url) -> None:
        """Run."""

    props = run.spec.input_schema["properties"]
    assert props["out"] == {"type": "string"}
    assert props["url"] == {"type": "string"}
    assert props["argv"]["type"] == "array" and props["argv"]["items"] == {"type": "string"}


def test_each_kind_derives_its_action() -> None:
    @hr.tool(server="t")
    async def run(argv: hr.ExecArgv, out: hr.WritePath, url: hr.Url, src: hr.ReadPath) -> None:
        """Run."""

    validated = run.validate({"argv": ["git", "status"], "out": "o.txt", "src": "i.txt",
                              "url": "https://Example.com/x?y=1"})
    assert run.actions(validated) == [
        hr.Action(hr.Act.CALL, "t/run"),
        hr.Action(hr.Act.EXEC, ("git", "status")),
        hr.Action(hr.Act.WRITE, "o.txt"),
        hr.Action(hr.Act.NET, "example.com:443"),
        hr.Action(hr.Act.READ, "i.txt"),
    ]


class Job(BaseModel):
    inputs: list[hr.ReadPath]
    output: hr.WritePath | None = None


def test_markers_are_found_in_lists_optionals_and_nested_models() -> None:
    @hr.tool(server="t")
    async def build(jobs: list[Job]) -> None:
        """Build."""

    validated = build.validate({"jobs": [{"inputs": ["a", "b"], "output": "c"},
                                         {"inputs": []}]})
    acts = [(a.act, a.target) for a in build.actions(validated)]
    assert acts[1:] == [(hr.Act.READ, "a"), (hr.Act.READ, "b"), (hr.Act.WRITE, "c")]
    bound = build.bind(validated, "/")
    assert bound.jobs[0].inputs == [Path("/a"), Path("/b")]  # type: ignore[attr-defined]


def test_declared_actions_are_not_repeated() -> None:
    class Put(hr.Tool, server="t"):
        path: hr.WritePath

        def actions(self) -> list[hr.Action]:
            return [hr.Action(hr.Act.WRITE, os.fspath(self.path), content=b"x")]

        async def run(self, ctx: hr.CallContext) -> None:
            return None

    impl = hr.Toolbox([Put]).by_model_name("t_put") or hr.tools.as_impl(Put)
    assert impl.actions(impl.validate({"path": "f"})) == [
        hr.Action(hr.Act.WRITE, "f", content=b"x")]


def test_an_empty_or_nul_path_is_invalid() -> None:
    for bad in ("", "a\x00b", 5):
        with pytest.raises(hr.InvalidArguments):
            read_note.validate({"path": bad})


def test_a_union_of_two_kinds_is_refused_at_definition() -> None:
    with pytest.raises(hr.UserError, match="union"):
        @hr.tool(server="t")
        async def either(target: hr.ReadPath | hr.Url) -> None:
            """Either."""


# --- arguments named like a path that the policy cannot see (issue 10 §1) -----------------


def test_a_plain_string_path_argument_warns_when_the_tool_is_defined() -> None:
    with pytest.warns(hr.UnguardedArgumentWarning, match=r"'t/read_plain'.*'path'.*hr\.ReadPath"):
        @hr.tool(server="t", mutates=False)
        async def read_plain(path: str, count: int = 1) -> str:
            """Read."""
            return path

    assert unguarded_path_arguments(read_plain) == ["path"]


@pytest.mark.parametrize("name", ["path", "file", "filename", "dir", "directory", "src", "dst",
                                  "url", "cmd", "argv", "command"])
def test_every_path_like_name_is_reported(name: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"async def f({name}: str) -> None:\n    '''F.'''\n", namespace)
    with pytest.warns(hr.UnguardedArgumentWarning):
        tool = hr.tool(server="t", name="f")(namespace["f"])
    assert unguarded_path_arguments(tool) == [name]


def test_typed_or_declared_arguments_are_not_reported() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @hr.tool(server="t")
        async def typed(path: hr.ReadPath, cmd: hr.ExecArgv, url: hr.Url) -> None:
            """Typed."""

        @hr.tool(server="t", actions=lambda path: [hr.Action(hr.Act.READ, path)])
        async def declared(path: str) -> None:
            """Declared."""

        class Declared(hr.Tool, server="t"):
            path: str

            def actions(self) -> list[hr.Action]:
                return [hr.Action(hr.Act.READ, self.path)]

            async def run(self, ctx: hr.CallContext) -> None:
                return None

        @hr.tool(server="t")
        async def count(paths: int) -> None:
            """Not a path."""

    for tool in (typed, declared, Declared, count):
        assert unguarded_path_arguments(tool) == []


STRICT_APP = '''
import warnings

import handrail as hr

with warnings.catch_warnings():
    warnings.simplefilter("ignore")

    @hr.tool(server="notes", mutates=False)
    def read_note(path: str) -> str:
        """Read a note."""
        return path


@hr.tool(server="notes", mutates=False)
def read_typed(path: hr.ReadPath) -> str:
    """Read a note, seen by the policy."""
    return str(path)


box = hr.Toolbox([read_note, read_typed])
'''


def test_manifest_check_strict_fails_on_an_unguarded_path_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from handrail.cli import main

    name = f"strict_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(STRICT_APP, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    try:
        assert main(["manifest", "init", f"{name}:box"]) == 0
        assert main(["manifest", "check", f"{name}:box"]) == 0
        capsys.readouterr()
        assert main(["manifest", "check", f"{name}:box", "--strict"]) == 1
        out = capsys.readouterr().out
        assert "tool 'notes/read_note'" in out and "'path'" in out and "hr.ReadPath" in out
        assert "notes/read_typed" not in out
    finally:
        sys.modules.pop(name, None)


async def test_without_a_workspace_a_path_argument_is_a_user_error() -> None:
    with pytest.raises(hr.UserError, match="needs an agent workspace"):
        await hr.Toolbox([read_note]).call("notes/read_note", {"path": "a.txt"})
    assert RECEIVED == []


async def test_a_handler_with_a_workspace_binds_and_confines(workspace: Path) -> None:
    handler = hr.Toolbox([read_note]).handler("notes/read_note", workspace=workspace)
    out = await handler.step(hr.Invoke("c", {"path": "notes/a.txt"}))
    assert isinstance(out, hr.Finished) and out.result.structured == "a note\n"
    handler = hr.Toolbox([read_note]).handler("notes/read_note", workspace=workspace)
    with pytest.raises(hr.PathChanged, match="outside the workspace") as caught:
        await handler.step(hr.Invoke("c", {"path": "../../etc/passwd"}))
    assert caught.value.disposition is hr.Disposition.NOT_SENT
