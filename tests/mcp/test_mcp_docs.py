"""docs/mcp.md's Python examples run, with the output their comments show."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"


def test_every_python_block_of_docs_mcp_runs_and_prints_what_it_says() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(blocks) == 2
    for number, block in enumerate(blocks):
        expected = _trailing_comments(block)
        assert expected, f"block {number} shows no output"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{DOCS}#{number}", "exec"), {"__name__": f"docs_mcp_{number}"})
        assert out.getvalue().splitlines() == expected


def _trailing_comments(block: str) -> list[str]:
    """The comment lines ending a block: the output it shows."""
    shown: list[str] = []
    for line in reversed(block.rstrip().splitlines()):
        if not line.startswith("# "):
            break
        shown.insert(0, line[2:])
    return shown
