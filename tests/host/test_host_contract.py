"""The ToolImpl contract (tests/tools/tool_contract.py) run against host tools: a
`SubprocessTool` and a routed injected tool."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from tool_contract import Subject, ToolImplContract, ToolKind

import handrail as hr
from handrail.errors import ToolError
from handrail.host import InjectionToolset
from handrail.tools import CallContext, ToolImpl, ToolResult

ECHO_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}},
                               "required": ["text"]}


class _Tracked(hr.SubprocessTool):
    """A SubprocessTool that reports its start and its cleanup to the contract."""

    started: anyio.Event | None = None
    cleaned: list[bool] | None = None

    async def execute(self, validated: Any, ctx: CallContext | None) -> ToolResult:
        if self.started is not None:
            self.started.set()
        try:
            return await super().execute(validated, ctx)
        finally:
            if self.cleaned is not None:
                self.cleaned.append(True)


class SubprocessKind(ToolKind):
    name = "subprocess"
    cannot: ClassVar[Mapping[str, str]] = {
        "raising": "a program cannot raise a Python exception; it exits non-zero",
        "with_output": "a program's result is its text envelope, with no structured output",
    }

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def echo(self) -> Subject:
        tool = hr.SubprocessTool("echo", ["cat"], ECHO_SCHEMA, "Echo.")
        return Subject(impl=tool, good={"text": "hello contract"}, bad=[{"text": 1}],
                       expect_text="hello contract", context={"workspace": self.workspace})

    def returns_error(self) -> Subject:
        tool = hr.SubprocessTool("fail", ["sh", "-c", "echo no >&2; exit 2"], ECHO_SCHEMA, "F.")
        return Subject(impl=tool, good={"text": "x"}, context={"workspace": self.workspace})

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject:
        tool = _Tracked("block", [sys.executable, "-c", "import time; time.sleep(1000)"],
                        ECHO_SCHEMA, "Block.", timeout=timeout or 60, grace=1)
        tool.started, tool.cleaned = started, cleaned
        return Subject(impl=tool, good={"text": "x"}, context={"workspace": self.workspace})


class _Host:
    def __init__(self, route: Any) -> None:
        self._route = route

    def tools(self) -> list[hr.InjectedTool]:
        return [hr.InjectedTool("routed", ECHO_SCHEMA, "Routed.",
                                timeout=self.timeout)]

    timeout: float = 60

    async def route(self, c: hr.RoutedCall) -> hr.RoutedCapture | None:
        out: hr.RoutedCapture | None = await self._route(c)
        return out


def _impl(host: _Host) -> ToolImpl:
    (impl,) = InjectionToolset(host).impls()
    return impl


class RoutedKind(ToolKind):
    name = "routed injected tool"
    cannot: ClassVar[Mapping[str, str]] = {
        "raising": "a router raising anything but a ToolError is IN_DOUBT by design "
                   "(tests/host/test_injection.py)",
        "with_output": "a routed capture is bytes and an exit code, with no structured output",
    }

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.count = 0

    def _subject(self, host: _Host) -> Subject:
        return Subject(impl=_impl(host), good={"text": "hello contract"}, bad=[{"text": 1}],
                       context={"workspace": self.workspace}, runs=lambda: self.count)

    def echo(self) -> Subject:
        async def route(c: hr.RoutedCall) -> hr.RoutedCapture:
            self.count += 1
            return hr.RoutedCapture(stdout=c.input["text"].encode())

        subject = self._subject(_Host(route))
        return Subject(impl=subject.impl, good=subject.good, bad=subject.bad,
                       expect_text="hello contract", context=subject.context,
                       runs=subject.runs)

    def returns_error(self) -> Subject:
        async def route(c: hr.RoutedCall) -> hr.RoutedCapture:
            return hr.RoutedCapture(stdout=b"", stderr=b"endpoint gone", exit_code=1)

        return self._subject(_Host(route))

    def raising(self, exc: BaseException) -> Subject | None:
        if not isinstance(exc, ToolError):
            return None

        async def route(c: hr.RoutedCall) -> hr.RoutedCapture:
            raise exc

        return self._subject(_Host(route))

    def blocking(self, started: anyio.Event, cleaned: list[bool], *,
                 timeout: float | None = None) -> Subject:
        async def route(c: hr.RoutedCall) -> hr.RoutedCapture:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cleaned.append(True)
            raise AssertionError("unreachable")

        host = _Host(route)
        host.timeout = timeout or 60
        return self._subject(host)


class TestSubprocessTool(ToolImplContract):
    @pytest.fixture
    def kind(self, workspace: Path) -> ToolKind:
        return SubprocessKind(workspace)


class TestRoutedTool(ToolImplContract):
    @pytest.fixture
    def kind(self, workspace: Path) -> ToolKind:
        return RoutedKind(workspace)
