"""Canonical targets for EXEC, NET and CALL actions (paths live in `_paths`).

Each function returns the target shown in a verdict and the candidate strings rules are
matched against; a target that cannot be put in canonical form raises `UncanonicalTarget`,
which the policy turns into Deny.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
import stat
from dataclasses import dataclass
from typing import Any, cast

from handrail.tools import UncanonicalTarget, WatchedAnswers

__all__ = [
    "CALL_MAX",
    "EXEC_MAX",
    "NET_CLASSES",
    "NET_MAX",
    "IpAddress",
    "Program",
    "address_classes",
    "canonical_call",
    "canonical_exec",
    "canonical_net",
    "exec_candidates",
    "is_inside",
    "net_addresses",
    "resolve_program",
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
        raise UncanonicalTarget(
            f"the {what} is {len(text)} characters long; at most {limit} are accepted"
        )
    if "\x00" in text:
        raise UncanonicalTarget(f"the {what} contains a NUL byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UncanonicalTarget(f"the {what} is not valid UTF-8 (lone surrogate)") from None


@dataclass(frozen=True, slots=True)
class Program:
    """Where an argv's program word leads: what the policy decides on and the exec tool runs."""

    given: str
    """argv[0] as written."""
    path: str | None
    """The absolute, lexically normal path that will be executed (`//bin/../bin/git` is
    `/bin/git`; `./x` is `<workspace>/x`; a bare name is its PATH lookup); None for a bare
    name found nowhere on PATH (nothing would run)."""
    real: str | None
    """`path` with symlinks resolved (the file the kernel will load) for a program given by
    path; a PATH lookup's result as found (PATH directories are the host's)."""
    on_path: bool
    """Given as a bare name and found on PATH: only then may an allow by bare name match."""


def _lexical(path: str) -> str:
    # posixpath keeps a leading '//' (POSIX leaves it implementation-defined); Linux treats it
    # as '/', and a rule pinned to '/bin/git' must catch '//bin/git'.
    out = os.path.normpath(path)
    if out.startswith("//"):
        out = "/" + out.lstrip("/")
    return out


def is_inside(path: str, root: str) -> bool:
    """`path` is `root` or lies below it (both absolute and normal)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _entries(path_env: str) -> list[str]:
    return [_lexical(entry) for entry in path_env.split(os.pathsep) if os.path.isabs(entry)]


def _search_dirs_now(path_env: str, root: str) -> tuple[str, ...]:
    dirs: list[str] = []
    for entry in _entries(path_env):
        if is_inside(entry, root) or is_inside(os.path.realpath(entry), root):
            continue
        dirs.append(entry)
    return tuple(dirs)


_search_dirs_unwatched = functools.lru_cache(maxsize=16)(_search_dirs_now)
"""Where nothing can be watched: kept per (PATH, root), as before (realpath of every entry on
each check cost ~300 µs), and not dropped when a PATH entry's links change."""

_lookups: WatchedAnswers[tuple[str, ...], Any] = WatchedAnswers(attributes=True)
"""PATH lookups and realpaths of programs, kept while nothing they read on disk changed
(an `access()` per PATH entry before the hit was most of an EXEC check repeated)."""


def _search_dirs(path_env: str, root: str) -> tuple[str, ...]:
    if not _lookups.keeps():
        return _search_dirs_unwatched(path_env, root)
    dirs = _lookups.answer(
        ("dirs", path_env, root),
        lambda: _search_dirs_now(path_env, root),
        lambda: _entries(path_env),
    )
    return cast("tuple[str, ...]", dirs)


def _search_path(name: str, root: str) -> str | None:
    """`name` looked up on PATH, skipping relative entries and entries inside the workspace.

    A PATH holding `.`, an empty entry or the workspace would let a model put its own `git`
    where the lookup finds it first; such entries are ignored, by the check and the run alike.
    """
    return _on_path(name, root).path


def _on_path(name: str, root: str) -> Program:
    path_env = os.environ.get("PATH", os.defpath)
    found = _lookups.answer(
        ("path", name, path_env, root),
        lambda: _found(name, _search_now(name, path_env, root)),
        # Every entry's own resolution (whether it is skipped) and the name in each.
        lambda: [entry + "/" + name for entry in _entries(path_env)],
    )
    return cast("Program", found)


def _found(name: str, found: str | None) -> Program:
    if found is None:
        return Program(name, None, None, False)
    # Not followed through links: PATH directories are the host's, outside the workspace,
    # and a realpath here doubled the cost of every EXEC check.
    return Program(name, found, found, True)


