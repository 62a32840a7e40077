"""The README's example runs, so it cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_example_runs_and_prints_its_answer(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README lost its example"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip() == "Alice has 120."


def test_the_readme_first_screen_gives_the_two_commands() -> None:
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    assert "handrail demo" in first_screen
    assert "./scripts/test" in first_screen
