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


def test_the_first_screen_has_exactly_the_two_set_up_commands() -> None:
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    (block,) = re.findall(r"```bash\n(.*?)```", first_screen, flags=re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/handrail demo",
        "./scripts/test"]


DOCS = README.parent / "docs"


def test_the_readme_links_the_index_and_the_cli_page_and_tells_no_stale_news() -> None:
    text = README.read_text()
    assert "(docs/README.md)" in text and "(docs/cli.md)" in text
    assert "Not yet" not in text  # sub-agents are built (docs/subagents.md)


def test_the_docs_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    linked = set(re.findall(r"\]\(([a-z-]+\.md)\)", index))
    assert linked == pages


def test_no_docs_page_cites_an_issue_number() -> None:
    """Story: "(issue 11)" in a docs page means nothing to a user, who has no issue tracker."""
    for page in [README, *DOCS.glob("*.md")]:
        found = re.findall(r"\bissues? \d+", page.read_text(), flags=re.I)
        assert not found, (page.name, found)