def _search_now(name: str, path_env: str, root: str) -> str | None:
    for entry in _search_dirs(path_env, root):
        candidate = entry + "/" + name
        # access() answers a miss without raising: a raised OSError per PATH entry was most of
        # the cost of an EXEC check.
        if os.access(candidate, os.X_OK):
            try:
                if stat.S_ISREG(os.stat(candidate).st_mode):
                    return candidate
            except OSError:
                continue
    return None


def _real(path: str) -> str:
    return _lookups.real_path(path, os.path.realpath)


def resolve_program(program: str, root: str) -> Program:
    """Resolve argv[0] the way the exec tool will run it, for the policy to decide on.

    A name without `/` is looked up on PATH (see `_search_path`); a path is taken against
    the workspace root (the program's working directory) and normalised. Lookups are kept
    while nothing they read on disk changed (`handrail.tools.WatchedAnswers`).
    """
    if "/" not in program:
        return _on_path(program, root)
    path = _lexical(program if os.path.isabs(program) else os.path.join(root, program))
    return Program(program, path, _real(path), False)


def canonical_exec(
    argv: tuple[str, ...], root: str
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The target shown, and the candidates deny/ask rules and allow rules are matched against.

    The program word is resolved (`resolve_program`). Deny and ask rules see the argv with the
    program as given, as its canonical path, its real path (symlinks followed), and each of
    those reduced to its basename (a rule on `rm` catches `/bin/rm`, `//bin/../bin/rm` and a
    link named `x` pointing at `rm`). Allow rules see a bare program name only when it was
    given bare and found on PATH (an allow of `git status` never admits a `git` placed
    somewhere by path), and otherwise only the canonical and real paths (and, inside the
    workspace, `./rel` and a `rel` holding a `/`): a path is allowed only by a rule naming it.

    Raises:
        UncanonicalTarget: the argv is empty or holds an unusable string.
    """
    memo_key = (argv, root)
    known = _exec_memo.get(memo_key)
    if known is not None:
        # The argv was checked and its spellings built: only where its program leads can
        # have changed since (the lookup is kept while nothing it read changed, and then it
        # is the very same Program).
        program_then, canonical = known
        resolved = resolve_program(argv[0], root)
        if resolved is program_then or resolved == program_then:
            return canonical
    if not argv:
        raise UncanonicalTarget("the argv is empty")
    size = sum(len(word) + 1 for word in argv) - 1
    if size > EXEC_MAX:
        raise UncanonicalTarget(
            f"the argv is {size} characters long; at most {EXEC_MAX} are accepted"
        )
    for word in argv[1:]:
        if "\x00" in word:
            raise UncanonicalTarget("an argv word contains a NUL byte")
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            raise UncanonicalTarget("an argv word is not valid UTF-8 (lone surrogate)") from None
    program = argv[0]
    _check(program, "program name", EXEC_MAX)
    resolved = resolve_program(program, root)
    canonical = exec_candidates(argv, resolved, root)
    if size <= _MEMO_ARGV:
        if len(_exec_memo) >= _MEMO_SIZE:
            _exec_memo.clear()  # one call: safe when threads check at the same time
        _exec_memo[memo_key] = (resolved, canonical)
    return canonical


def exec_candidates(
    argv: tuple[str, ...], resolved: Program, root: str
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """`canonical_exec` once the program is resolved: a pure function of its arguments.

    The policy what-if (`handrail.policy.what_if`) replays a recorded EXEC with the program
    as it was resolved when the call was decided, never as today's PATH and disk would.
    `canonical_exec` memoises it for short argvs (`_exec_memo`).
    """
    program = argv[0]
    rest = argv[1:]

    def with_program(word: str) -> tuple[str, ...]:
        return (" ".join((word, *rest)), word) if rest else (word,)

    allow: dict[str, None] = {}
    if resolved.on_path:
        allow.update(dict.fromkeys(with_program(program)))
    if resolved.path is not None:
        assert resolved.real is not None
        for path in (resolved.path, resolved.real):
            allow.update(dict.fromkeys(with_program(path)))
            if not resolved.on_path and is_inside(path, root) and path != root:
                # './x' always; 'sub/x' only with a '/': a bare 'x' would be a PATH name.
                rel = path[len(root.rstrip(os.sep)) + 1 :]
                spellings = ("./" + rel, rel) if "/" in rel else ("./" + rel,)
                for spelling in spellings:
                    allow.update(dict.fromkeys(with_program(spelling)))
    deny = dict(allow)
    deny.update(dict.fromkeys(with_program(program)))
    for spelled in (program, resolved.path, resolved.real):
        if spelled is not None:
            base = spelled.rstrip("/").rpartition("/")[2] or spelled
            deny.update(dict.fromkeys(with_program(base)))
    # The verdict names the file that will run (a PATH lookup or a path made canonical).
    shown_program = program if resolved.path is None else resolved.path
    return " ".join((shown_program, *rest)), tuple(deny), tuple(allow)


_MEMO_ARGV = 4096
"""Argvs up to this many characters are memoised (`_exec_memo`): the same command is checked
again and again, and checking its words and building its spellings was most of an EXEC check.
A model chooses the argv, so a long one is not kept (1,024 of them at `EXEC_MAX`, several
spellings each, would pin ~1 GB)."""
_MEMO_SIZE = 1024
_exec_memo: dict[
    tuple[tuple[str, ...], str], tuple[Program, tuple[str, tuple[str, ...], tuple[str, ...]]]
] = {}
"""(argv, root) -> (the program it was resolved to, `exec_candidates` of it). Candidates are
a pure function of the argv, the program and the root, so an entry stands while the program
resolves the same."""


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


NET_CLASSES = ("loopback", "link-local", "private")
"""Keywords a NET rule may name instead of a host. `loopback`: this machine (127.0.0.0/8,
::1, and the unspecified 0.0.0.0 and ::, which reach it too, plus `localhost`); `link-local`:
169.254.0.0/16 and fe80::/10 (cloud metadata services live there); `private`: every address
that is not globally routable (RFC 1918, unique-local, and the two classes above)."""

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_classes(ip: IpAddress) -> tuple[str, ...]:
    """The `NET_CLASSES` keywords `ip` belongs to."""
    if ip.is_loopback or ip.is_unspecified:
        return ("loopback", "private")
    if ip.is_link_local:
        return ("link-local", "private")
    if ip.is_private or not ip.is_global:
        return ("private",)
    return ()


def _is_localhost(host: str) -> bool:
    # RFC 6761: 'localhost' and every name under it resolve to loopback.
    return host == "localhost" or host.endswith(".localhost")


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
    if canonical in NET_CLASSES:
        raise UncanonicalTarget(
            f"{canonical!r} is a policy keyword, not a host name; name the host fully"
        )
    if port is not None and (not port.isascii() or not port.isdigit() or int(port) > 65535):
        raise UncanonicalTarget(f"the port {port!r} is not a number from 0 to 65535")
    hosts = [canonical]
    ip: IpAddress | None = None
    if _is_localhost(canonical):
        ip = ipaddress.IPv4Address("127.0.0.1")
    elif v6 or _LEGACY_V4.fullmatch(canonical):
        with_ip = _parse_ip(canonical)
        ip = with_ip
    if ip is not None:
        # Every spelling of an address class is one target: '0', '0.0.0.0', '::', '[::1]',
        # 'localhost' and 127.0.0.2 all reach this machine, and a rule naming any of them (or
        # the class keyword) names them all.
        hosts += address_classes(ip)
    if port is None:
        return tuple(hosts)
    out = [f"[{canonical}]:{int(port)}" if v6 else f"{canonical}:{int(port)}", canonical]
    for extra in hosts[1:]:
        out += (f"{extra}:{int(port)}", extra)
    return tuple(out)


_LOOPBACKS = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


def net_addresses(candidates: tuple[str, ...]) -> tuple[IpAddress, ...]:
    """The addresses CIDR rules judge for a NET target (from `canonical_net`'s candidates).

    An IP target is its address; `localhost` and every loopback or unspecified address is the
    whole loopback class (`127.0.0.0/8` and `::1/128` each catch `0.0.0.0` and `[::]`).
    A host name has none: names are not resolved by the policy (the fetch tool resolves them
    and checks the address it will connect to).
    """
    host = (
        candidates[1]
        if len(candidates) > 1
        and ":" in candidates[0]
        and not candidates[0].endswith("]")
        and candidates[1] not in NET_CLASSES
        else candidates[0]
    )
    ip = _parse_ip(host)
    if "loopback" in candidates:
        return (ip, *_LOOPBACKS) if ip is not None else _LOOPBACKS
    return (ip,) if ip is not None else ()


def _parse_ip(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def canonical_call(target: str) -> tuple[str, ...]:
    """Candidates for a CALL target: the target itself (`server/name[/...]`).

    Raises:
        UncanonicalTarget: the target is empty or holds a NUL byte or a lone surrogate.
    """
    _check(target, "call target", CALL_MAX)
    return (target,)
