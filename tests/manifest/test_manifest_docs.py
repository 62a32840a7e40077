"""docs/manifest.md cannot rot: its example loads, and its claims about it hold."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from manifest_tools import Transfer, read, shell_tool

import handrail as hr
from handrail.manifest import Manifest, canonical_json, problems

DOC = Path(__file__).resolve().parents[2] / "docs" / "manifest.md"


def _blocks(language: str) -> list[str]:
    """The fenced blocks of the doc tagged `language` ("" for untagged ones)."""
    blocks: list[str] = []
    current: list[str] | None = None
    tag = ""
    for line in DOC.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, tag = [], line[3:].strip()
            else:
                if tag == language:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_documented_example_loads() -> None:
    (example,) = _blocks("toml")
    m = Manifest.from_toml(example, source="docs/manifest.md")
    assert [str(g.ref) for g in m.grants] == ["ledger/read", "ledger/transfer", "shell/run"]
    assert m.agent.instructions is not None and m.agent.instructions.endswith("when unsure.")
    assert m.policy is not None
    assert [layer["name"] for layer in m.policy.to_dict()["layers"]] == ["secrets", "app"]
    assert m.budgets.max_tokens == 200_000
    assert Manifest.from_toml(m.to_toml()) == m


def test_the_documented_example_matches_the_documented_tools() -> None:
    (example,) = _blocks("toml")
    m = Manifest.from_toml(example, source="docs/manifest.md")
    shell = shell_tool({
        "type": "object",
        "required": ["cmd"],
        "additionalProperties": False,
        "properties": {"cmd": {"type": "string",
                               "description": "The command line, e.g. 'git status'."}},
    })
    assert problems(hr.Toolbox([read, Transfer, shell]), m) == []


def test_the_documented_canonical_form_has_the_documented_shape() -> None:
    (example,) = _blocks("toml")
    canonical = Manifest.from_toml(example).canonical()
    assert list(canonical) == ["format", "agent", "tools", "policy", "budgets"]
    assert list(canonical["agent"]) == ["name", "instructions", "model"]
    assert list(canonical["tools"][0]) == ["ref", "mutates", "idempotent", "description",
                                           "arguments"]
    assert list(canonical["budgets"]) == ["max_steps", "max_tokens", "max_wall_seconds"]
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
