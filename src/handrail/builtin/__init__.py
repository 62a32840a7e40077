"""The built-in workspace tools, all on server `workspace`.

```python
box = hr.Toolbox(workspace_tools())
```

| tool                   | touches                  | mutates |
|------------------------|--------------------------|---------|
| `workspace/read_file`  | READ path                | no      |
| `workspace/write_file` | WRITE path (its bytes)   | yes     |
| `workspace/edit_file`  | WRITE path (no bytes)    | yes     |
| `workspace/list_dir`   | READ path                | no      |
| `workspace/search`     | READ path                | no      |
| `workspace/exec`       | EXEC argv                | yes     |
| `workspace/fetch`      | NET host:port            | no      |

Every path is confined to the agent's workspace (`CallContext.workspace`): the policy checks
the path as given, and each body resolves it again and opens it without following symlinks,
so `..`, absolute paths and symlinks leading outside are refused whatever the rules say.
"""

from __future__ import annotations

from handrail.builtin._exec import Exec
from handrail.builtin._fetch import Fetch
from handrail.builtin._files import EditFile, ListDir, ReadFile, Search, WriteFile
from handrail.tools import Tool

__all__ = [
    "EditFile",
    "Exec",
    "Fetch",
    "ListDir",
    "ReadFile",
    "Search",
    "WriteFile",
    "workspace_tools",
]


def workspace_tools() -> list[type[Tool]]:
    """The seven workspace tools, for `hr.Toolbox(workspace_tools())`.

    In order: read_file, write_file, edit_file, list_dir, search, exec, fetch.
    """
    return [ReadFile, WriteFile, EditFile, ListDir, Search, Exec, Fetch]
