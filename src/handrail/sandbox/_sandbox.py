"""Derive a bubblewrap sandbox from (policy, workspace) and wrap a program's argv in it.

What a confined program sees (each line is one bwrap option group, in this order; later
mounts sit on top of earlier ones):

- a new user namespace with every capability dropped (`--unshare-user --cap-drop ALL`):
  without it, bwrap started by root keeps root's capabilities and the program can simply
  `mount -o remount,rw /` (measured on our machines: it can);
- the root filesystem read-only, a fresh `/dev` and `/proc`, a private empty `/tmp`;
- when the workspace lies under `/tmp`, the folders between `/tmp` and it are read-only, so
  `../outside.txt` fails instead of landing in the private `/tmp`;
- the workspace read-write;
- every entry of the workspace the policy denies for READ hidden: a file bound over by
  `/dev/null` on a `nodev` mount (opening it fails), a folder by an empty, mode-000,
  read-only tmpfs (listing it fails, nothing can be created in it);
- every entry the policy denies for WRITE (and does not hide) read-only;
- no network (`--unshare-net`, only a loopback of its own) unless the policy allows NET for
  something; then the host's network, with a warning in the record;
- with no network, no unix-domain socket either (a seccomp filter, `_seccomp`): a path
  socket outside (PostgreSQL's, docker's, D-Bus) is reached through the read-only root
  without any write, so the network namespace alone does not cut it;
- its own pid, ipc and session (`--new-session`: no TIOCSTI into our terminal), and it dies
  with the process that started it (`--die-with-parent`).

Patterns are expanded against the workspace at spawn time: every entry is checked with
`policy.check` (so the layers, secrets included, decide exactly as they do for the model's
own calls). A file created later, inside or outside the sandbox, is not covered unless a
hidden or read-only folder holds it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from handrail.errors import HandrailError
from handrail.policy import Act, Effect, Policy, workspace_root
from handrail.sandbox import _landlock, _seccomp

__all__ = ["BWRAP_ENV", "MAX_WALK_ENTRIES", "SANDBOX_MODES", "Sandbox", "SandboxUnavailable",
           "build", "find_bwrap", "wrap"]

SANDBOX_MODES = ("auto", "required", "off")
"""`auto`: confine where the machine can, record that it did not otherwise; `required`:
refuse to start a program that cannot be confined; `off`: never confine (recorded)."""

BWRAP_ENV = "HANDRAIL_BWRAP"
"""Environment variable: the bwrap executable to use instead of the one on PATH (a path that
does not exist means "no bubblewrap here")."""

MAX_WALK_ENTRIES = 200_000
"""The most workspace entries examined to expand the policy's patterns before a program
starts; a bigger workspace refuses to start the program (it could not be hidden reliably)."""

STORE_FOLDER = ".handrail"
"""The folder of the default run store (`./.handrail/runs.db`): always hidden from programs
when it is at the workspace's root, whatever the policy says."""

_PROBE_TIMEOUT = 10.0

SandboxMode = Literal["auto", "required", "off"]


class SandboxUnavailable(HandrailError):
    """A program must be confined (`sandbox="required"`) and cannot be; nothing was started."""


