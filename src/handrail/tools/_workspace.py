"""Path confinement: every READ/WRITE target is canonicalised against the workspace root.

Matching sees only the canonical, workspace-relative POSIX path. A target that resolves outside
the workspace (through `..`, an absolute path or a symlink), or that cannot be canonicalised
(NUL byte, invalid encoding, empty), raises, and the policy turns that into Deny whatever the
rules say.

Resolution follows the kernel's order: components are taken left to right, each symlink is
replaced by its target before the next component is read, and `..` removes the component
resolved so far (so `link/..` is the link target's parent, not the directory holding the
link). This is `os.path.realpath`, which already does exactly that; the code here only adds the
refusals and the confinement test. A symlink loop is left unresolved (the kernel would refuse
to open such a path anyway), and the result is still held to the workspace.

`os.path.realpath` is Python: an `lstat` and string work per component, ~30 µs a check on a
path four deep. On Linux an existing path is resolved by the kernel instead (`real_path`: an
`O_PATH` open, which reads nothing and has no side effect, and its name in `/proc/self/fd`),
three system calls whatever the depth; anything else (a missing file, a dangling link, a
loop, no `/proc`) goes to `os.path.realpath`, so the answer is the same either way. A path
checked again is not resolved again while no directory entry its resolution read has changed
(`kept_real_path`, watched with inotify: `handrail.tools._watched`).

What canonicalisation cannot see: a hard link (two names, one file) and a symlink created
between the check and the use. Neither can be made without a WRITE or an EXEC, which the policy
decides first.
"""

from __future__ import annotations

import os
from pathlib import Path

from handrail.tools._watched import WatchedAnswers

__all__ = [
    "PATH_MAX",
    "OutsideWorkspace",
    "UncanonicalPath",
    "UncanonicalTarget",
    "canonical_path",
    "canonicalize",
    "resolve_in_workspace",
    "workspace_root",
]


PATH_MAX = 4096
"""The longest path (in UTF-8 bytes) a READ/WRITE target may have: Linux's PATH_MAX. A longer
one cannot be opened by the kernel anyway, and matching it would let a model choose how long
the policy works; it is refused before anything else looks at it."""


class UncanonicalTarget(ValueError):
    """An action's target cannot be put in canonical form (so no rule can judge it)."""


class UncanonicalPath(UncanonicalTarget):
    """The target cannot be canonicalised (NUL byte, invalid encoding, empty)."""


class OutsideWorkspace(ValueError):
    """The target resolves outside the workspace root."""


def workspace_root(workspace: str | os.PathLike[str] | None) -> str:
    """The absolute, symlink-free workspace root (`None` is the current directory)."""
    if workspace is None:
        # getcwd() is already physical on POSIX, but realpath keeps Windows and odd mounts honest.
        return os.path.realpath(os.getcwd())
    return os.path.realpath(os.fspath(workspace))


def _check_text(target: object) -> str:
    if not isinstance(target, str):
        raise UncanonicalPath(f"a path must be a string, not {type(target).__name__}")
    if not target:
        raise UncanonicalPath("the path is empty")
    if "\x00" in target:
        raise UncanonicalPath("the path contains a NUL byte")
    if len(target) > PATH_MAX:
        raise UncanonicalPath(
            f"the path is {len(target)} characters long; at most {PATH_MAX} "
            "bytes (the OS's PATH_MAX) can name a file"
        )
    try:
        size = len(target.encode("utf-8"))
    except UnicodeEncodeError:
        raise UncanonicalPath("the path is not valid UTF-8 (lone surrogate)") from None
    if size > PATH_MAX:
        raise UncanonicalPath(
            f"the path is {size} bytes long in UTF-8; at most {PATH_MAX} "
            "bytes (the OS's PATH_MAX) can name a file"
        )
    return target


_O_PATH = getattr(os, "O_PATH", 0)
_by_kernel = _O_PATH != 0 and os.path.isdir("/proc/self/fd")


