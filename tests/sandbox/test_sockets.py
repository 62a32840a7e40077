"""Issue 33: with `"network": "none"`, no socket of any family reaches outside the sandbox.

The story: a confined `sh build.sh` ran `psql` over PostgreSQL's unix socket in
`/run/postgresql` (the root is bound read-only, and connecting needs no write), marked
another run's pending write as approved, and the resume performed a write nobody approved.

Each test starts real servers outside the sandbox (a stream and a datagram unix socket in a
folder outside /tmp, and in the workspace itself; an abstract one; a UDP one) and runs a real
program through the workspace `exec` tool, under bubblewrap and under the Landlock fallback;
and checks that ordinary programs (pipes, socketpair, asyncio) still work.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.sandbox import _landlock, _seccomp, find_bwrap

pytestmark = pytest.mark.anyio

PY = sys.executable
needs_bwrap = pytest.mark.skipif(find_bwrap()[0] is None,
                                 reason=f"no working bubblewrap here: {find_bwrap()[1]}")
needs_landlock = pytest.mark.skipif(_landlock.abi() < 1, reason="needs Landlock")
needs_filter = pytest.mark.skipif(_seccomp.build("unix") is None,
                                  reason=f"no seccomp filter for {platform.machine()}")

PROBE = r"""
import asyncio, os, socket, subprocess, sys
stream, dgram, inside, abstract, udp = sys.argv[1:6]
def attempt(name, fn):
    try:
        fn()
        print(f"{name}: reached")
    except OSError as exc:
        print(f"{name}: refused {exc.errno}")
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
def sendto(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"out", path)
def pair_sendto(path):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"out", path)
attempt("stream", lambda: connect(stream))
attempt("inside", lambda: connect(inside))
attempt("abstract", lambda: connect("\0" + abstract))
attempt("dgram", lambda: sendto(dgram))
attempt("dgram-pair", lambda: pair_sendto(dgram))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
    b"out", ("127.0.0.1", int(udp))))
a, b = socket.socketpair()
a.sendall(b"x")
print("socketpair:", b.recv(1).decode())
asyncio.run(asyncio.sleep(0))
print("asyncio: ok")
print("pipe:", subprocess.run("echo hi | tr h H", shell=True, capture_output=True,
                              text=True).stdout.strip())
"""


@dataclass
class Servers:
    """Listening sockets outside the sandbox, and the argv that probes them."""

    stream: socket.socket
    dgram: socket.socket
    inside: socket.socket
    abstract: socket.socket
    udp: socket.socket
    argv: list[str]

    def received(self) -> list[str]:
        """Which datagram servers got something."""
        got = []
        for name, server in (("dgram", self.dgram), ("udp", self.udp)):
            with contextlib.suppress(BlockingIOError):
                server.recv(16)
                got.append(name)
        return got


def _outside_tmp() -> Path:
    # A folder outside /tmp (the sandbox's /tmp is private): /run as PostgreSQL's socket.
    for parent in ("/run", "/var/tmp", str(Path.home())):
        if os.access(parent, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="handrail-sock-", dir=parent))
    pytest.skip("no writable folder outside /tmp for a socket")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def servers(ws: Path) -> Iterator[Servers]:
    folder = _outside_tmp()
    opened: list[socket.socket] = []

    def unix(kind: socket.SocketKind, path: str) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, kind)
        opened.append(s)
        s.bind(path)
        if kind == socket.SOCK_STREAM:
            s.listen(8)
        s.setblocking(False)
        return s

    try:
        name = f"handrail-test-{os.getpid()}-{id(folder)}"
        stream = unix(socket.SOCK_STREAM, str(folder / "db.sock"))
        dgram = unix(socket.SOCK_DGRAM, str(folder / "log.sock"))
        inside = unix(socket.SOCK_STREAM, str(ws / "inside.sock"))
        abstract = unix(socket.SOCK_STREAM, "\0" + name)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        opened.append(udp)
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        (folder / "log.sock").chmod(0o777)
        argv = [PY, "-c", PROBE, str(folder / "db.sock"), str(folder / "log.sock"),
                str(ws / "inside.sock"), name, str(udp.getsockname()[1])]
        yield Servers(stream, dgram, inside, abstract, udp, argv)
    finally:
        for s in opened:
            s.close()
        shutil.rmtree(folder, ignore_errors=True)


async def run(ws: Path, argv: list[str], policy: hr.Policy | None = None) -> dict[str, Any]:
    box = hr.Toolbox(hr.builtin.workspace_tools())
    handler = box.handler("workspace/exec", workspace=ws, sandbox="auto", policy=policy)
    out = await handler.step(hr.Invoke("c", {"argv": argv, "timeout": 60}))
    assert isinstance(out, hr.Finished), out
    structured: dict[str, Any] = out.result.structured
    return structured


def lines(out: dict[str, Any]) -> dict[str, str]:
    assert out["exit_code"] == 0, out["stderr"]
    return dict(line.split(": ", 1) for line in out["stdout"].splitlines())


def assert_ordinary_programs_work(seen: dict[str, str]) -> None:
    assert seen["socketpair"] == "x"
    assert seen["asyncio"] == "ok"
    assert seen["pipe"] == "Hi"


@needs_bwrap
@needs_filter
async def test_under_bubblewrap_no_unix_socket_outside_is_reached(ws: Path,
                                                                  servers: Servers) -> None:
    out = await run(ws, servers.argv)
    seen = lines(out)
    refused = f"refused {errno.EACCES}"
    # The socket folder outside /tmp, and a socket in the (writable) workspace itself.
    assert seen["stream"] == refused
    assert seen["inside"] == refused
    assert seen["dgram"] == refused
    assert seen["dgram-pair"] == refused  # a datagram pair could sendto any path
    assert seen["abstract"].startswith("refused")
    # UDP is sent on the sandbox's own loopback (network namespace): it never arrives.
    assert servers.received() == []
    assert_ordinary_programs_work(seen)
    assert out["sandbox"]["mechanism"] == "bwrap"
    assert "unix-domain sockets refused" in out["sandbox"]["sockets"]


@needs_landlock
@needs_filter
async def test_under_the_landlock_fallback_no_socket_reaches_the_host(
        ws: Path, servers: Servers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDRAIL_BWRAP", str(ws / "no-such-bwrap"))
    out = await run(ws, servers.argv)
    seen = lines(out)
    for name in ("stream", "inside", "abstract", "dgram", "dgram-pair", "udp"):
        assert seen[name] == f"refused {errno.EACCES}", name
    assert servers.received() == []
    assert_ordinary_programs_work(seen)
    record = out["sandbox"]
    assert record["mechanism"] == "landlock"
    assert "every socket() refused" in record["sockets"]
    assert not any("UDP" in w for w in record["warnings"])


@needs_bwrap
async def test_a_policy_that_allows_net_says_unix_sockets_are_reachable(ws: Path) -> None:
    policy = hr.Policy.default().layer("app").allow(hr.Act.NET, "example.com")
    out = await run(ws, ["true"], policy)
    assert out["sandbox"]["network"] == "host"
    assert any("unix-domain sockets outside are reachable" in w
               for w in out["sandbox"]["warnings"])


IO_URING = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)
print("refused" if fd < 0 else "made", ctypes.get_errno() if fd < 0 else 0)
"""


