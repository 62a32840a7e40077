"""`handrail manifest update`: the code's changes merged in, what a person wrote kept."""

from __future__ import annotations

import pytest

import handrail as hr
from handrail.manifest import Manifest, review
from handrail.manifest._update import update


@hr.tool(server="notes")
async def write_note(title: str, text: str) -> str:
    """Write a note."""
    return "ok"


@hr.tool(server="notes", name="write_note")
async def write_note_v2(title: str, text: str, append: bool = False) -> str:
    """Write a note."""
    return "ok"


@hr.tool(server="notes", mutates=False)
async def read_note(title: str) -> str:
    """Read a note."""
    return "ok"


@hr.tool(server="notes", mutates=False)
async def old_tool(x: int) -> str:
    """Gone soon."""
    return "ok"


def _reviewed() -> str:
    text = Manifest.from_toolbox(hr.Toolbox([write_note, old_tool]),
                                 instructions="Take notes.").to_toml()
    text = text.replace("[[tools]]", "# reviewed by ana\n[[tools]]", 1)
    text = text.replace('description = "Write a note."',
                        'description = "Write one note (reviewed)."  # our words')
    return text + '\n[budgets]\nmax_steps = 3  # hand-written\n'


def test_update_merges_the_code_and_keeps_what_was_written_by_hand() -> None:
    old = _reviewed()
    result = update(old, hr.Toolbox([write_note_v2, read_note]), {})
    assert result.changes == [
        "'notes/write_note': added parameter 'append' (boolean, optional, default false)",
        "'notes/read_note': granted (new in the code)",
        "'notes/old_tool': grant removed (nothing implements it)",
    ]
    assert result.note is None
    text = result.text
    # Hand-written lines survive: the comment above the grant, [budgets] and its comment.
    assert "# hand-written" in text and "# reviewed by ana" in text
    assert 'description = "Write one note (reviewed)."  # our words\n' in text
    assert "old_tool" not in text
    m = result.manifest
    assert m.grant("notes/write_note") is not None
    assert m.grant("notes/write_note").description == "Write one note (reviewed)."  # type: ignore[union-attr]
    assert m.budgets.max_steps == 3 and m.agent.instructions == "Take notes."
    box = hr.Toolbox([write_note_v2, read_note])
    assert review(box, m, strict=True) == []
    diff = result.diff("handrail.toml")
    assert "+[tools.arguments.properties.append]\n" in diff
    assert '-ref = "notes/old_tool"\n' in diff
    # Idempotent: a second update changes nothing.
    again = update(text, box, {})
    assert again.changes == [] and again.text == text


def test_update_follows_the_agent_and_only_tightens_traits() -> None:
    old = Manifest.from_toolbox(hr.Toolbox([write_note]), name="notes-bot",
                                instructions="Take notes.", model="openai:a").to_toml()
    old = old.replace("mutates = true", "mutates = false")
    result = update(old, hr.Toolbox([write_note]),
                    {"name": "code-name", "instructions": "Take short notes.",
                     "model": "openai:b"})
    assert result.changes == [
        "'notes/write_note': mutates = true (the tool declares mutates=True)",
        "[agent] instructions taken from the code",
        "[agent] model taken from the code",
    ]
    assert result.manifest.agent.name == "notes-bot"  # a written name is kept
    assert result.manifest.agent.instructions == "Take short notes."


def test_a_file_that_cannot_be_merged_by_block_is_rewritten_and_says_so() -> None:
    old = 'tools = [{ ref = "notes/write_note", description = "W." }]  # inline\n'
    result = update(old, hr.Toolbox([write_note_v2]), {})
    assert result.note is not None and "comments are lost" in result.note
    assert review(hr.Toolbox([write_note_v2]), result.manifest, strict=True) == []
    assert result.manifest.grants[0].description == "W."


def test_update_refuses_a_broken_manifest() -> None:
    with pytest.raises(hr.ManifestError, match="unknown key"):
        update("[[tools]]\nref = 'a/b'\nrefx = 1\n", hr.Toolbox([write_note]), {})


def test_an_agent_section_is_added_after_the_leading_comments() -> None:
    old = Manifest.from_toolbox(hr.Toolbox([write_note])).to_toml()
    result = update(old, hr.Toolbox([write_note]), {"instructions": "Take notes.",
                                                     "model": "openai:a"})
    assert result.note is None
    assert result.text.startswith(old.split("[[tools]]")[0] + '[agent]\ninstructions = '
                                  '"Take notes."\nmodel = "openai:a"\n\n[[tools]]')
    assert result.text.endswith(old.split("[[tools]]", 1)[1])


def test_a_merge_that_would_mean_something_else_falls_back_to_a_rewrite() -> None:
    # `tools = []` is a top-level key: a table inserted above it would swallow it.
    old = "tools = []\n"
    result = update(old, hr.Toolbox([write_note]), {"instructions": "Take notes."})
    assert result.note is not None and "rewritten whole" in result.note
    assert result.manifest.agent.instructions == "Take notes."
    assert review(hr.Toolbox([write_note]), result.manifest, strict=True) == []
