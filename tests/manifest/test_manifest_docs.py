"""docs/manifest.md cannot rot: every example on the page runs, and its claims about it hold.

The page's Python blocks run in order in one namespace (as the module `app`), in a directory
holding the page's TOML example as `handrail.toml`; a `text` block right after a Python block
is exactly what that block prints.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.cli import main
from handrail.manifest import Manifest, canonical_json, review

DOC = Path(__file__).resolve().parents[2] / "docs" / "manifest.md"


def _all_blocks() -> list[tuple[str, str]]:
    """Every fenced block of the doc as (tag, text), in order ("" for untagged ones)."""
    blocks: list[tuple[str, str]] = []
    current: list[str] | None = None
    tag = ""
    for line in DOC.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, tag = [], line[3:].strip()
            else:
                blocks.append((tag, "".join(current)))
                current = None
        elif current is not None:
            current.append(line)
    assert current is None, "an unclosed fence"
    return blocks


def _blocks(language: str) -> list[str]:
    return [text for tag, text in _all_blocks() if tag == language]


def test_the_page_stands_alone() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "DESIGN.md" not in text and "../" not in text


def test_every_block_is_one_the_tests_run() -> None:
    assert {tag for tag, _ in _all_blocks()} == {"python", "toml", "text", "", "console"}
    tags = [tag for tag, _ in _all_blocks()]
    for index, tag in enumerate(tags):
        if tag == "text":  # an output belongs to the Python block right before it
            assert tags[index - 1] == "python"


def _run_page(directory: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    (example,) = _blocks("toml")
    (directory / "handrail.toml").write_text(example, encoding="utf-8")
    monkeypatch.chdir(directory)
    namespace: dict[str, Any] = {"__name__": "app"}
    blocks = _all_blocks()
    for index, (tag, text) in enumerate(blocks):
        if tag != "python":
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(text, f"{DOC}#block{index}", "exec"), namespace)
        following = blocks[index + 1] if index + 1 < len(blocks) else ("", "")
        if following[0] == "text":
            assert out.getvalue() == following[1], f"block {index} printed something else"
        else:
            assert out.getvalue() == ""
    return namespace


def test_every_python_example_runs_and_prints_what_the_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = _run_page(tmp_path, monkeypatch)
    assert isinstance(namespace["agent"], hr.Agent)


def test_the_documented_manifest_passes_a_strict_check_of_the_documented_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = _run_page(tmp_path, monkeypatch)
    m = Manifest.load(tmp_path / "handrail.toml")
    assert review(namespace["box"], m, strict=True) == []
    assert [str(g.ref) for g in m.grants] == ["ledger/read", "ledger/transfer", "crm/lookup"]
    assert m.agent.instructions is not None and m.agent.instructions.endswith("when unsure.")
    assert m.policy is not None
    assert [layer["name"] for layer in m.policy.to_dict()["layers"]] == ["secrets", "app"]
    assert m.budgets.max_tokens == 200_000
    assert Manifest.from_toml(m.to_toml()) == m
    # What the page says init wrote is what init writes, apart from the hand edits.
    written = Manifest.from_toolbox(namespace["box"])
    for grant in m.grants:
        init_grant = written.grant(grant.ref)
        assert init_grant is not None
        assert (grant.arguments, grant.output) == (init_grant.arguments, init_grant.output)
    transfer = m.grant("ledger/transfer")
    assert transfer is not None and transfer.arguments is not None
    assert transfer.arguments["properties"]["memo"]["default"] is None  # the $json spelling


def test_the_canonical_form_is_the_documented_definition() -> None:
    (example,) = _blocks("toml")
    canonical = Manifest.from_toml(example).canonical()
    assert list(canonical) == ["format", "agent", "tools", "policy", "budgets"]

    # The documented definition, written out independently.
    def integral(value: object) -> object:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict):
            return {k: integral(v) for k, v in value.items()}
        if isinstance(value, list):
            return [integral(v) for v in value]
        return value

    documented = json.dumps(integral(canonical), sort_keys=True, separators=(",", ":"),
                            ensure_ascii=False).encode("utf-8")
    assert canonical_json(canonical) == documented
    assert b'"max_wall_seconds":600}' in documented
    m = Manifest.from_toml(example)
    assert m.digest == "sha256:" + hashlib.sha256(documented).hexdigest()


def _refused(text: str) -> str:
    try:
        Manifest.from_toml(text, source="handrail.toml")
    except hr.ManifestError as exc:
        return str(exc)
    raise AssertionError("the manifest was accepted")


def test_the_documented_error_messages_are_the_real_ones() -> None:
    (messages,) = [b for b in _blocks("") if "unknown key" in b]
    unknown, duplicate = messages.strip().splitlines()
    lines = [""] * 25
    lines[0:4] = ["[[tools]]", 'ref = "x/1"', "[[tools]]", 'ref = "x/2"']
    lines[9:12] = ["[[tools]]", 'ref = "a/b"', 'descripton = "x"']
    assert _refused("\n".join(lines)) == unknown
    lines = [""] * 25
    lines[7:13] = ["[[tools]]", 'ref = "ledger/read"', "[[tools]]", 'ref = "a/1"',
                   "[[tools]]", 'ref = "a/2"']
    lines[19:21] = ["[[tools]]", 'ref = "ledger/read"']
    assert _refused("\n".join(lines)) == duplicate


def test_the_documented_commands_and_options_exist(capsys: pytest.CaptureFixture[str]) -> None:
    (synopsis,) = _blocks("console")
    commands = [line.split() for line in synopsis.strip().splitlines()]
    assert [c[:3] for c in commands] == [["handrail", "manifest", sub]
                                         for sub in ("init", "update", "check", "digest")]
    for words in commands:
        with pytest.raises(SystemExit):
            main([words[1], words[2], "--help"])
        usage = capsys.readouterr().out
        for option in re.findall(r"(?<=\[)(--?[a-z-]+)", " ".join(words)):
            assert re.search(rf"(^|[\s\[,]){re.escape(option)}\b", usage), (words[2], option)
