"""A seccomp filter (classic BPF, built here) that keeps a confined program's sockets inside.

Why: the root filesystem a confined program sees is read-only, but connecting to a
unix-domain socket needs no write. PostgreSQL's `/run/postgresql`, `docker.sock`, D-Bus and
`/run/user/UID` would all be one `connect` away, network namespace or not (a path socket is
reached through the filesystem, which the sandbox shares read-only). A filter on `socket()`
is the one place every such socket is made: we cannot look at the path `connect` is given
(seccomp sees pointers, not what they point at), but we can refuse the socket.

Two filters, for `"network": "none"`:

- `UNIX` (under bubblewrap): `socket(AF_UNIX, ...)` is refused (EACCES). Other families are
  cut by the network namespace already (a loopback of its own). `socketpair` stays allowed
  for stream and seqpacket sockets (pipes between a program's own processes: asyncio, a
  shell's coprocesses, multiprocessing); a datagram pair is refused, since an unnamed
  datagram socket can `sendto` any path (journald, syslog, any datagram server outside).
- `ALL` (under the Landlock fallback, which has no network namespace): `socket()` is refused
  for every family (Landlock cuts TCP only; UDP, raw, netlink and unix sockets would reach
  the host). `socketpair` as above.

Both refuse `io_uring_setup` (an io_uring makes sockets and connects without the `socket`
and `connect` system calls), and kill a process that makes a system call of another ABI
than the one the filter was built for (a 32-bit `int 0x80` on x86_64 reaches `socketcall`,
x32 has numbers of its own): a filter that checked only native numbers would be bypassed.

Built for x86_64 and aarch64 (the numbers differ); `build` returns None on any other
architecture, and the caller records that the sockets are not filtered there.
"""

from __future__ import annotations

import os
import platform
import struct
import threading
from typing import Literal

__all__ = ["ARCHES", "Arch", "build", "program_for"]

Which = Literal["unix", "all"]

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # args' low 32 bits: every supported ABI is LE

_LD_W_ABS = 0x20   # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15      # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35      # BPF_JMP | BPF_JGE | BPF_K
_AND_K = 0x54      # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06      # BPF_RET | BPF_K

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
_EACCES = 13
_AF_UNIX = 1
_SOCK_TYPE_MASK = 0xF
_SOCK_DGRAM = 2
_X32_BIT = 0x40000000


class Arch:
    """The numbers one ABI gives the system calls the filter looks at."""

    def __init__(self, name: str, audit: int, socket: int, socketpair: int,
                 io_uring_setup: int) -> None:
        self.name, self.audit = name, audit
        self.socket, self.socketpair, self.io_uring_setup = socket, socketpair, io_uring_setup


ARCHES = {
    # AUDIT_ARCH_X86_64 = EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
    "x86_64": Arch("x86_64", 0xC000003E, socket=41, socketpair=53, io_uring_setup=425),
    # AUDIT_ARCH_AARCH64 = EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
    "aarch64": Arch("aarch64", 0xC00000B7, socket=198, socketpair=199, io_uring_setup=425),
}
"""The architectures a filter is built for, by `platform.machine()`."""
ARCHES["arm64"] = ARCHES["aarch64"]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program_for(arch: Arch, which: Which) -> bytes:
    """The filter for `arch`: a `struct sock_filter[]` as bytes (8 bytes an instruction)."""
    deny = RET_ERRNO | _EACCES
    ops = [
        _op(_LD_W_ABS, _ARCH),                       # 0
        _op(_JEQ_K, arch.audit, 1, 0),               # 1: another ABI -> kill
        _op(_RET_K, RET_KILL_PROCESS),               # 2
        _op(_LD_W_ABS, _NR),                         # 3
        _op(_JGE_K, _X32_BIT, 0, 1),                 # 4: x32 numbers (x86_64) -> kill
        _op(_RET_K, RET_KILL_PROCESS),               # 5
        _op(_JEQ_K, arch.socket, 4, 0),              # 6 -> 11
        _op(_JEQ_K, arch.socketpair, 6, 0),          # 7 -> 14
        _op(_JEQ_K, arch.io_uring_setup, 1, 0),      # 8 -> 10
        _op(_RET_K, RET_ALLOW),                      # 9
        _op(_RET_K, deny),                           # 10
    ]
    if which == "unix":
        ops += [_op(_LD_W_ABS, _ARG0),               # 11: the family
                _op(_JEQ_K, _AF_UNIX, 4, 5)]         # 12: AF_UNIX -> 17, else -> 18
    else:
        ops += [_op(_RET_K, deny),                   # 11: every family
                _op(_RET_K, deny)]                   # 12 (unreached: keeps offsets alike)
    ops += [
        _op(_RET_K, RET_ALLOW),                      # 13 (unreached)
        _op(_LD_W_ABS, _ARG1),                       # 14: socketpair's type
        _op(_AND_K, _SOCK_TYPE_MASK),                # 15 (SOCK_NONBLOCK/CLOEXEC off)
        _op(_JEQ_K, _SOCK_DGRAM, 0, 1),              # 16: datagram -> 17, else -> 18
        _op(_RET_K, deny),                           # 17
        _op(_RET_K, RET_ALLOW),                      # 18
    ]
    return b"".join(ops)


_lock = threading.Lock()
_built: dict[Which, bytes | None] = {}


def build(which: Which) -> bytes | None:
    """The filter for this machine's architecture, or None where none is built."""
    with _lock:
        if which not in _built:
            arch = ARCHES.get(platform.machine().lower())
            _built[which] = None if arch is None else program_for(arch, which)
        return _built[which]


_memfds: dict[Which, tuple[int, int, int]] = {}  # which -> (pid, fd, inode)


def sealed_path(which: Which) -> str | None:
    """A path whose contents are the filter, sealed against change; None: no filter here.

    A sealed memfd of this process, named by `/proc/PID/fd/N`: opening it gives the same
    bytes to whoever may open our fds (our own children), and nothing (the program included)
    can write it. Kept open for the life of the process (one per filter).
    """
    program = build(which)
    if program is None:
        return None
    with _lock:
        known = _memfds.get(which)
        pid = os.getpid()
        if known is not None:
            _, fd, inode = known
            try:
                alive = os.fstat(fd).st_ino == inode
            except OSError:
                alive = False
            if alive:
                return f"/proc/{pid}/fd/{fd}"
        fd = os.memfd_create(f"handrail-seccomp-{which}",
                             os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(fd, program)
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        _memfds[which] = (pid, fd, os.fstat(fd).st_ino)
        return f"/proc/{pid}/fd/{fd}"