@dataclass(frozen=True)
class Sandbox:
    """The confinement derived from one (policy, workspace): a bwrap argv prefix.

    Build one with `build`; `wrap` builds and applies one in a single step.
    """

    prefix: tuple[str, ...]
    """The bwrap command and its options; the program's argv follows it."""
    workspace: str
    """The canonical workspace root."""
    hidden: tuple[str, ...] = ()
    """Workspace-relative paths hidden (denied for READ)."""
    read_only: tuple[str, ...] = ()
    """Workspace-relative paths made read-only (denied for WRITE, not hidden)."""
    network: Literal["none", "host"] = "none"
    """`none`: a network namespace of its own; `host`: the host's network (policy allows NET)."""
    warnings: tuple[str, ...] = field(default=())
    """What the confinement does not cover, for the record."""
    seccomp: str | None = None
    """A path holding the seccomp filter bwrap loads (`_seccomp.sealed_path`); None: none."""

    def argv(self, program_argv: Sequence[str]) -> list[str]:
        """The argv that runs `program_argv` inside this sandbox.

        With a seccomp filter, bwrap is started through `/bin/sh` (about 1 ms), which opens
        the filter as fd 9 for bwrap's `--seccomp 9`: the argv then needs no descriptor
        passed by whoever spawns it (the MCP SDK spawns stdio servers itself).
        """
        if self.seccomp is None:
            return [*self.prefix, "--", *program_argv]
        return [*TRAMPOLINE, self.seccomp, self.prefix[0], "--seccomp", str(SECCOMP_FD),
                *self.prefix[1:], "--", *program_argv]

    def starting_in(self, cwd: str | os.PathLike[str]) -> Sandbox:
        """This sandbox with the program started in `cwd` instead of the workspace's root.

        Raises:
            SandboxUnavailable: `cwd` is in `/tmp` outside the workspace, which a confined
                program cannot see (its `/tmp` is private).
        """
        real = os.path.realpath(cwd)
        inside = (real + "/").startswith(self.workspace + "/")
        if not inside and Path(real).parts[:2] == ("/", "tmp"):
            raise SandboxUnavailable(
                f"the program's working directory {os.fspath(cwd)!r} is in /tmp outside the "
                "workspace, which a confined program cannot see (its /tmp is private); give "
                "it one inside the workspace or outside /tmp; nothing was started")
        # The prefix always ends with `--chdir <root>` (build puts it last).
        assert self.prefix[-2] == "--chdir", self.prefix[-2:]
        return replace(self, prefix=(*self.prefix[:-1], real))

    def record(self, mode: str) -> dict[str, Any]:
        """How a program was confined, for the call's record."""
        return {
            "mode": mode,
            "mechanism": "bwrap",
            "network": self.network,
            **({"sockets": "unix-domain sockets refused (seccomp)"}
               if self.seccomp is not None else {}),
            "hidden": list(self.hidden),
            "read_only": list(self.read_only),
            "warnings": list(self.warnings),
        }


REAPED = "reaped: every descendant dies with the program (a subreaper launcher)"
"""The record's `descendants` where the program runs under the launcher (off, Landlock)."""

_NO_FILTER = (f"no seccomp filter for this architecture ({platform.machine()}): "
              "unix-domain sockets outside the sandbox (PostgreSQL's, docker's, D-Bus) are "
              "reachable")

SECCOMP_FD = 9
"""The descriptor the trampoline opens the seccomp filter on, for bwrap's `--seccomp`."""
TRAMPOLINE = ("/bin/sh", "-c", f'exec "$@" {SECCOMP_FD}<"$0"')
"""The start of a bwrap argv with a filter: the filter's path, then bwrap's own argv."""


def bwrap_index(argv: Sequence[str]) -> int:
    """Where the bwrap executable is in an argv `wrap` returned (after the trampoline)."""
    return len(TRAMPOLINE) + 1 if tuple(argv[:len(TRAMPOLINE)]) == TRAMPOLINE else 0


_probe_lock = threading.Lock()
_probed: dict[str, str | None] = {}


def find_bwrap() -> tuple[str | None, str]:
    """The bwrap executable that works here, or None and why not.

    "Works" means it could create the namespaces we use (user, mount, pid, net): a container
    may forbid them. The probe runs once per executable per process (about 40 ms).
    """
    chosen = os.environ.get(BWRAP_ENV)
    path = chosen if chosen else shutil.which("bwrap")
    if not path:
        return None, ("bubblewrap (bwrap) is not installed: install the 'bubblewrap' package "
                      "(Debian/Ubuntu: apt-get install bubblewrap)")
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None, f"bubblewrap not found at {path!r} (set by ${BWRAP_ENV} or PATH)"
    with _probe_lock:
        if path not in _probed:
            _probed[path] = _probe(path)
        problem = _probed[path]
    if problem is not None:
        return None, problem
    return path, ""


