import subprocess
import sys
from typing import Any

import pytest

import handrail as hr
import handrail.builtin
from handrail.builtin import workspace_tools
from handrail.tools import as_impl

pytestmark = pytest.mark.anyio


def test_all_is_pinned() -> None:
    assert handrail.builtin.__all__ == sorted(handrail.builtin.__all__)
    assert handrail.builtin.__all__ == [
        "EditFile", "Exec", "Fetch", "ListDir", "ReadFile", "Search", "WriteFile",
        "workspace_tools",
    ]


def test_workspace_tools_are_the_seven_on_server_workspace() -> None:
    box = hr.Toolbox(workspace_tools())
    assert [(str(s.id), s.mutates) for s in box.specs()] == [
        ("workspace/read_file", False),
        ("workspace/write_file", True),
        ("workspace/edit_file", True),
        ("workspace/list_dir", False),
        ("workspace/search", False),
        ("workspace/exec", True),
        ("workspace/fetch", False),
    ]
    assert all(s.description for s in box.specs())


def actions(tool: object, arguments: dict[str, Any]) -> list[hr.Action]:
    impl = as_impl(tool)
    return impl.actions(impl.validate(arguments))


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        (handrail.builtin.ReadFile, {"path": "src/../a.py"},
         [hr.Action(hr.Act.READ, "src/../a.py")]),
        (handrail.builtin.ListDir, {}, [hr.Action(hr.Act.READ, ".")]),
        (handrail.builtin.ListDir, {"path": "src"}, [hr.Action(hr.Act.READ, "src")]),
        (handrail.builtin.Search, {"pattern": "x"}, [hr.Action(hr.Act.READ, ".")]),
        (handrail.builtin.Search, {"pattern": "x", "path": "lib"}, [hr.Action(hr.Act.READ, "lib")]),
        (handrail.builtin.WriteFile, {"path": "a.txt", "content": "é\n"},
         [hr.Action(hr.Act.WRITE, "a.txt", content="é\n".encode())]),
        (handrail.builtin.EditFile, {"path": "a.txt", "old": "a", "new": "b"},
         [hr.Action(hr.Act.WRITE, "a.txt", content=None)]),
        (handrail.builtin.Exec, {"argv": ["git", "status"]},
         [hr.Action(hr.Act.EXEC, ("git", "status"))]),
        (handrail.builtin.Fetch, {"url": "https://Example.com/a?b=c"},
         [hr.Action(hr.Act.NET, "example.com:443")]),
        (handrail.builtin.Fetch, {"url": "http://example.com/"},
         [hr.Action(hr.Act.NET, "example.com:80")]),
        (handrail.builtin.Fetch, {"url": "http://example.com:8080/"},
         [hr.Action(hr.Act.NET, "example.com:8080")]),
        (handrail.builtin.Fetch, {"url": "http://[::1]:9000/"},
         [hr.Action(hr.Act.NET, "[::1]:9000")]),
        (handrail.builtin.Fetch, {"url": "https://bücher.example/"},
         [hr.Action(hr.Act.NET, "xn--bcher-kva.example:443")]),
    ],
)
def test_actions(tool: object, arguments: dict[str, Any], expected: list[hr.Action]) -> None:
    assert actions(tool, arguments) == expected


def test_importing_the_tools_does_not_import_httpx() -> None:
    code = "import sys; sys.modules['httpx'] = None; import handrail.builtin; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.stdout.strip() == "ok", done.stderr
