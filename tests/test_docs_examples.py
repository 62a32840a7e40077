"""The runnable examples in docs/ run, in order, so the docs cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", ["tools.md", "models.md", "control.md"])
def test_every_python_block_of_the_page_runs(name: str) -> None:
    text = (DOCS / name).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    namespace: dict[str, object] = {"__name__": f"docs_{name}"}
    for block in blocks:  # one namespace: later blocks build on earlier ones
        exec(compile(block, str(DOCS / name), "exec"), namespace)
