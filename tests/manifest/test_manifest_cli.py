"""`handrail manifest init | check | digest`."""

from __future__ import annotations

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
    assert [line.split(" — ")[0] for line in out[1:]] == [
        f"  - tool 'ledger/transfer' declares mutates=True (function {mod}.transfer) but is "
        "granted with mutates = false in reviewed.toml:6",
        "  - tool 'ledger/transfer' is granted in reviewed.toml:6 without a description",
        "  - tool 'shell/run' is implemented (spec shell/run) but not granted in reviewed.toml",
        "  - tool 'ledger/refund' is granted in reviewed.toml:10 but nothing implements it",
    ]


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
