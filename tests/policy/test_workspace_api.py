"""The workspace path API tools use (docs/policy.md, "The workspace path API"): public, and
the very functions the policy confines with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import handrail.policy as policy
from handrail.policy import (
    SECRETS,
    OutsideWorkspace,
    UncanonicalPath,
    UncanonicalTarget,
    canonicalize,
    resolve_in_workspace,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


def test_every_name_in_the_documented_table_is_public() -> None:
    section = DOC.read_text().split("## The workspace path API (for tools)", 1)[1]
    section = section.split("\n## ", 1)[0]
    names = re.findall(r"^\| `(\w+)", section, flags=re.M)
    assert names, "the table of the workspace path API is gone from docs/policy.md"
    for name in names:
        assert name in policy.__all__, f"docs/policy.md documents {name}, not public"


def test_the_documented_example_holds(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "notes").mkdir()
    workspace = tmp_path
    assert canonicalize("src/../README.md", workspace) == "README.md"
    assert resolve_in_workspace("notes/a.txt", workspace) == tmp_path.resolve() / "notes/a.txt"
    with pytest.raises(OutsideWorkspace):
        resolve_in_workspace("../etc/passwd", workspace)
    with pytest.raises(OutsideWorkspace):
        canonicalize("/etc/passwd", workspace)


@pytest.mark.parametrize("bad", ["", "a\x00b", "\udc80", 3])
def test_uncanonical_paths_raise_the_documented_errors(tmp_path: Path, bad: object) -> None:
    with pytest.raises(UncanonicalPath) as info:
        resolve_in_workspace(bad, tmp_path)  # type: ignore[arg-type]
    assert isinstance(info.value, UncanonicalTarget)
    assert isinstance(info.value, ValueError)


def test_the_secrets_layer_denies_exactly_secrets(tmp_path: Path) -> None:
    layer = next(la for la in policy.Policy.default().layers if la.name == "secrets")
    patterns = {r.pattern for r in layer.rules}
    assert patterns == set(SECRETS)
