"""`handrail manifest init | check | digest`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from handrail.cli import main
from handrail.manifest import Manifest

APP = '''
import handrail as hr
from handrail.tools import SchemaTool


@hr.tool(server="ledger", mutates=False)
def read(account: str) -> int:
    """Read a ledger account's balance."""
    return 1


@hr.tool(server="ledger")
def transfer(source: str, target: str, amount: int) -> str:
    """Move money between two accounts."""
    return "ok"


async def _run(arguments, ctx):
    return hr.ToolResult.json({})


shell = SchemaTool(hr.ToolSpec("shell/run", "Run a command.", {
    "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}), _run)

box = hr.Toolbox([read, transfer, shell])
tools = [read, transfer]


def make_box():
    return hr.Toolbox([read])


class Agent:
    """Stands in for hr.Agent: the CLI only needs .toolbox and the [agent] fields."""

    def __init__(self):
        self.toolbox = box
        self.name = "ledger-bot"
        self.instructions = "Pay invoices."
        self.model = "openai:gpt-4.1-mini"


agent = Agent()
number = 3
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory holding an importable app module, as the current directory."""
    name = f"app_{tmp_path.name.replace('-', '_')}"  # unique: modules are cached
    (tmp_path / f"{name}.py").write_text(APP, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for key in [k for k in sys.modules if k == name]:
        del sys.modules[key]


def _module(project: Path) -> str:
    return f"app_{project.name.replace('-', '_')}"


def test_init_then_check_on_the_same_code_passes(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _module(project)
    assert main(["manifest", "init", f"{mod}:box"]) == 0
    written = Manifest.load(project / "handrail.toml")
    assert [str(g.ref) for g in written.grants] == ["ledger/read", "ledger/transfer",
                                                    "shell/run"]
    assert written.grant("ledger/read") is not None
    assert written.grants[0].mutates is False
    assert written.grants[0].description == "Read a ledger account's balance."
    # Every schema is pinned, typed or not: what the model is offered is reviewed.
    assert all(g.arguments is not None for g in written.grants)
    assert "wrote handrail.toml: 3 tools granted, sha256:" in capsys.readouterr().err

    assert main(["manifest", "check", f"{mod}:box"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK: {mod}:box matches handrail.toml (3 tools, sha256:")


def test_init_refuses_to_overwrite_without_force(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _module(project)
    (project / "handrail.toml").write_text("# reviewed\n", encoding="utf-8")
    assert main(["manifest", "init", f"{mod}:box"]) == 1
    assert "handrail.toml exists; pass --force to overwrite it" in capsys.readouterr().err
    assert (project / "handrail.toml").read_text(encoding="utf-8") == "# reviewed\n"
    assert main(["manifest", "init", f"{mod}:box", "--force"]) == 0
    assert len(Manifest.load(project / "handrail.toml").grants) == 3


def test_init_takes_an_agent_a_list_and_a_factory(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _module(project)
    assert main(["manifest", "init", f"{mod}:agent", "-o", "agent.toml"]) == 0
    m = Manifest.load(project / "agent.toml")
    assert (m.agent.name, m.agent.instructions, m.agent.model) == (
        "ledger-bot", "Pay invoices.", "openai:gpt-4.1-mini")
    assert len(m.grants) == 3

    assert main(["manifest", "init", f"{mod}:tools", "-o", "-", "--name", "x",
                 "--model", "scripted"]) == 0
    m = Manifest.from_toml(capsys.readouterr().out)
    assert [str(g.ref) for g in m.grants] == ["ledger/read", "ledger/transfer"]
    assert (m.agent.name, m.agent.model) == ("x", "scripted")

    assert main(["manifest", "init", f"{mod}:make_box", "-o", "-"]) == 0
    assert [str(g.ref) for g in Manifest.from_toml(capsys.readouterr().out).grants] == [
        "ledger/read"]

    # A single tool is callable, but must be granted, not called.
    assert main(["manifest", "init", f"{mod}:read", "-o", "-"]) == 0
    assert "ledger/read" in capsys.readouterr().out


def test_check_lists_every_problem_and_exits_1(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _module(project)
    (project / "reviewed.toml").write_text(textwrap.dedent('''
        [[tools]]
        ref = "ledger/read"
        description = "Read."

        [[tools]]
        ref = "ledger/transfer"
        mutates = false

        [[tools]]
        ref = "ledger/refund"
        description = "Refund."
    '''), encoding="utf-8")
    assert main(["manifest", "check", f"{mod}:box", "--manifest", "reviewed.toml"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "reviewed.toml: the code has drifted from the manifest (4 problems):"
    assert [line.split(" — ")[0] for line in out[1:5]] == [
        f"  - tool 'ledger/transfer' declares mutates=True (function {mod}.transfer) but is "
        "granted with mutates = false in reviewed.toml:6",
        "  - tool 'ledger/transfer' is granted in reviewed.toml:6 without a description",
        "  - tool 'shell/run' is implemented (spec shell/run) but not granted in reviewed.toml",
        "  - tool 'ledger/refund' is granted in reviewed.toml:10 but nothing implements it",
    ]
    # Hand-written grants without schemas: reported, and not counted as drift.
    assert out[5] == "reviewed.toml: 2 warnings (errors under --strict):"
    assert [line.split(":")[0] for line in out[6:]] == ["  - schema not pinned"] * 2


def test_check_reports_a_broken_manifest_or_target(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _module(project)
    (project / "handrail.toml").write_text('[[tools]]\nref = "a/b"\nmutate = false\n',
                                           encoding="utf-8")
    assert main(["manifest", "check", f"{mod}:box"]) == 1
    assert capsys.readouterr().err.startswith(
        "handrail: error: handrail.toml:3: unknown key 'mutate' in [[tools]] #1")
    (project / "handrail.toml").write_text("", encoding="utf-8")
    for target, message in [
        ("nomodule_xyz:box", "cannot import module 'nomodule_xyz'"),
        (f"{mod}:missing", f"'{mod}' has no 'missing'"),
        (f"{mod}:number", f"{mod}:number is of type int, not a Toolbox"),
        (f"{mod}", "expected MODULE:OBJECT"),
    ]:
        assert main(["manifest", "check", target]) == 1
        assert message in capsys.readouterr().err
    assert main(["manifest", "check", f"{mod}:box", "--manifest", "nope.toml"]) == 1
    assert "cannot read the manifest nope.toml" in capsys.readouterr().err


def test_digest_prints_the_digest_or_the_canonical_form(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "handrail.toml").write_text('[agent]\nname = "bot"\n', encoding="utf-8")
    (project / "other.toml").write_text('agent = { name = "bot" } # same meaning\n',
                                        encoding="utf-8")
    expected = Manifest.load(project / "handrail.toml").digest
    assert main(["manifest", "digest"]) == 0
    assert capsys.readouterr().out == f"{expected}\n"
    assert main(["manifest", "digest", "other.toml"]) == 0
    assert capsys.readouterr().out == f"{expected}\n"
    assert main(["manifest", "digest", "--canonical"]) == 0
    assert capsys.readouterr().out.startswith('{"agent":{"instructions":null,"model":null,'
                                              '"name":"bot"},')


def test_manifest_without_a_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifest"]) == 2
    assert "init" in capsys.readouterr().out


def test_the_installed_command_runs_in_a_subprocess(project: Path) -> None:
    mod = _module(project)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = [sys.executable, "-m", "handrail.cli", "manifest"]
    init = subprocess.run([*run, "init", f"{mod}:box"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert init.returncode == 0, init.stderr
    check = subprocess.run([*run, "check", f"{mod}:box"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=30, check=False)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("OK: ")
    (project / "handrail.toml").write_text("", encoding="utf-8")
    drift = subprocess.run([*run, "check", f"{mod}:box"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=30, check=False)
    assert drift.returncode == 1
    assert drift.stdout.count("  - tool '") == 3


REAL_AGENT = """
import handrail as hr
from handrail.models import Scripted


@hr.tool(server="notes")
def write_note(title: str, text: str) -> str:
    \"\"\"Write a note.\"\"\"
    return "ok"


agent = hr.Agent(Scripted([], name="openai:gpt-4.1-mini"), [write_note],
                 instructions="Take notes.", name="notes-bot",
                 policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "notes/*"))
"""

CHANGED_AGENT = REAL_AGENT.replace("title: str, text: str", "title: str, text: str, "
                                   "append: bool = False")


def _write_app(project: Path, name: str, text: str) -> str:
    module = f"{_module(project)}_{name}"
    (project / f"{module}.py").write_text(text, encoding="utf-8")
    return module


def test_init_from_an_agent_writes_its_model_instructions_and_policy(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _write_app(project, "real", REAL_AGENT)
    assert main(["manifest", "init", f"{mod}:agent"]) == 0
    m = Manifest.load(project / "handrail.toml")
    assert (m.agent.name, m.agent.instructions, m.agent.model) == (
        "notes-bot", "Take notes.", "openai:gpt-4.1-mini")
    assert m.policy is not None
    assert [layer["name"] for layer in m.policy.to_dict()["layers"]] == ["secrets", "app"]
    assert m.grants[0].arguments is not None
    capsys.readouterr()
    assert main(["manifest", "check", f"{mod}:agent", "--strict"]) == 0
    assert capsys.readouterr().out.startswith(f"OK: {mod}:agent matches handrail.toml")
    # Re-running init never overwrites silently; it names the command that merges.
    before = (project / "handrail.toml").read_text(encoding="utf-8")
    assert main(["manifest", "init", f"{mod}:agent"]) == 1
    err = capsys.readouterr().err
    assert "handrail.toml exists; pass --force to overwrite it" in err
    assert f"`handrail manifest update {mod}:agent` merges" in err
    assert (project / "handrail.toml").read_text(encoding="utf-8") == before


def test_an_added_parameter_fails_check_and_update_merges_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _write_app(project, "v1", REAL_AGENT)
    assert main(["manifest", "init", f"{mod}:agent"]) == 0
    path = project / "handrail.toml"
    path.write_text(path.read_text(encoding="utf-8").replace(
        'description = "Write a note."', 'description = "Write a note."  # reviewed'),
        encoding="utf-8")
    v2 = _write_app(project, "v2", CHANGED_AGENT)
    capsys.readouterr()
    assert main(["manifest", "check", f"{v2}:agent"]) == 1
    out = capsys.readouterr().out
    assert "added parameter 'append' (boolean, optional, default false)" in out

    assert main(["manifest", "check", f"{v2}:agent", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["strict"] is False
    assert [(p["kind"], p["severity"], p["ref"]) for p in report["problems"]] == [
        ("schema_changed", "error", "notes/write_note")]

    before = path.read_text(encoding="utf-8")
    assert main(["manifest", "update", f"{v2}:agent", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "'notes/write_note': added parameter 'append'" in out
    assert "+[tools.arguments.properties.append]" in out
    assert path.read_text(encoding="utf-8") == before  # a dry run writes nothing
    assert main(["manifest", "update", f"{v2}:agent"]) == 0
    assert "# reviewed" in path.read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["manifest", "check", f"{v2}:agent", "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []
    assert main(["manifest", "update", f"{v2}:agent"]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_check_strict_fails_on_an_unpinned_schema_and_json_says_why(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _write_app(project, "strict", REAL_AGENT)
    (project / "handrail.toml").write_text(
        '[[tools]]\nref = "notes/write_note"\ndescription = "Write."\n', encoding="utf-8")
    assert main(["manifest", "check", f"{mod}:agent"]) == 0  # a warning passes
    assert "1 warning (errors under --strict)" in capsys.readouterr().out
    assert main(["manifest", "check", f"{mod}:agent", "--strict", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(p["kind"], p["severity"]) for p in report["problems"]] == [
        ("schema_not_pinned", "error")]
    # The agent's own words are checked too when the manifest has an [agent] section.
    (project / "handrail.toml").write_text(
        '[agent]\ninstructions = "Other words."\nmodel = "anthropic:x"\n'
        + (project / "handrail.toml").read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["manifest", "check", f"{mod}:agent", "--json"]) == 1
    kinds = [p["kind"] for p in json.loads(capsys.readouterr().out)["problems"]]
    assert kinds == ["schema_not_pinned", "agent_instructions", "agent_model"]


def test_update_of_a_missing_manifest_says_to_init(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _write_app(project, "missing", REAL_AGENT)
    assert main(["manifest", "update", f"{mod}:agent"]) == 1
    assert "handrail.toml does not exist; write one with `handrail manifest init" in (
        capsys.readouterr().err)


def test_check_json_reports_a_broken_manifest_as_json(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = _write_app(project, "broken", REAL_AGENT)
    (project / "handrail.toml").write_text('[[tools]]\nref = "a/b"\nmutate = false\n',
                                           encoding="utf-8")
    assert main(["manifest", "check", f"{mod}:agent", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["error"].startswith("handrail.toml:3: unknown key 'mutate'")
