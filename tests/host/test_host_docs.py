"""The runnable examples of docs/host-tools.md run, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "host-tools.md"


@pytest.mark.slow
def test_every_python_block_of_the_host_tools_page_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "docs_host_tools"}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
