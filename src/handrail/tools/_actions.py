"""What a call touches: `Act` and `Action`.

These live with the tools (a tool's `actions()` returns them) and are re-exported by
`handrail.policy`, which decides over them; keeping them here lets `tools` depend on nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Act", "Action"]


class Act(enum.Enum):
    """The kind of thing an action does."""

    READ = "read"
    """Read a file or directory; the target is a path, confined to the workspace."""
    WRITE = "write"
    """Create, change or delete a file; the target is a path; `content` carries the bytes."""
    EXEC = "exec"
    """Run a program; the target is the argv (a list, never a shell string)."""
    NET = "net"
    """Reach a network host; the target is `host:port` or `host`."""
    CALL = "call"
    """Call a tool; the target is `server/name` plus whatever the tool's `actions()` adds."""


@dataclass(frozen=True, kw_only=False, slots=True)
class Action:
    """One thing a call touches, as the policy sees it.

    `Action(Act.WRITE, "src/app.py", content=b"...")`; for EXEC the target is the argv as a
    tuple of strings (`Action(Act.EXEC, ("git", "status"))`).
    """

    act: Act
    """What the action does."""
    target: str | tuple[str, ...]
    """What it does it to: a path, an argv, `host:port`, or `server/name[/...]`."""
    content: bytes | None = None
    """The bytes a WRITE would put, so an approver sees exactly what lands."""

    def __post_init__(self) -> None:
        if not isinstance(self.act, Act):
            raise TypeError(f"Action.act must be an hr.Act, not {self.act!r}")
        if self.act is Act.EXEC:
            if isinstance(self.target, str) or not all(isinstance(a, str) for a in self.target):
                raise TypeError(
                    "an EXEC action's target is the argv as a tuple of strings, never a shell "
                    f"string: got {self.target!r}"
                )
            object.__setattr__(self, "target", tuple(self.target))
        elif not isinstance(self.target, str):
            raise TypeError(f"a {self.act.name} action's target must be a string")

    def describe(self) -> str:
        """A one-line rendering for people: `write src/app.py`, `exec git status`."""
        target = " ".join(self.target) if isinstance(self.target, tuple) else self.target
        return f"{self.act.value} {target}"