def _probe(path: str) -> str | None:
    argv = [path, "--unshare-user", "--cap-drop", "ALL", "--unshare-pid", "--unshare-net",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap at {path!r} could not be started: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip()[:300]
        err = err or f"exit code {done.returncode}"
        return (f"bubblewrap at {path!r} cannot create namespaces here ({err}); user "
                "namespaces may be disabled "
                "(sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)")
    return None


def _network(policy: Policy) -> Literal["none", "host"]:
    # A program cannot ask a person: only an outright allow gives it the network.
    if policy.defaults["net"] is Effect.ALLOW:
        return "host"
    for layer in policy.layers:
        for rule in layer.rules:
            if rule.act is Act.NET and rule.effect is Effect.ALLOW:
                return "host"
    return "none"


_Kind = Literal["hide", "read_only", "walk", "keep"]
_DirStamp = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_ctime_ns
_RACY_NS = 2_000_000_000
"""A folder changed less than this long before a walk is not cached: timestamps are coarse
(a jiffy on many filesystems), so a later change in the same tick would leave the stamp as it
was. The rule git uses for its index ("racily clean")."""

# policy -> {folder: (its stamp, its entries as (rel, is_dir, kind))}. Entries of a folder
# depend only on its names, so an unchanged stamp means an unchanged answer: a re-walk costs
# one stat per folder. Keyed by the policy's value, like its compiled form (every run builds
# its effective policy anew, most often equal to the last run's), and held strongly: what is
# cached does not depend on which equal policy the garbage collector has not yet freed.
# _WALKS_KEPT policies at most (then every walk is dropped, and walked again as used).
_walks: dict[Policy, dict[str, tuple[_DirStamp, list[tuple[str, bool, _Kind]]]]] = {}
_WALKS_KEPT = 4
_walks_lock = threading.Lock()


def _entries(policy: Policy, root: str, rel_dir: str) -> list[tuple[str, bool, _Kind]]:
    try:
        with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
            found = sorted(it, key=lambda e: e.name)
    except OSError:
        return []  # unreadable by us: unreadable by the program too
    out: list[tuple[str, bool, _Kind]] = []
    for entry in found:
        if entry.is_symlink():
            # Its target is an entry of its own (checked there) or outside the workspace.
            continue
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if not is_dir and not entry.is_file(follow_symlinks=False):
            continue  # sockets, fifos, devices: nothing to read from a file's contents
        # Walked from the canonical root without following links: `rel` is canonical.
        if policy.check_canonical_path(Act.READ, rel).effect is Effect.DENY:
            out.append((rel, is_dir, "hide"))  # nothing under it is visible: not walked
        elif policy.check_canonical_path(Act.WRITE, rel).effect is Effect.DENY:
            out.append((rel, is_dir, "read_only"))
        else:
            out.append((rel, is_dir, "walk" if is_dir else "keep"))
    return out


def _expand(policy: Policy, root: str) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    """(hidden, read_only): workspace-relative paths with is-folder, parents first."""
    hidden: list[tuple[str, bool]] = []
    read_only: list[tuple[str, bool]] = []
    with _walks_lock:
        known = _walks.get(policy)
        if known is None:
            if len(_walks) >= _WALKS_KEPT:
                _walks.clear()
            known = _walks[policy] = {}
    now = time.time_ns()
    seen = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        path = os.path.join(root, rel_dir) if rel_dir else root
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        key = f"{root}\0{rel_dir}"
        cached = known.get(key)
        if cached is not None and cached[0] == stamp:
            entries = cached[1]
        else:
            entries = _entries(policy, root, rel_dir)
            if now - max(st.st_mtime_ns, st.st_ctime_ns) > _RACY_NS:
                if len(known) >= MAX_WALK_ENTRIES:
                    known.clear()
                known[key] = (stamp, entries)
        seen += len(entries)
        if seen > MAX_WALK_ENTRIES:
            raise SandboxUnavailable(
                f"the workspace has more than {MAX_WALK_ENTRIES} entries: the policy's "
                "denied paths cannot be expanded reliably before the program starts; "
                "use a smaller workspace")
        for rel, is_dir, kind in entries:
            if kind == "hide":
                hidden.append((rel, is_dir))
                continue
            if kind == "read_only":
                read_only.append((rel, is_dir))
            if is_dir:
                stack.append(rel)
    return hidden, read_only


def build(policy: Policy, workspace: str | os.PathLike[str], bwrap: str, *,
          programs: Sequence[str] = ()) -> Sandbox:
    """The sandbox for programs run under `policy` in `workspace`, with the bwrap at `bwrap`.

    `programs`: absolute paths in `/tmp` outside the workspace that programs need to start
    (hidden by the private `/tmp` otherwise; see `_needed_from_tmp`): each is bound in
    read-only.

    Raises:
        SandboxUnavailable: the workspace is too large to expand the policy against.
    """
    root = workspace_root(os.fspath(workspace))
    prefix: list[str] = [
        bwrap, "--unshare-user", "--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc",
        "--new-session", "--die-with-parent",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
    ]
    network = _network(policy)
    warnings: list[str] = []
    seccomp: str | None = None
    if network == "none":
        prefix.append("--unshare-net")
        seccomp = _seccomp.sealed_path("unix")
        if seccomp is None:
            warnings.append(_NO_FILTER)
    else:
        warnings.append("the policy allows NET for something: the program has the host's "
                        "network, unfiltered (its NET denies are not enforced on it; "
                        "unix-domain sockets outside are reachable too)")
    parts = Path(root).parts
    top: str | None = None
    if len(parts) > 3 and parts[:2] == ("/", "tmp"):
        # The private /tmp would otherwise let the program write next to the workspace.
        top = os.path.join("/tmp", parts[2])
        prefix += ["--tmpfs", top, "--dir", root]
    for program in programs:
        # Before the read-only remount: bwrap makes the folders leading to it.
        prefix += ["--ro-bind", program, program]
    if top is not None:
        prefix += ["--remount-ro", top]
    prefix += ["--bind", root, root]
    hidden, read_only = _expand(policy, root)
    store = os.path.join(root, STORE_FOLDER)
    if (os.path.isdir(store) and not os.path.islink(store)
            and not any(rel == STORE_FOLDER for rel, _ in hidden)):
        # The run store's default home (`./.handrail/runs.db`, often in the workspace): a
        # program that could write it could decide its own pending approvals.
        read_only = [(rel, d) for rel, d in read_only
                     if rel != STORE_FOLDER and not rel.startswith(STORE_FOLDER + "/")]
        hidden.insert(0, (STORE_FOLDER, True))
    for rel, _ in read_only:
        path = os.path.join(root, rel)
        prefix += ["--ro-bind", path, path]
    for rel, is_dir in hidden:
        path = os.path.join(root, rel)
        if is_dir:
            prefix += ["--perms", "0000", "--tmpfs", path, "--remount-ro", path]
        else:
            prefix += ["--ro-bind", "/dev/null", path]
    prefix += ["--chdir", root]
    return Sandbox(tuple(prefix), root, tuple(r for r, _ in hidden),
                   tuple(r for r, _ in read_only), network, tuple(warnings), seccomp)




def wrap(
    argv: Sequence[str],
    *,
    policy: Policy | None,
    workspace: str | os.PathLike[str],
    mode: str = "auto",
    cwd: str | os.PathLike[str] | None = None,
    model_argv: bool = False,
) -> tuple[list[str], dict[str, Any]]:
    """The argv to spawn for `argv`, confined as `mode` says, and the record of how.

    Call it in a worker thread (it probes bwrap once and walks the workspace). `policy` is
    the policy in force for the run (`ctx.policy`); None (outside an agent run) means
    `Policy.default()`. `cwd`: where the program starts, default the workspace's root;
    spawn the returned argv with that same cwd. `model_argv`: the arguments are a model's
    (the `exec` tool), so no folder of `/tmp` is made visible because an argument names it:
    naming a path must not be a way to read what the private `/tmp` hides.

    Raises:
        SandboxUnavailable: `mode="required"` and the program cannot be confined (the
            message names what is missing); or the workspace is too large to expand; or
            `cwd` is in `/tmp` outside the workspace (invisible inside bubblewrap).
        ValueError: `mode` is not one of `SANDBOX_MODES`.
    """
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode must be one of {SANDBOX_MODES}, not {mode!r}")
    if mode == "off":
        # Unconfined, but not immortal: every descendant dies with the program (the launcher
        # is a subreaper; a `setsid()` child cannot slip out of the call's timeout and kill).
        return (_landlock.launcher_argv(list(argv), writable=[], deny_tcp=False,
                                        landlock=False),
                {"mode": "off", "mechanism": "none", "descendants": REAPED,
                 "warnings": ["sandbox='off': the program ran unconfined"]})
    bwrap, why = find_bwrap()
    if bwrap is None:
        return _landlock_or_nothing(argv, policy if policy is not None else Policy.default(),
                                    workspace, mode, why)
    root = workspace_root(os.fspath(workspace))
    sandbox = build(policy if policy is not None else Policy.default(), root, bwrap,
                    programs=_needed_from_tmp(argv, root, arguments=not model_argv))
    if cwd is not None:
        sandbox = sandbox.starting_in(cwd)
    if mode == "required" and sandbox.network == "none" and sandbox.seccomp is None:
        raise SandboxUnavailable(f"sandbox='required' and the program cannot be confined as "
                                 f"the policy says: {_NO_FILTER}; nothing was started")
    return sandbox.argv(argv), sandbox.record(mode)


def _in_tmp(path: str, root: str) -> bool:
    # Neither inside the workspace (bound already) nor holding it (its neighbours stay hidden).
    return (Path(path).parts[:2] == ("/", "tmp") and path != "/tmp"
            and not (path + "/").startswith(root + "/")
            and not (root + "/").startswith(path + "/"))


def _package_of(path: str) -> str:
    """`path`, or the outermost `node_modules` folder holding it.

    A Node program (an npm MCP server started through `node_modules/.bin`) resolves its
    modules from there.
    """
    parts = Path(path).parts
    if "node_modules" in parts:
        return str(Path(*parts[:parts.index("node_modules") + 1]))
    return path


def _needed_from_tmp(argv: Sequence[str], root: str, *, arguments: bool) -> list[str]:
    """What in `/tmp` (outside the workspace) a program needs to start, to be bound read-only.

    The private `/tmp` hides everything else there. Kept visible, read-only: the program
    itself (with its `node_modules` when it is a Node package's); with `arguments`, the
    folder of each absolute path among its arguments (a script and the modules beside it;
    only the script when that folder holds the workspace; never for a model's argv); the
    interpreter its `#!` line names; and the Python installation handrail runs from (its
    prefix and import path: a venv or a checkout in `/tmp` is common in CI, and
    `sys.executable` is the usual way to start a Python program or MCP server). Code, not
    data: the policy's denies inside the workspace are applied as ever, and nothing here is
    writable.
    """
    import sys

    found: list[str] = []
    program = argv[0] if argv else ""
    if os.path.isabs(program) and os.path.isfile(program):
        found += [_package_of(os.path.normpath(program)),
                  _package_of(os.path.realpath(program))]
        with contextlib.suppress(OSError):
            with open(program, "rb") as fh:
                first = fh.readline(4096)
            if first.startswith(b"#!"):
                words = first[2:].decode("utf-8", "replace").split()
                if words and os.path.isabs(words[0]):
                    found.append(os.path.normpath(words[0]))
    for arg in argv[1:] if arguments else ():
        if os.path.isabs(arg) and os.path.exists(arg):
            path = os.path.normpath(arg)
            if os.path.isfile(path):
                folder = _package_of(os.path.dirname(path))
                # A script beside the workspace: its folder holds the workspace, and binding
                # it would show the workspace's neighbours. The script alone is bound.
                found.append(path if (root + "/").startswith(folder + "/") else folder)
            else:
                found.append(_package_of(path))
    found += [os.path.normpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path)
              if p and os.path.isabs(p) and os.path.exists(p)]
    chosen: list[str] = []
    for path in sorted({p for p in found if _in_tmp(p, root)}, key=len):
        if not any((path + "/").startswith(c + "/") for c in chosen):
            chosen.append(path)
    return chosen