def _io_uring_works_here() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(425, 4, ctypes.create_string_buffer(120))
    if fd >= 0:
        os.close(fd)
    return fd >= 0 and platform.machine() in ("x86_64", "aarch64")


@needs_bwrap
@needs_filter
@pytest.mark.skipif(not _io_uring_works_here(), reason="io_uring is not available here")
async def test_no_io_uring_to_make_sockets_behind_the_filter(ws: Path) -> None:
    out = await run(ws, [PY, "-c", IO_URING])
    assert out["stdout"].split() == ["refused", str(errno.EACCES)], out


# A classic BPF interpreter (the few instructions the filter uses), to check the filter of
# each architecture on any machine: the numbers differ between x86_64 and aarch64.


def _run_bpf(program: bytes, *, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    ops = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    for _ in range(len(ops) + 1):
        code, jt, jf, k = ops[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:
            acc &= k
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35):
            hit = acc == k if code == 0x15 else acc >= k
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unknown instruction {code:#x}")
        pc += 1
    raise AssertionError("the filter did not return")


DENY = _seccomp.RET_ERRNO | errno.EACCES


@pytest.mark.parametrize("name", ["x86_64", "aarch64"])
def test_the_filter_of_each_architecture(name: str) -> None:
    arch = _seccomp.ARCHES[name]
    unix, every = _seccomp.program_for(arch, "unix"), _seccomp.program_for(arch, "all")
    audit = arch.audit
    af_unix, af_inet, stream, dgram = 1, 2, 1, 2
    for program in (unix, every):
        assert _run_bpf(program, arch=audit, nr=arch.socket, args=(af_unix, stream)) == DENY
        # socketpair: stream (and with SOCK_CLOEXEC) allowed, datagram refused.
        assert _run_bpf(program, arch=audit, nr=arch.socketpair,
                        args=(af_unix, stream | 0o2000000)) == _seccomp.RET_ALLOW
        assert _run_bpf(program, arch=audit, nr=arch.socketpair,
                        args=(af_unix, dgram | 0o4000)) == DENY
        assert _run_bpf(program, arch=audit, nr=arch.io_uring_setup) == DENY
        # Another ABI (i386's socketcall on x86_64, arm32 on aarch64), x32's numbers: killed.
        assert _run_bpf(program, arch=0x40000003, nr=102) == _seccomp.RET_KILL_PROCESS
        assert _run_bpf(program, arch=audit, nr=0x40000000 + 41) == _seccomp.RET_KILL_PROCESS
        # An ordinary call (read: 0 on x86_64, 63 on aarch64).
        assert _run_bpf(program, arch=audit, nr=0 if name == "x86_64" else 63) == \
            _seccomp.RET_ALLOW
    # Under bubblewrap the network namespace cuts the other families; without it, all go.
    assert _run_bpf(unix, arch=audit, nr=arch.socket, args=(af_inet, dgram)) == \
        _seccomp.RET_ALLOW
    assert _run_bpf(every, arch=audit, nr=arch.socket, args=(af_inet, dgram)) == DENY
    # The other architecture's socket number is an ordinary call here, not a hole: each
    # filter is for its own ABI only, and the ABI is checked first.
    other = _seccomp.ARCHES["aarch64" if name == "x86_64" else "x86_64"]
    assert _run_bpf(unix, arch=other.audit, nr=other.socket, args=(af_unix,)) == \
        _seccomp.RET_KILL_PROCESS


def test_the_filter_is_built_for_this_machine() -> None:
    arch = _seccomp.ARCHES.get(platform.machine().lower())
    if arch is None:
        assert _seccomp.build("unix") is None
    else:
        assert _seccomp.build("unix") == _seccomp.program_for(arch, "unix")
