"""The README's example: its tool part is checked here, the whole block when it can run."""

import re
from pathlib import Path
from typing import Any

import pytest

import handrail as hr

README = Path(__file__).parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_an_example() -> None:
    assert python_blocks()


def test_the_readme_tool_is_what_the_prose_says() -> None:
    block = python_blocks()[0]
    # The tool declaration: everything before the model is scripted.
    declaration = block.split("\nmodel = ", 1)[0]
    declaration = "\n".join(line for line in declaration.splitlines()
                            if not line.startswith("from handrail.models"))
    namespace: dict[str, Any] = {}
    exec(compile(declaration, str(README), "exec"), namespace)
    balance = namespace["balance"]
    spec = balance.spec
    assert spec.id.model_name == "ledger--balance"  # "The model saw the tool as ledger--balance"
    assert spec.mutates is False
    assert spec.description == "Read a ledger account's balance."
    assert spec.input_schema["properties"]["account"] == {
        "type": "string", "description": "The account's id."}
    assert spec.output_schema == {"type": "integer"}
    result = hr.Toolbox([balance]).call("ledger/balance", {"account": "alice"})
    import anyio

    async def run() -> hr.ToolResult:
        return await result

    assert anyio.run(run).structured == 120


def test_the_whole_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # The names the README's agent half uses are exported: a missing one fails here, by
    # name, rather than being skipped (a skip would hide a README that cannot run).
    missing = [name for name in ("Agent", "Store", "Policy") if not hasattr(hr, name)]
    assert missing == [], f"the README uses hr.{', hr.'.join(missing)}, which handrail lacks"
    exec(compile(python_blocks()[0], str(README), "exec"), {})
    assert capsys.readouterr().out.strip().endswith("Alice has 120.")
