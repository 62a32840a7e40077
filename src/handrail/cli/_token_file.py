"""Token files of `handrail serve` and `handrail inbox`: read only when private, written private.

A token file holds a secret that calls tools or decides approvals; one that other users can
read is refused, as ssh refuses a private key others can read. A token handrail makes itself
goes into a new file only its user can read, and the command prints where the file is,
never the token (service logs keep what a program prints).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile

from handrail.errors import UserError

__all__ = ["MIN_TOKEN_CHARS", "read_token_file", "remove_token_file", "write_token_file"]

MIN_TOKEN_CHARS = 16
"""The shortest token accepted from a file."""


def read_token_file(path: str, *, option: str = "--token-file") -> str:
    """The token in `path`, refused when others can read the file or it is too short.

    Raises:
        UserError: unreadable, readable by group or others, or shorter than
            `MIN_TOKEN_CHARS` (the message says how to fix it).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"cannot read {option} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)  # the file read, not whatever the path names a moment later
        if os.name == "posix" and info.st_mode & 0o077:
            raise UserError(
                f"{option} {path} can be read by other users (mode "
                f"{stat.filemode(info.st_mode)}): a token others can read is refused, as ssh "
                f"refuses such a private key; run `chmod 600 {path}`")
        with os.fdopen(fd, encoding="utf-8") as fh:
            fd = -1
            token = fh.read(64 * 1024).strip()
    finally:
        if fd >= 0:
            os.close(fd)
    if len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"the token in {path} is shorter than {MIN_TOKEN_CHARS} characters; "
                        "put a long random token there (e.g. `python -c 'import secrets; "
                        "print(secrets.token_urlsafe(32))'`)")
    return token


def write_token_file(token: str, *, prefix: str) -> str:
    """Write `token` into a new file only this user can read (in a new private folder).

    Returns:
        The file's path; the caller removes it (and its folder) when it stops.
    """
    folder = tempfile.mkdtemp(prefix=prefix)  # 0700
    path = os.path.join(folder, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return path


def remove_token_file(path: str) -> None:
    """Remove a file `write_token_file` made, and its folder."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))
