"""Confined file access for the workspace tools.

A path is decided and used as one thing. The tools' path arguments are `hr.ReadPath` /
`hr.WritePath`: the gate canonicalised the path when the policy decided, canonicalised it again
at the moment of use (refusing the call if it changed), and hands the body the canonical
absolute path. The body never resolves it again: it walks from the workspace root one
component at a time with `dir_fd` and `O_NOFOLLOW`, so a symlink met on the way (one swapped in
after the last check) fails the walk (ELOOP or ENOTDIR) instead of being followed, and a
symlink at the last component is refused rather than read through or replaced.

Hard links: a write never goes through a file's other names. `atomic_write` writes a new file
and renames it over the name, so another name of the old file (inside or outside the
workspace) keeps the old bytes. A read of a file with several names reads that file: creating
the second name needed a WRITE or EXEC that the policy decided first.

This needs POSIX `dir_fd` support (Linux, macOS, the BSDs); elsewhere the tools refuse to run
rather than run unconfined.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from handrail.errors import UserError
from handrail.policy import OutsideWorkspace, UncanonicalPath, resolve_in_workspace
from handrail.tools import CallContext

__all__ = [
    "Place",
    "Refusal",
    "atomic_write",
    "describe_os_error",
    "locate",
    "open_dir",
    "open_file",
    "place_of",
    "shown_path",
    "workspace_root",
]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
_SUPPORTED = (
    bool(_O_NOFOLLOW and _O_DIRECTORY)
    and os.open in os.supports_dir_fd
    and os.mkdir in os.supports_dir_fd
    # os.replace takes the same src_dir_fd/dst_dir_fd as os.rename but is not listed itself.
    and os.rename in os.supports_dir_fd
    and os.stat in os.supports_dir_fd
)


class Refusal(Exception):
    """A model-visible reason the tool did not do what was asked; the message is for the model."""


@dataclass(frozen=True, slots=True)
class Place:
    """A path the model gave, resolved inside the workspace."""

    root: str
    """The workspace root, symlinks resolved."""
    parts: tuple[str, ...]
    """The components from the root to the target; empty for the root itself."""
    shown: str
    """The workspace-relative POSIX path, `.` for the root: what the model is shown."""

    @property
    def name(self) -> str:
        """The last component (the root has none; callers check `parts` first)."""
        return self.parts[-1]


def workspace_root(ctx: CallContext, *, files: bool = True) -> str:
    """The real path of the call's workspace.

    Args:
        ctx: The call's context.
        files: The tool touches files by path, so needs the platform's confinement support.

    Raises:
        UserError: the call has no workspace, or it is not an existing directory.
    """
    workspace = ctx.workspace
    if workspace is None:
        raise UserError(
            f"tool '{ctx.tool_id}' needs an agent workspace and this call has none: give the "
            "agent a workspace (or pass workspace= to Toolbox.handler)"
        )
    if files and not _SUPPORTED:
        raise UserError(
            f"tool '{ctx.tool_id}' confines paths with POSIX dir_fd/O_NOFOLLOW, which this "
            "platform lacks; the workspace tools refuse to run unconfined"
        )
    root = os.path.realpath(os.fspath(workspace))
    if not os.path.isabs(os.fspath(workspace)) or not os.path.isdir(root):
        raise UserError(
            f"tool '{ctx.tool_id}': the workspace {os.fspath(workspace)!r} must be an absolute "
            "path to an existing directory"
        )
    return root


def locate(root: str, path: str) -> Place:
    """Resolve `path` (as the model gave it) inside the workspace at `root`.

    Raises:
        Refusal: the path is outside the workspace or cannot be canonicalised.
    """
    try:
        resolved = resolve_in_workspace(path, root)
    except OutsideWorkspace:
        raise Refusal(
            f"the path {path!r} is outside the workspace; only paths inside it can be used "
            "(relative paths start at the workspace root)"
        ) from None
    except UncanonicalPath as exc:
        raise Refusal(f"the path {path!r} is not usable: {exc}") from None
    parts = resolved.relative_to(root).parts if str(resolved) != root else ()
    return Place(root, tuple(parts), "/".join(parts) or ".")


def place_of(root: str, path: str | os.PathLike[str]) -> Place:
    """The `Place` of a path the gate bound (absolute, canonical), or of a model's path.

    An absolute path is taken as it is, never resolved again: it is what the policy decided,
    and the walk refuses any symlink on it. It must lie lexically inside `root`. A relative
    path (a body called directly, without the gate or a handler) is resolved as `locate` does.

    Raises:
        Refusal: the path is outside the workspace or not in canonical form.
    """
    text = os.fspath(path)
    if not os.path.isabs(text):
        return locate(root, text)
    if os.path.normpath(text) != text or text.startswith("//"):
        raise Refusal("the path is not in canonical form; give a path relative to the "
                      "workspace root")
    if text == root:
        return Place(root, (), ".")
    prefix = root.rstrip(os.sep) + os.sep
    if not text.startswith(prefix):
        raise Refusal("the path is outside the workspace; only paths inside it can be used "
                      "(relative paths start at the workspace root)")
    parts = tuple(text[len(prefix):].split(os.sep))
    return Place(root, parts, "/".join(parts))


def _open_dir_fd(place: Place, parts: tuple[str, ...], *, create: bool) -> int:
    fd = os.open(place.root, _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def open_dir(place: Place, *, parent: bool = False, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory at `place` (or of its parent), closed on exit.

    Args:
        place: Where to go.
        parent: Open the directory holding the target rather than the target.
        create: Create missing directories on the way (inside the workspace only).

    Raises:
        OSError: a component is missing, not a directory, or became a symlink (ELOOP).
    """
    parts = place.parts[:-1] if parent else place.parts
    fd = _open_dir_fd(place, parts, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(place: Place) -> int:
    """A read-only descriptor of the regular file at `place`; the caller closes it.

    Opened non-blocking, so a FIFO cannot hang the call, then checked to be a regular file.

    Raises:
        Refusal: the target is the workspace root, a directory or not a regular file.
        OSError: it is missing or became a symlink (ELOOP).
    """
    if not place.parts:
        raise Refusal("the workspace root is a directory; use list_dir to see what it holds")
    with open_dir(place, parent=True) as parent:
        fd = os.open(place.name, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK,
                     dir_fd=parent)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Refusal(f"{place.shown} is a directory; use list_dir to see what it holds")
        if not stat.S_ISREG(mode):
            raise Refusal(f"{place.shown} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def atomic_write(place: Place, data: bytes) -> None:
    """Replace the file at `place` with `data` atomically, creating parent directories.

    The bytes go to a temporary file in the same directory, are flushed to disk, and the
    temporary file is renamed over the target: a reader sees the old file or the new one,
    never a mix. An existing file keeps its permission bits.

    Raises:
        Refusal: the target is the workspace root or a directory.
        OSError: the write failed (the target is unchanged).
    """
    if not place.parts:
        raise Refusal("the workspace root is a directory, not a file; name a file inside it")
    with open_dir(place, parent=True, create=True) as parent:
        try:
            old = os.stat(place.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise Refusal(f"{place.shown} is a directory; name a file")
        if old is not None and stat.S_ISLNK(old.st_mode):
            # Renaming over it would replace the link, not write where it leads; either way
            # the call would not do what was decided, so it does nothing.
            raise Refusal(f"{place.shown} is a symlink (it became one after the check); "
                          "refused, nothing was written")
        # A short name: the target's own name may already be at the length limit.
        tmp = f".handrail-{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                     0o666, dir_fd=parent)
        try:
            try:
                if old is not None and stat.S_ISREG(old.st_mode):
                    os.fchmod(fd, stat.S_IMODE(old.st_mode))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, place.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            raise
        # Persist the rename too; some filesystems refuse fsync on a directory, and the
        # file's bytes are already safe, so that refusal is not worth failing the call over.
        with contextlib.suppress(OSError):
            os.fsync(parent)


def describe_os_error(exc: OSError, path: str) -> str:
    """A model-facing sentence for a failed file operation on `path`."""
    code = exc.errno
    if code == errno.ENOENT:
        return f"{path} does not exist"
    if code == errno.ENOTDIR:
        return f"a component of {path} is not a directory (or changed while in use)"
    if code == errno.ELOOP:
        return f"{path} changed into a symlink while in use; refused"
    if code == errno.EISDIR:
        return f"{path} is a directory"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied for {path}"
    if code == errno.ENOSPC:
        return f"no space left on the device writing {path}"
    if code == errno.ENAMETOOLONG:
        return f"a name in {path} is too long"
    return f"{path}: {exc.strerror or exc}"


def shown_path(place: Place, *more: str) -> str:
    """The workspace-relative POSIX path of `more` under `place`."""
    joined = Path(*place.parts, *more)
    return joined.as_posix() if joined.parts else "."
