"""`hr.mcp.__all__` is pinned; `hr.mcp` loads lazily and without importing the SDK."""

from __future__ import annotations

import subprocess
import sys

import handrail as hr

EXPECTED = [
    "ArgumentAction", "Gateway", "GatewaySession", "MCPTool", "MCPToolset", "ServerDecl",
    "check_with_servers", "connect_servers", "from_mcp_result", "hint_problems",
    "map_mcp_error", "serve_http", "to_mcp_result",
]


def test_all_is_pinned_sorted_and_documented() -> None:
    assert sorted(EXPECTED) == EXPECTED
    assert hr.mcp.__all__ == EXPECTED
    for name in EXPECTED:
        obj = getattr(hr.mcp, name)
        assert obj.__doc__ and obj.__doc__.strip(), name
    assert "mcp" in dir(hr)


def test_importing_handrail_or_hr_mcp_does_not_import_the_sdk() -> None:
    code = ("import sys, handrail as hr; hr.mcp.MCPToolset; "
            "print('mcp' in sys.modules, 'mcp_types' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]
