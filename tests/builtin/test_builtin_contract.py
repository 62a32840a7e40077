"""The ToolImpl contract (tests/tools/tool_contract.py) run against a built-in workspace tool:
`workspace/read_file`, a `hr.Tool` class whose actions name the file it reads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest
from tool_contract import Subject, ToolImplContract, ToolKind

import handrail as hr
from handrail.builtin import ReadFile
from handrail.tools import as_impl

_BUILT_IN = "a built-in tool's body is fixed: it cannot be made to {} on command"


class ReadFileKind(ToolKind):
    """`workspace/read_file` over a workspace holding `notes.txt`."""

    name = "builtin read_file"
    cannot: ClassVar[Mapping[str, str]] = {
        "raising": _BUILT_IN.format("raise"),
        "blocking": _BUILT_IN.format("block"),
        "with_output": "read_file declares no output schema",
    }

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        (workspace / "notes.txt").write_text("hello contract\n")

    def echo(self) -> Subject:
        return Subject(
            impl=as_impl(ReadFile), good={"path": "notes.txt"},
            bad=[{"path": 3}, {"path": "notes.txt", "offset": 0}],
            actions=[hr.Action(hr.Act.READ, "notes.txt")],
            expect_text="hello contract", context={"workspace": self.workspace},
        )

    def returns_error(self) -> Subject:
        return Subject(impl=as_impl(ReadFile), good={"path": "missing.txt"},
                       context={"workspace": self.workspace})


class TestReadFile(ToolImplContract):
    @pytest.fixture
    def kind(self, workspace: Path) -> ToolKind:
        return ReadFileKind(workspace)
