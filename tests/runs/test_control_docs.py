"""docs/control.md: each Python block runs, and prints the `text` block that follows it."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "control.md"


def test_each_example_prints_what_the_page_says() -> None:
    blocks = re.findall(r"```(\w*)\n(.*?)```", PAGE.read_text(), flags=re.S)
    namespace: dict[str, object] = {"__name__": "docs_control"}
    checked = 0
    for i, (tag, body) in enumerate(blocks):
        if tag != "python":
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(body, str(PAGE), "exec"), namespace)
        following = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
        if following[0] == "text":
            assert out.getvalue() == following[1], f"block {i} printed {out.getvalue()!r}"
            checked += 1
    assert checked == 4
