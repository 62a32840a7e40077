"""Canonical targets for EXEC, NET and CALL actions (paths live in `_paths`).

Each function returns the target shown in a verdict and the candidate strings rules are
matched against; a target that cannot be put in canonical form raises `UncanonicalTarget`,
which the policy turns into Deny.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from handrail.policy._paths import UncanonicalTarget

__all__ = [
    "CALL_MAX",
    "EXEC_MAX",
    "NET_MAX",
    "canonical_call",
    "canonical_exec",
    "canonical_net",
]

EXEC_MAX = 131072
"""The longest argv (joined by spaces, in characters) an EXEC target may be: Linux's
MAX_ARG_STRLEN, the most one argument may hold. Longer argvs are refused, not matched."""
NET_MAX = 261
"""The longest NET target: a 253-character DNS name, `[`/`]`, `:` and a 5-digit port."""
CALL_MAX = 1024
"""The longest CALL target (`server/name[/...]`)."""

_HOST = re.compile(r"[a-z0-9_.-]+")
_V6_PORT = re.compile(r"\[([^\]]+)\](?::([0-9]+))?")
_LEGACY_V4 = re.compile(r"[0-9a-fx.]+")


def _check(text: str, what: str, limit: int) -> None:
    if not text:
        raise UncanonicalTarget(f"the {what} is empty")
    if len(text) > limit:
        raise UncanonicalTarget(f"the {what} is {len(text)} characters long; at most {limit} "
                                "are accepted")
    if "\x00" in text:
        raise UncanonicalTarget(f"the {what} contains a NUL byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UncanonicalTarget(f"the {what} is not valid UTF-8 (lone surrogate)") from None


def canonical_exec(argv: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The argv joined by spaces, and the candidates rules are matched against.

    The candidates are the joined argv and the program, and both again with the program
    reduced to its basename (so a rule on `rm` also catches `/bin/rm`).

    Raises:
        UncanonicalTarget: the argv is empty or holds an unusable string.
    """
    if not argv:
        raise UncanonicalTarget("the argv is empty")
    size = sum(len(word) + 1 for word in argv) - 1
    if size > EXEC_MAX:
        raise UncanonicalTarget(f"the argv is {size} characters long; at most {EXEC_MAX} "
                                "are accepted")
    for word in argv[1:]:
        if "\x00" in word:
            raise UncanonicalTarget("an argv word contains a NUL byte")
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            raise UncanonicalTarget("an argv word is not valid UTF-8 (lone surrogate)") from None
    program = argv[0]
    _check(program, "program name", EXEC_MAX)
    joined = " ".join(argv)
    base = program.rstrip("/").rpartition("/")[2] or program
    if base == program:
        return joined, (joined, program) if len(argv) > 1 else (joined,)
    joined_base = " ".join((base, *argv[1:]))
    if len(argv) == 1:
        return joined, (joined, base)
    return joined, (joined, joined_base, program, base)


def _canonical_host(host: str) -> tuple[str, bool]:
    """(canonical host, is IPv6)."""
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise UncanonicalTarget("the host is empty")
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    if ":" in host or _LEGACY_V4.fullmatch(host):
        # Only address-like text is parsed: a failed parse raises, and exceptions are slow.
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
    if ip is None and _LEGACY_V4.fullmatch(host) and any(c.isdigit() for c in host):
        # Resolvers accept '127.1', '0x7f000001' and '2130706433' as 127.0.0.1: so must we,
        # or a deny on 127.0.0.1 could be spelt around.
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped), False
            return ip.compressed, True
        return str(ip), False
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise UncanonicalTarget(f"the host {host!r} is not a valid name") from None
    if not _HOST.fullmatch(host) or ".." in host or host.startswith("."):
        raise UncanonicalTarget(f"the host {host!r} is not a valid name")
    return host, False


def canonical_net(target: str) -> tuple[str, ...]:
    """Candidates for a NET target: `(host:port, host)`, or `(host,)` without a port.

    Hosts are lower-cased, lose a trailing dot, and IP addresses take their standard form
    (`127.1` is `127.0.0.1`, `::ffff:10.0.0.1` is `10.0.0.1`, IPv6 is compressed and shown
    as `[::1]:443` with a port).

    Raises:
        UncanonicalTarget: the target is not `host` or `host:port`.
    """
    if not isinstance(target, str):
        raise UncanonicalTarget(f"a NET target must be a string, not {type(target).__name__}")
    _check(target, "host", NET_MAX)
    if any(c.isspace() or c in "/@\\" for c in target):
        raise UncanonicalTarget("a NET target is 'host' or 'host:port', not a URL")
    port: str | None = None
    if target.startswith("["):
        m = _V6_PORT.fullmatch(target)
        if m is None:
            raise UncanonicalTarget(f"{target!r} is not '[ipv6]' or '[ipv6]:port'")
        host, port = m.group(1), m.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UncanonicalTarget(f"{host!r} is not an IPv6 address") from None
    elif target.count(":") >= 2:
        host = target  # a bare IPv6 address, no port
    elif ":" in target:
        host, _, port = target.partition(":")
    else:
        host = target
    canonical, v6 = _canonical_host(host)
    if port is None:
        return (canonical,)
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise UncanonicalTarget(f"the port {port!r} is not a number from 0 to 65535")
    shown = f"[{canonical}]" if v6 else canonical
    return (f"{shown}:{int(port)}", canonical)


def canonical_call(target: str) -> tuple[str, ...]:
    """Candidates for a CALL target: the target itself (`server/name[/...]`).

    Raises:
        UncanonicalTarget: the target is empty or holds a NUL byte or a lone surrogate.
    """
    _check(target, "call target", CALL_MAX)
    return (target,)
