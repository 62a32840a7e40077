"""Landlock (the kernel's own access control, no namespaces needed): the fallback mechanism.

Used where bubblewrap cannot run. Landlock grants rights on hierarchies and cannot take one
file out of a granted folder, so it gives: the filesystem read-only except the workspace,
`/tmp` (shared, not private) and `/dev`; no TCP (ABI 4 and later) unless the policy allows
NET. It cannot hide a READ-denied file nor protect a WRITE-denied one inside the workspace.

Applied by a small launcher, `python -I .../_landlock.py SPEC -- argv...`: it
restricts itself (no_new_privs, then the ruleset) and execs the program, which inherits the
restriction and can never lift it.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys

__all__ = ["abi", "launcher_argv", "restrict"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_IOCTL_DEV = 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The Landlock ABI version the kernel offers; 0 when it offers none."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = int(_libc().syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _fs_handled(version: int) -> int:
    if version >= 5:
        return (1 << 16) - 1
    if version >= 3:
        return (1 << 15) - 1
    if version >= 2:
        return (1 << 14) - 1
    return (1 << 13) - 1


def restrict(writable: list[str], *, deny_tcp: bool) -> None:
    """Restrict this process (and what it execs): read everywhere, write only in `writable`.

    Raises:
        OSError: the kernel refused a step (the process is then not restricted: do not run
            the program).
    """
    libc = _libc()
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available in this kernel")
    handled = _fs_handled(version)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if deny_tcp and version >= 4 else 0
    attr = struct.pack("=QQ", handled, net) if net else struct.pack("=Q", handled)
    fd = libc.syscall(_CREATE_RULESET, ctypes.c_char_p(attr), len(attr), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        read = _EXECUTE | _READ_FILE | _READ_DIR
        dev = read | _WRITE_FILE | (_IOCTL_DEV if version >= 5 else 0)
        rules = [("/", read), ("/dev", dev)] + [(path, handled) for path in writable]
        for path, access in rules:
            parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("=Qi", access & handled, parent)
                if libc.syscall(_ADD_RULE, fd, _RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path!r} failed")
            finally:
                os.close(parent)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_RESTRICT_SELF, fd, 0):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)


def launcher_argv(argv: list[str], *, writable: list[str], deny_tcp: bool) -> list[str]:
    """The argv that runs `argv` under Landlock through this module's launcher."""
    spec = json.dumps({"writable": writable, "deny_tcp": deny_tcp})
    # The file itself, not `-m`, and no `site` (-S): only the standard library is imported
    # before the program; that halves the launcher's start (about 40 ms against 80).
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), spec, "--", *argv]


def _main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python _landlock.py SPEC -- argv...\n")
        raise SystemExit(2)
    spec = json.loads(args[0])
    try:
        restrict(list(spec["writable"]), deny_tcp=bool(spec["deny_tcp"]))
    except OSError as exc:
        sys.stderr.write(f"handrail: Landlock could not confine the program, not run: {exc}\n")
        raise SystemExit(126) from None
    os.execvp(args[2], args[2:])


if __name__ == "__main__":
    _main(sys.argv[1:])
