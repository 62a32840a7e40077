"""Issue 10 §2: the manifest did not pin what the model is told.

A user granted `write_note(path, text)` in a reviewed `handrail.toml` (written by
`handrail manifest init`), then added `append: bool = False` to the tool. `handrail manifest
check` still said OK, and the model was offered the new parameter: a grant of a typed tool
stated no schema, so nothing the reviewer saw described the parameters. A different
`instructions=` or model than the manifest's `[agent]` section also ran without complaint.

Now init writes every grant's schemas, the check names each changed parameter, and an agent
refuses instructions or a model other than the manifest's.
"""

from __future__ import annotations

import pytest

import handrail as hr
from handrail.manifest import Manifest, problems
from handrail.models import Scripted


@hr.tool(server="notes")
async def write_note(title: str, text: str) -> str:
    """Write a note."""
    return "ok"


@hr.tool(server="notes", name="write_note")
async def write_note_with_append(title: str, text: str, append: bool = False) -> str:
    """Write a note."""
    return "ok"


def test_a_parameter_added_after_init_is_drift_naming_it() -> None:
    reviewed = Manifest.from_toml(Manifest.from_toolbox(hr.Toolbox([write_note])).to_toml())
    assert problems(hr.Toolbox([write_note]), reviewed) == []
    (problem,) = problems(hr.Toolbox([write_note_with_append]), reviewed)
    assert "added parameter 'append' (boolean, optional, default false)" in problem
    with pytest.raises(hr.ManifestDrift, match="append"):
        hr.Agent(Scripted([]), [write_note_with_append], manifest=reviewed)


def test_the_digest_changes_with_the_parameters() -> None:
    before = Manifest.from_toolbox(hr.Toolbox([write_note]))
    after = Manifest.from_toolbox(hr.Toolbox([write_note_with_append]))
    assert before.digest != after.digest


def test_other_instructions_or_model_than_the_agent_section_are_refused() -> None:
    text = Manifest.from_toolbox(hr.Toolbox([write_note]), instructions="Take notes.",
                                 model="openai:gpt-4.1-mini").to_toml()
    manifest = Manifest.from_toml(text)
    hr.Agent(Scripted([], name="openai:gpt-4.1-mini"), [write_note], manifest=manifest)
    with pytest.raises(hr.ManifestDrift) as info:
        hr.Agent(Scripted([], name="openai:gpt-5"), [write_note], manifest=manifest,
                 instructions="Delete every note.")
    assert [p.split(" ")[:3] for p in info.value.problems] == [
        ["the", "agent's", "instructions"], ["the", "agent's", "model"]]
