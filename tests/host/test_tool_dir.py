"""`hr.load_tool_dir`: a folder of programs in any language, each a tool."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio


def make_tool(root: Path, name: str, run: str | None = "#!/bin/sh\ncat\n", *,
              schema: object = None, description: str | None = "A tool.",
              toml: str | None = None, executable: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if run is not None:
        (folder / "run").write_text(run)
        if executable:
            (folder / "run").chmod(0o755)
    if schema is not False:
        (folder / "schema.json").write_text(json.dumps(schema or {"type": "object"}))
    if description is not None:
        (folder / "description.md").write_text(description)
    if toml is not None:
        (folder / "tool.toml").write_text(toml)
    return folder


SHOUT = """#!/bin/sh
# Reads {"text": ...} on stdin; a shell script, no Python.
read -r line
printf '%s\\n' "$line" | tr 'a-z' 'A-Z'
echo "called by $HANDRAIL_AGENT" >&2
"""


async def test_a_shell_script_tool_driven_by_a_scripted_model(tmp_path: Path,
                                                              workspace: Path) -> None:
    tools = tmp_path / "tools"
    make_tool(tools, "shout", SHOUT, description="Shout the text.",
              schema={"type": "object", "properties": {"text": {"type": "string"}},
                      "required": ["text"]},
              toml='server = "text"\ntimeout = 10\nmutates = false\n')
    (loaded,) = hr.load_tool_dir(tools)
    assert str(loaded.spec.id) == "text/shout"
    assert (loaded.spec.description, loaded.spec.timeout, loaded.spec.mutates) == \
        ("Shout the text.", 10, False)
    agent = hr.Agent(Scripted([call("text/shout", {"text": "hello"}), reply("done")]),
                     hr.load_tool_dir(tools), name="shouter", workspace=workspace,
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "text/*"))
    store = hr.Store.memory()
    with anyio.fail_after(60):
        result = await agent.run("shout", store=store)
    assert isinstance(result.outcome, hr.Completed)
    (record,) = await store.calls(result.run_id)
    assert record.result is not None
    assert record.result["content"][0]["text"] == (
        'Exit code: 0\n{"TEXT":"HELLO"}\n--- stderr ---\ncalled by shouter')


def test_a_malformed_folder_names_each_file_and_loads_nothing(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    make_tool(tools, "good")
    make_tool(tools, "noexec", executable=False)
    make_tool(tools, "norun", run=None)
    make_tool(tools, "badschema", schema=False).joinpath("schema.json").write_text("{nope")
    make_tool(tools, "arrayschema", schema={"type": "array"})
    make_tool(tools, "nodesc", description=None)
    make_tool(tools, "badtoml", toml="colour = 'red'\ntimeout = -1\n")
    with pytest.raises(hr.ConfigError) as info:
        hr.load_tool_dir(tools)
    message = str(info.value)
    for expected in ["noexec/run: not executable", "norun/run: missing",
                     "badschema/schema.json: not valid JSON",
                     "arrayschema/schema.json: must be a JSON Schema of an object",
                     "nodesc/description.md: missing", "badtoml/tool.toml: unknown key 'colour'",
                     "badtoml/tool.toml: timeout = -1"]:
        assert expected in message, expected
    assert "good" not in message


def test_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(hr.ConfigError, match="is not a directory"):
        hr.load_tool_dir(tmp_path / "nowhere")


def test_hidden_entries_and_files_are_skipped(tmp_path: Path) -> None:
    make_tool(tmp_path, ".git", run=None, description=None, schema=False)
    (tmp_path / "README.md").write_text("tools")
    make_tool(tmp_path, "one")
    assert [str(t.spec.id) for t in hr.load_tool_dir(tmp_path)] == ["local/one"]
