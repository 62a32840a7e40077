"""What each corner of handrail loads (issue 11): pydantic only where a typed tool is built.

The policy, the store and the CLI's reading commands (`handrail runs/pending/show`) never need
pydantic (~100 ms of import); `handrail.tools` loads each public name from its module on first
use, so taking `Act` or `canonicalize` from it costs only that module. Each check runs in a
fresh interpreter: `sys.modules` of this test process has everything loaded already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import handrail.tools


def _loaded(code: str) -> dict[str, bool]:
    probe = (f"{code}\nimport json, sys\n"
             "print(json.dumps({m: m in sys.modules for m in ('pydantic', 'pydantic_core', "
             "'rich', 'importlib.metadata')}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    loaded: dict[str, bool] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("code", [
    "from handrail import Policy\n"
    "Policy.from_toml('[[policy.layers]]\\nname = \"app\"\\nallow = [\"write:src/**\"]\\n')",
    "from handrail import Store; Store.memory()",
    "import handrail.policy, handrail.store",
    "import handrail.cli._runs",
    "from handrail.tools import Act, Action, canonicalize, UncanonicalTarget",
])
def test_the_policy_the_store_and_the_cli_readers_never_load_pydantic(code: str) -> None:
    loaded = _loaded(code)
    assert not loaded["pydantic"] and not loaded["pydantic_core"], loaded
    assert not loaded["rich"], loaded


def test_the_agent_core_imports_without_pydantic() -> None:
    # Issue 11: importing the core names (and the markers a typed tool's signature uses) costs
    # no pydantic (~50 ms) and no pydantic_core (~20 ms); defining a typed tool loads them.
    loaded = _loaded("from handrail import Agent, tool, Toolbox, Store, Policy\n"
                     "from handrail import ReadPath, WritePath, ExecArgv, Url, ToolResult\n"
                     "from handrail import Manifest\n"
                     "import handrail.models")
    assert not loaded["pydantic"] and not loaded["pydantic_core"], loaded
    assert not loaded["rich"], loaded


def test_the_cli_parser_does_not_look_up_the_version_until_asked() -> None:
    # Every command builds the whole parser; `--version`'s lookup (importlib.metadata and
    # email, ~15 ms) belongs to `--version` alone (issue 11).
    loaded = _loaded("from handrail.cli import build_parser\n"
                     "build_parser().parse_args(['runs', '--json'])")
    assert not loaded["importlib.metadata"], loaded
    assert not loaded["pydantic"] and not loaded["rich"], loaded


def test_handrail_version_imports_nothing_but_the_facade() -> None:
    # `handrail --version` is a bare interpreter's start and a print (issue 38: <= 1.3x
    # `python -c pass`): no argparse, no command group, no exception tree, no metadata lookup.
    # The modules are listed before json is imported (json imports re).
    probe = ("import sys\nsys.argv = ['handrail', '--version']\n"
             "from handrail.cli import main\nassert main() == 0\n"
             "loaded = sorted(m for m in sys.modules if m.startswith('handrail') or m in "
             "('argparse', 'importlib.metadata', 'typing', 'dataclasses', 're'))\n"
             "import json\nprint(json.dumps(loaded))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    out = proc.stdout.strip().splitlines()
    assert out[0].startswith("handrail ")
    assert json.loads(out[-1]) == ["handrail", "handrail.cli"]


def test_a_typed_tool_still_loads_pydantic_when_it_is_defined() -> None:
    loaded = _loaded("import handrail as hr\n"
                     "@hr.tool\ndef add(a: int, b: int) -> int:\n    return a + b\n")
    assert loaded["pydantic"]


def test_every_public_name_of_handrail_tools_resolves_from_its_module() -> None:
    lazy = handrail.tools._LAZY
    assert set(lazy) == set(handrail.tools.__all__)
    for name, module in lazy.items():
        value = getattr(handrail.tools, name)
        assert getattr(sys.modules[module], name) is value, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        handrail.tools.Nope  # noqa: B018


def test_every_public_name_of_handrail_runs_resolves_from_its_module() -> None:
    import handrail.runs

    lazy = handrail.runs._LAZY
    assert set(lazy) == set(handrail.runs.__all__)
    for name, module in lazy.items():
        value = getattr(handrail.runs, name)
        assert getattr(sys.modules[module], name) is value, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        handrail.runs.Nope  # noqa: B018


def test_handrail_show_takes_a_conversation_without_the_agent_loop() -> None:
    # `handrail show` lists a run's conversation (`thread`): the loop, the gate, the host and
    # the approval machinery are not needed for that (issue 11).
    probe = ("from handrail.runs import thread\nimport json, sys\n"
             "print(json.dumps([m in sys.modules for m in ('handrail.runs._agent', "
             "'handrail.host', 'handrail.gate', 'handrail.approval')]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [False, False, False, False]


def test_building_the_cli_parser_imports_no_store_nor_event_loop() -> None:
    # `handrail --help` (and the parser every command builds) needs argparse, not the store,
    # asyncio, anyio's backend, sockets, tokens or shutil (argparse's own width lookup pulls
    # bz2 and lzma): each command group imports those when it runs (issue 11).
    probe = ("import io, contextlib, json, sys\nfrom handrail.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
             "print(json.dumps({m: m in sys.modules for m in ('handrail.store', 'asyncio', "
             "'anyio._backends._asyncio', 'shutil', 'secrets', 'ipaddress', 'rich', "
             "'pydantic', 'importlib.metadata')}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(loaded.values()), loaded


_NOT_FOR_READING = ("handrail.runs._agent", "handrail.gate", "handrail.approval",
                    "handrail.host", "handrail.models", "handrail.policy", "rich", "pydantic",
                    "anyio._backends._asyncio", "shutil", "secrets")


@pytest.mark.parametrize("command", [["runs"], ["runs", "--json"], ["show", "RUN"],
                                     ["show", "RUN", "--json"], ["pending"],
                                     ["pending", "--json"]])
def test_the_cli_reading_commands_never_load_the_agent_loop(tmp_path: Path,
                                                            command: list[str]) -> None:
    # What `handrail runs/show/pending` pay (issue 11: < 200 ms on 10,000 runs) is mostly
    # imports: counting and drawing a tree of sub-agents, and listing a conversation, need
    # the store on a bare asyncio loop, not the loop, the models, the policy or rich.
    import handrail as hr

    db = tmp_path / "runs.db"

    async def one_paused_tree() -> str:
        store = hr.Store.open(db)
        try:
            parent = hr.RunRecord(id="root", task="t", agent="a", status=hr.RunStatus.RUNNING)
            await store.write(hr.store.Batch(run=parent))
            return parent.id
        finally:
            await store.close()

    run_id = anyio.run(one_paused_tree)
    argv = [a.replace("RUN", run_id) for a in command]
    probe = ("import json, sys\nfrom handrail.cli import main\n"
             f"code = main({[*argv, '--store', str(db)]!r})\n"
             f"print(json.dumps([code, [m for m in {_NOT_FOR_READING!r} if m in sys.modules]]),"
             " file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == [0, []], proc.stderr