def _kernel_name(path: str, flags: int) -> str | None:
    """The kernel's physical name for `path` (every link followed), or None."""
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC | flags)
    except OSError:
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)
    # Not a plain absolute path: a file deleted meanwhile reads `... (deleted)`.
    return name if name.startswith("/") and not name.endswith(" (deleted)") else None


def real_path(path: str) -> str:
    """`os.path.realpath(path)` for an absolute `path`, resolved by the kernel when it can be.

    The kernel's name for an open file is its physical path, every symlink followed, `..`
    taken after the link it follows, as `realpath` does. A missing last component (a file
    about to be written) is its directory's name and the component, when nothing of that
    name exists (not even a dangling link). Anything else (a missing directory, a dangling
    link, a loop, no permission, no `/proc`) is left to `os.path.realpath`.
    """
    if _by_kernel:
        name = _kernel_name(path, 0)
        if name is not None:
            return name
        head, tail = os.path.split(path)
        if tail not in ("", ".", "..") and (parent := _kernel_name(head, os.O_DIRECTORY)):
            try:
                os.lstat(path)
            except FileNotFoundError:
                return parent.rstrip("/") + "/" + tail
            except OSError:
                pass
    return os.path.realpath(path)


_kept = WatchedAnswers[str, str](attributes=False)
"""Resolutions kept while no directory entry they read has changed (`WatchedAnswers`): the
same path is checked again and again (by the policy, then at the moment of use), and its
three to five system calls were most of a repeated READ check."""


def kept_real_path(path: str) -> str:
    """`real_path(path)`, kept while nothing the resolution reads on disk has changed."""
    return _kept.real_path(path, real_path)


def _resolve(target: str, root: str) -> str:
    # `os.path.join`, spelt out: a third of a repeated check was its generality.
    if target.startswith("/"):
        joined = target
    else:
        joined = root + target if root.endswith("/") else root + "/" + target
    try:
        resolved = kept_real_path(joined)
    except (OSError, ValueError) as exc:
        raise UncanonicalPath(f"the path cannot be resolved: {exc}") from None
    if len(resolved) > PATH_MAX:
        # A short target can grow through symlinks; the cap holds for what is matched.
        raise UncanonicalPath(
            f"the path resolves to {len(resolved)} characters; at most "
            f"{PATH_MAX} (the OS's PATH_MAX) can name a file"
        )
    if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
        raise OutsideWorkspace(f"{target!r} resolves outside the workspace")
    return resolved


def canonical_path(target: str, root: str) -> str:
    """`canonicalize` against an already-resolved root (see `workspace_root`).

    Raises:
        UncanonicalPath: the target cannot be canonicalised.
        OutsideWorkspace: it resolves outside the workspace.
    """
    resolved = _resolve(_check_text(target), root)
    if resolved == root:
        return "."
    rel = resolved[len(root.rstrip(os.sep)) + 1 :]
    return rel if os.sep == "/" else rel.replace(os.sep, "/")


def resolve_in_workspace(target: str, workspace: str | os.PathLike[str]) -> Path:
    """The absolute, symlink-resolved path of `target` inside `workspace`.

    Relative targets are taken from the workspace root. `..` and `.` are collapsed and
    symlinks resolved (in order, so `link/..` means the link's parent), repeated slashes folded.

    Raises:
        UncanonicalPath: the target cannot be canonicalised.
        OutsideWorkspace: it resolves outside the workspace.
    """
    return Path(_resolve(_check_text(target), workspace_root(workspace)))


def canonicalize(target: str, workspace: str | os.PathLike[str]) -> str:
    """The canonical workspace-relative POSIX path of `target` (`"."` for the root).

    Raises:
        UncanonicalPath: the target cannot be canonicalised.
        OutsideWorkspace: it resolves outside the workspace.
    """
    return canonical_path(target, workspace_root(workspace))
