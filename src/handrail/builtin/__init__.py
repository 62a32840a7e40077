"""The built-in workspace tools, all on server `workspace`.

```python
box = hr.Toolbox(workspace_tools())
```

| tool                   | touches                  | mutates | protected (taint) | output    |
|------------------------|--------------------------|---------|-------------------|-----------|
| `workspace/read_file`  | READ path                | no      |                   | untrusted |
| `workspace/write_file` | WRITE path (its bytes)   | yes     | `/path`           | trusted   |
| `workspace/edit_file`  | WRITE path (no bytes)    | yes     | `/path`           | trusted   |
| `workspace/list_dir`   | READ path                | no      |                   | untrusted |
| `workspace/search`     | READ path                | no      |                   | untrusted |
| `workspace/exec`       | EXEC argv                | yes     | `/argv`           | untrusted |
| `workspace/fetch`      | NET host:port            | no      | `/url`            | untrusted |

A protected argument whose value appeared in untrusted output earlier in the run makes an
allowed call ask a person (docs/taint.md). `fetch` changes nothing here, but its URL can
carry data out. `write_file` and `edit_file` only echo the path they were given.

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
