"""Confining the programs handrail starts, derived from the policy in force (docs/sandbox.md).

`wrap(argv, policy=..., workspace=..., mode=...)` is the one function every place that
spawns a program calls: it returns the argv to actually run (the program behind a
bubblewrap prefix, or unchanged) and the record of how it was confined.
"""

from handrail.sandbox._landlock import abi as landlock_abi
from handrail.sandbox._sandbox import (
    BWRAP_ENV,
    MAX_WALK_ENTRIES,
    SANDBOX_MODES,
    Sandbox,
    SandboxUnavailable,
    build,
    find_bwrap,
    wrap,
)

__all__ = [
    "BWRAP_ENV",
    "MAX_WALK_ENTRIES",
    "SANDBOX_MODES",
    "Sandbox",
    "SandboxUnavailable",
    "build",
    "find_bwrap",
    "landlock_abi",
    "wrap",
]
