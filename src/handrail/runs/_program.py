"""What a program started by a call did, for a person: exit code, output, confinement.

`exec` returns its program's exit code and output as a JSON result (with the sandbox's record
of how it was confined); a program as a tool, or an MCP server's process, records its
confinement in the result's metadata (`handrail.sandbox`). The terminal view, `handrail show`
and the inbox show that beside the call, from this one reading of a stored result: a display
must not differ from what was recorded, and a program that ran unconfined must not look like
one that ran in the sandbox.

Everything returned here is still the program's text: the caller escapes it for its medium.
"""

from __future__ import annotations

from typing import Any

__all__ = ["confinement_note", "program_of", "result_confinement", "text_lines"]

_HEAD_LINES = 8
_TAIL_LINES = 8
_LINE_CHARS = 300


def text_lines(text: str, *, head: int = _HEAD_LINES, tail: int = _TAIL_LINES,
               width: int = _LINE_CHARS) -> list[str]:
    """`text` as its first `head` and last `tail` lines, each cut at `width` characters.

    A line between them says how many were left out, so nothing is silently dropped.
    """
    lines = text.splitlines()
    if len(lines) > head + tail + 1:
        lines = [*lines[:head], f"… {len(lines) - head - tail} more lines …", *lines[-tail:]]
    return [line if len(line) <= width else line[:width - 1] + "…" for line in lines]


def result_confinement(result: Any) -> dict[str, Any] | None:
    """The sandbox's record of how a call's program was confined, when it started one."""
    if not isinstance(result, dict):
        return None
    structured = result.get("structured")
    found: Any = structured.get("sandbox") if isinstance(structured, dict) else None
    if not isinstance(found, dict):
        metadata = result.get("metadata")
        found = metadata.get("handrail.sandbox") if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else None


_INSTALL = ("install bubblewrap to confine programs (Debian/Ubuntu: apt-get install "
            "bubblewrap); docs/sandbox.md")


def confinement_note(confinement: dict[str, Any] | None) -> str | None:
    """A warning when a program ran unconfined or with denies not enforced; else None.

    None for a program bubblewrap confined as the policy says (nothing to warn about).
    """
    if not confinement:
        return None
    mechanism = confinement.get("mechanism")
    warnings = [str(w) for w in confinement.get("warnings") or () if w]
    if mechanism == "none":
        why = warnings[0] if warnings else "no sandbox was available"
        if confinement.get("mode") == "off":
            return f"UNCONFINED: {why}"
        return f"UNCONFINED: {why} — {_INSTALL}"
    not_enforced = [str(p) for p in confinement.get("not_enforced") or ()]
    if mechanism == "landlock" and not_enforced:
        shown = ", ".join(not_enforced[:5]) + (", ..." if len(not_enforced) > 5 else "")
        return (f"confined by Landlock only: the policy's denies of {shown} were NOT "
                f"enforced on the program — {_INSTALL}")
    return None


def program_of(result: Any) -> dict[str, Any] | None:
    """An `exec`-shaped result's program: exit code, timed out, note, stdout, stderr.

    None for a result that is not a program's. stdout and stderr are as the result holds them
    (the tool bounded them already: head and tail of 64 KiB each).
    """
    if not isinstance(result, dict):
        return None
    value = result.get("structured")
    if not isinstance(value, dict) or "exit_code" not in value:
        return None
    exit_code = value.get("exit_code")
    return {"exit_code": exit_code if isinstance(exit_code, int) else None,
            "timed_out": bool(value.get("timed_out")),
            "note": str(value["note"]) if value.get("note") else None,
            "stdout": value.get("stdout") if isinstance(value.get("stdout"), str) else "",
            "stderr": value.get("stderr") if isinstance(value.get("stderr"), str) else "",
            "stdout_truncated": bool(value.get("stdout_truncated")),
            "stderr_truncated": bool(value.get("stderr_truncated"))}
