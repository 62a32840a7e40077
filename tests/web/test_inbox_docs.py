"""docs/inbox.md: its example runs and the screenshots it shows exist."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "inbox.md"


def test_the_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    namespace: dict[str, object] = {"__name__": "docs_inbox"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)


def test_the_screenshots_it_shows_are_in_the_repository() -> None:
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", DOC.read_text())
    assert sorted(images) == ["img/inbox-approval.png", "img/inbox-list.png"]
    for image in images:
        assert (DOC.parent / image).stat().st_size > 10_000
