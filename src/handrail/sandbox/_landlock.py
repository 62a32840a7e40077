"""Landlock (the kernel's own access control, no namespaces needed): the fallback mechanism.

Used where bubblewrap cannot run. Landlock grants rights on hierarchies and cannot take one
file out of a granted folder, so it gives: the filesystem read-only except the workspace,
`/tmp` (shared, not private) and `/dev`; no TCP (ABI 4 and later) unless the policy allows
NET. It cannot hide a READ-denied file nor protect a WRITE-denied one inside the workspace.
Without a network namespace, "no network" also needs a seccomp filter (`_seccomp`, handed
over in SPEC): `socket()` is refused for every family (UDP, unix-domain, netlink, raw).

Applied by a small launcher, `python -I -S .../_landlock.py SPEC -- argv...`: it becomes a
subreaper and forks; the child restricts itself (no_new_privs, the ruleset, the seccomp
filter) and execs the program, which inherits the restriction and can never lift it. The
launcher waits for it, and when it ends kills whatever it left behind (`setsid()` or not).
`sandbox="off"` uses the same launcher without any restriction, for the reaping alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import struct
import sys

__all__ = ["abi", "children_of", "descendants", "install_seccomp", "kill_descendants",
           "launcher_argv", "restrict"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_IOCTL_DEV = 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1


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


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program: bytes) -> None:
    """Load a seccomp filter (`struct sock_filter[]` as bytes) on this process, for good.

    Needs `no_new_privs` (set by `restrict` first).

    Raises:
        OSError: the kernel refused it.
    """
    if not program or len(program) % 8:
        raise OSError("a seccomp filter is a non-empty array of 8-byte instructions")
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    libc = _libc()
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def restrict(writable: list[str], *, deny_tcp: bool, seccomp: bytes | None = None) -> None:
    """Restrict this process (and what it execs): read everywhere, write only in `writable`.

    `seccomp`: a filter loaded last (the sockets a program without network may not make).

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
    if version >= 6:
        # No signal to a process outside the domain (the reaper above it, handrail, the
        # user's other programs); no abstract unix socket outside it either.
        attr = struct.pack("=QQQ", handled, net, _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL)
    else:
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
    if seccomp is not None:
        install_seccomp(seccomp)


def launcher_argv(argv: list[str], *, writable: list[str], deny_tcp: bool,
                  seccomp: bytes | None = None, landlock: bool = True) -> list[str]:
    """The argv that runs `argv` through this module's launcher (under Landlock by default).

    `seccomp`: a filter the launcher loads after Landlock (see `restrict`). `landlock=False`:
    no restriction at all (`sandbox="off"`), only the reaper (`_reap`): every descendant of
    the program dies with it.
    """
    spec = json.dumps({"landlock": landlock, "writable": writable, "deny_tcp": deny_tcp,
                       **({"seccomp": seccomp.hex()} if seccomp is not None else {})})
    # The file itself, not `-m`, and no `site` (-S): only the standard library is imported
    # before the program; that halves the launcher's start (about 40 ms against 80).
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), spec, "--", *argv]


_PR_SET_CHILD_SUBREAPER = 36
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def children_of(pid: int) -> list[int]:
    """The live children of process `pid` (zombies left out); [] when it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found += [int(c) for c in fh.read().split()]
        except FileNotFoundError:
            return _children_by_scan(pid)  # a kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue
    return [c for c in found if _state(c) not in ("Z", "X", "")]


def _stat(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return []
    # The command name may hold spaces and parentheses: the fields follow the last ')'.
    return data[data.rindex(b")") + 2:].split()


def _state(pid: int) -> str:
    fields = _stat(pid)
    return fields[0].decode() if fields else ""


def _children_by_scan(pid: int) -> list[int]:
    out: list[int] = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if len(fields) > 1 and int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                out.append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, parents before their children."""
    out: list[int] = []
    stack = [pid]
    seen = {pid}
    while stack:
        for kid in children_of(stack.pop()):
            if kid not in seen:
                seen.add(kid)
                out.append(kid)
                stack.append(kid)
    return out


def kill_descendants(pid: int, *, rounds: int = 200, reap: bool = True) -> None:
    """SIGKILL every descendant of `pid`, again until none is left (or `rounds` passes).

    Each are stopped first, so a descendant cannot fork faster than it is killed; the
    ones born meanwhile are found on the next round (a subreaper `pid` keeps them in its
    tree). Killing a process we may not signal (PermissionError) is skipped. `reap`: also
    reap our own children that ended (only where nobody else waits for them: the launcher).
    """
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for kid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(kid, sig)
        if reap:
            _reap_any()


def _reap_any() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _reap(program: list[str], spec: dict[str, object]) -> None:
    """Run `program` as our child, as a subreaper: no descendant of it outlives it.

    Every process the program starts, `setsid()` and double forks included, stays below
    this one (`PR_SET_CHILD_SUBREAPER`: an orphan is re-parented here, not to init). When
    the program ends, everything left below is killed; then this process exits as the
    program did (its code, or the same signal). SIGTERM, SIGINT, SIGHUP and SIGQUIT are
    passed to every descendant (a new session does not hide from them); whoever stops us
    for good kills the descendants first (`kill_descendants` on our pid), then us.
    """
    libc = _libc()
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        sys.stderr.write("handrail: could not become a subreaper; the program was not run\n")
        raise SystemExit(126)
    child = -1

    def forward(sig: int, _frame: object) -> None:
        for kid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(kid, sig)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    child = os.fork()
    if child == 0:
        try:
            for sig in _FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            if spec.get("landlock", True):
                seccomp = spec.get("seccomp")
                try:
                    restrict([str(w) for w in spec["writable"]],  # type: ignore[attr-defined]
                             deny_tcp=bool(spec["deny_tcp"]),
                             seccomp=bytes.fromhex(seccomp) if isinstance(seccomp, str)
                             else None)
                except OSError as exc:
                    sys.stderr.write(f"handrail: Landlock could not confine the program, "
                                     f"not run: {exc}\n")
                    os._exit(126)
            try:
                os.execvp(program[0], program)
            except FileNotFoundError:
                sys.stderr.write(f"handrail: {program[0]!r} was not found\n")
                os._exit(127)
            except OSError as exc:
                sys.stderr.write(f"handrail: could not start {program[0]!r}: {exc}\n")
                os._exit(126)
        finally:
            os._exit(126)
    # Our copies of the pipes would keep them open past the program's end.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    status = 0
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if done == child:
            break
    kill_descendants(os.getpid())
    with contextlib.suppress(ChildProcessError):  # the killed ones: none left a zombie
        while os.waitpid(-1, 0)[0] > 0:
            pass
    if os.WIFSIGNALED(status):
        # Ended as the program did: the same signal (no core of ours for SIGSEGV and kin).
        import resource

        ended_by = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be changed
            signal.signal(ended_by, signal.SIG_DFL)
        os.kill(os.getpid(), ended_by)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python _landlock.py SPEC -- argv...\n")
        raise SystemExit(2)
    spec = json.loads(args[0])
    _reap(args[2:], spec)


if __name__ == "__main__":
    _main(sys.argv[1:])
