"""Every code example in README.md and docs/ runs as written, so the docs cannot rot.

Each page's ```python blocks run in order in one namespace (later blocks build on earlier
ones), in a fresh working directory, with top-level `await` allowed (as in `python -m
asyncio`). Pages whose examples need files written first have their own tests, which run
every block of the page (listed in `OWN_TESTS`); every other page is run here, and a page in
neither list fails, so a new page cannot escape.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

OWN_TESTS = {
    "docs/manifest.md": "tests/manifest/test_manifest_docs.py (blocks need handrail.toml)",
    "docs/inbox.md": "tests/web/test_inbox_docs.py (blocks need a running inbox)",
    "docs/mcp.md": "tests/mcp/test_mcp_docs.py (blocks need MCP servers)",
    "docs/host-tools.md": "tests/host/test_host_docs.py (blocks need programs on disk)",
    "docs/postgres.md": "tests/store/test_postgres.py (blocks need a PostgreSQL server)",
    "docs/observability.md": "tests/otel/test_observability_docs.py (blocks set the global "
                             "tracer provider: run in a fresh process)",
}
"""Page -> the test that runs its blocks instead of this one."""

PAGES = ["README.md", *(f"docs/{p.name}" for p in sorted(DOCS.glob("*.md")))]
RUN_HERE = [p for p in PAGES if p not in OWN_TESTS]


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _run_page(name: str) -> None:
    path = ROOT / name
    namespace: dict[str, Any] = {"__name__": f"docs_{path.stem}"}
    for block in _blocks(path.read_text()):
        code = compile(block, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if code.co_flags & inspect.CO_COROUTINE:
            async def main(code: Any = code) -> None:
                await eval(code, namespace)

            anyio.run(main)
        else:
            exec(code, namespace)
    for value in list(namespace.values()):  # stores the examples opened
        close = getattr(value, "close", None)
        if type(value).__name__.endswith("Store") and close is not None:
            anyio.run(close)


def test_every_page_is_run_here_or_by_its_own_test() -> None:
    assert set(OWN_TESTS) <= set(PAGES)
    for page, test in OWN_TESTS.items():
        assert (ROOT / test.split(" ")[0]).is_file(), page
        assert page.removeprefix("docs/") in (ROOT / test.split(" ")[0]).read_text()


@pytest.mark.parametrize("name", RUN_HERE)
def test_every_python_block_of_the_page_runs(name: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HANDRAIL_STORE", raising=False)
    if _blocks((ROOT / name).read_text()):
        _run_page(name)


def test_the_pages_that_matter_have_examples() -> None:
    for name in ("README.md", "docs/tools.md", "docs/models.md", "docs/policy.md",
                 "docs/runs.md"):
        assert _blocks((ROOT / name).read_text()), name


def test_the_docs_stand_alone() -> None:
    """A user has no `../shared/`: no page points at the design sketch or outside the project."""
    for name in PAGES:
        text = (ROOT / name).read_text()
        assert "DESIGN.md" not in text and "../shared" not in text, name