def _landlock_or_nothing(argv: Sequence[str], policy: Policy,
                         workspace: str | os.PathLike[str], mode: str,
                         why: str) -> tuple[list[str], dict[str, Any]]:
    """No bubblewrap: Landlock where the kernel has it, with what it cannot do said plainly."""
    version = _landlock.abi()
    if version < 1:
        missing = f"{why}; and the kernel offers no Landlock"
        if mode == "required":
            raise SandboxUnavailable(f"sandbox='required' and the program cannot be confined: "
                                     f"{missing}; nothing was started")
        # Unconfined, still reaped (as under "off"): no descendant outlives the program.
        return (_landlock.launcher_argv(list(argv), writable=[], deny_tcp=False,
                                        landlock=False),
                {"mode": mode, "mechanism": "none", "descendants": REAPED,
                 "warnings": [f"not confined: {missing}"]})
    root = workspace_root(os.fspath(workspace))
    hidden, read_only = _expand(policy, root)
    network = _network(policy)
    gaps: list[str] = []
    if hidden:
        gaps.append(f"{len(hidden)} READ-denied path(s) in the workspace stay readable "
                    f"({', '.join(r for r, _ in hidden[:5])}{', ...' if len(hidden) > 5 else ''})"
                    ": Landlock cannot hide a file inside the workspace")
    if read_only:
        gaps.append(f"{len(read_only)} WRITE-denied path(s) in the workspace stay writable "
                    f"({', '.join(r for r, _ in read_only[:5])}"
                    f"{', ...' if len(read_only) > 5 else ''})")
    # Without a network namespace, only a seccomp filter on socket() keeps UDP, unix-domain
    # and every other family in (Landlock cuts TCP only, from ABI 4).
    seccomp = _seccomp.build("all") if network == "none" else None
    if network == "none" and seccomp is None:
        gaps.append(f"no seccomp filter for this architecture ({platform.machine()}): "
                    "unix-domain and UDP sockets reach the host"
                    + (f", and TCP too (Landlock ABI {version}; TCP needs 4)"
                       if version < 4 else ""))
    if mode == "required" and gaps:
        raise SandboxUnavailable(
            f"sandbox='required' and the program cannot be confined as the policy says: "
            f"{why}, and Landlock (the fallback) cannot enforce this: {'; '.join(gaps)}; "
            "nothing was started")
    warnings = [f"bubblewrap unusable ({why}): Landlock ABI {version} instead; the "
                "filesystem is read-only outside the workspace, /tmp is not writable (no "
                "private /tmp without namespaces)", *gaps]
    if network == "host":
        warnings.append("the policy allows NET for something: the program has the host's "
                        "network, unfiltered (its NET denies are not enforced on it)")
    elif seccomp is None and version >= 4:
        warnings.append("TCP is denied; UDP and other protocols are not restricted by Landlock")
    wrapped = _landlock.launcher_argv(list(argv), writable=[root],
                                      deny_tcp=network == "none", seccomp=seccomp)
    return wrapped, {"mode": mode, "mechanism": "landlock", "network": network,
                     "descendants": REAPED,
                     **({"sockets": "every socket() refused (seccomp); socketpair allowed"}
                        if seccomp is not None else {}),
                     "hidden": [], "read_only": [], "not_enforced": [r for r, _ in hidden]
                     + [r for r, _ in read_only], "warnings": warnings}
