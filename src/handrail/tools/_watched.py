"""Answers read from the file system, kept while the directory entries they were read from stand.

A policy check resolves names on disk: an EXEC check looks the program up on PATH (an
`access()` per directory before the hit), a READ check resolves the path's symlinks. The
same check comes again and again with nothing on disk changed, and doing the lookups again
was most of its cost. `WatchedAnswers` keeps each answer with the directory entries it was
read from, and drops it the moment one of them changes, so a kept answer is the one a fresh
lookup would give.

How it knows (Linux, inotify): before an answer is computed, every path it depends on is
walked the way the kernel resolves it, component by component, symlinks expanded in place,
and the directory each name is looked up in is watched *before* the name is looked up. What
a resolution reads is exactly those (directory, name) entries and the symlinks' texts (a
link's text cannot change without replacing the link, an entry change in its directory), so
while no event names one of them the answer stands. Events are drained before every use of
a kept answer (one `poll()` when nothing happened). An entry created, deleted, renamed in or
out (a program appearing earlier on PATH, the hit replaced, a link retargeted) drops every
answer that looked that name up in that directory; an event on a watched object itself (it
was moved or deleted, or its attributes changed when those are watched) drops every answer
that used it; a lost event (queue overflow) drops everything.

What it cannot see, and then keeps a stale answer: a file system mounted or unmounted over
a directory of the walk, and a process changing root or mount namespace. Both need
privileges no tool call is granted. Where inotify is missing, cannot be set up, or its
limits are reached, nothing is kept and every lookup is done afresh.
"""

from __future__ import annotations

import os
import select
import stat
import struct
import sys
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar, cast

__all__ = ["WatchedAnswers"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_IN_ATTRIB = 0x4
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_UNMOUNT = 0x2000
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_DONT_FOLLOW = 0x02000000
_ENTRIES = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_DELETE_SELF | _IN_MOVE_SELF
_EVENT = struct.Struct("iIII")
_CHUNK = 65536
_MAX_LINKS = 40
"""The kernel's limit on symlinks followed in one resolution (ELOOP beyond)."""

_DIRECTORY = object()
"""Tags a directory's kept resolution among `real_path`'s answers."""
_libc: Any = None
_all: weakref.WeakSet[WatchedAnswers[Any, Any]] = weakref.WeakSet()


def _inotify() -> Any:
    """libc, loaded at the first answer kept (ctypes costs an import nothing else needs)."""
    global _libc
    if _libc is None:
        import ctypes  # here: only a process that checks EXEC or READ pays for the import

        libc = ctypes.CDLL(None, use_errno=True)
        _libc = libc if hasattr(libc, "inotify_init1") else False
    return _libc


class WatchedAnswers(Generic[K, V]):
    """A memo of answers computed from the file system, each dropped when what it read changes.

    `answer(key, compute, paths)` returns `compute()`, kept under `key` while no directory
    entry that resolving `paths` looks up has changed (see the module's docstring). Thread
    safe; a forked child starts empty (the inotify instance is its parent's).
    """

    def __init__(self, *, attributes: bool, size: int = 1024, watches: int = 1024) -> None:
        """A memo holding nothing yet (inotify is set up at the first answer).

        Args:
            attributes: the answers also depend on the attributes of each path's final object
                and of the directories walked (mode, owner: an EXEC lookup's `access()` and
                file type), so attribute changes drop them too; a path resolution does not.
            size: answers kept at most; beyond it all are dropped and the memo starts again.
            watches: inotify watches held at most, the same way.
        """
        self._attributes = attributes
        self._mask = _ENTRIES | (_IN_ATTRIB if attributes else 0) | _IN_DONT_FOLLOW
        self._size = size
        self._max_watches = watches
        self._lock = threading.RLock()
        self._fd = -1
        self._broken = sys.platform != "linux"
        self._poll: select.poll | None = None
        self._wd_of: dict[str, int] = {}
        # Keys and answers of `answer` (K, V), and `real_path`'s: paths and directories.
        self._answers: dict[Any, Any] = {}
        self._index: dict[int, dict[str, set[Any]]] = {}
        self._dependents: dict[Hashable, set[str]] = {}  # a directory -> paths resolved in it
        self._indexed = 0
        self._generation = 0
        _all.add(self)

    def answer(self, key: K, compute: Callable[[], V], paths: Callable[[], Iterable[str]]) -> V:
        """`compute()`, or the answer kept for `key` while nothing it read has changed.

        `paths` names the absolute paths whose resolution `compute` reads; it is called only
        when the answer is computed. `compute` may call `answer` of this memo (the lock is
        re-entrant, and draining inside it only drops answers, never keeps a stale one).
        """
        with self._lock:
            if self._fd < 0 and not self._start():
                return compute()
            self._drain()
            if key in self._answers:
                return cast("V", self._answers[key])
            if len(self._wd_of) >= self._max_watches:
                self._stop()
                if not self._start():
                    return compute()
            # Watches first, then the lookups: a change after a watch is placed is an event.
            generation = self._generation
            lookups: list[tuple[int, str]] = []
            guarded = all(self._walk(path, lookups) is not None for path in paths())
            value = compute()
            # A nested answer may have started again meanwhile: these watches are gone.
            if guarded and self._generation == generation:
                self._keep(key, value, lookups)
            return value

    def real_path(self, path: str, fallback: Callable[[str], str]) -> str:
        """`os.path.realpath(path)` for an absolute `path`, kept while nothing it read changed.

        Resolved by the walk that places the watches (`_walk`, realpath's own algorithm), and
        for a name in a directory already resolved, from that directory's kept resolution
        and one `lstat` of the name. `fallback(path)` answers, and nothing is kept, where the
        walk cannot be guarded (a loop, an unreadable directory, no inotify).
        """
        with self._lock:
            if self._fd < 0 and not self._start():
                return fallback(path)
            self._drain()
            known = self._answers.get(path)
            if known is not None:
                return cast("str", known)
            if len(self._wd_of) >= self._max_watches:
                self._stop()
                if not self._start():
                    return fallback(path)
            generation = self._generation
            lookups: list[tuple[int, str]] = []
            parent: list[Hashable] = []
            resolved = self._in_known_directory(path, lookups, parent)
            if resolved is None:
                lookups, parent = [], []
                resolved = self._walk(path, lookups)
                if resolved is None:
                    return fallback(path)
            if self._generation == generation:
                self._keep(path, resolved, lookups)
                if parent and path in self._answers:
                    # Dropped with its directory's resolution (not indexed under every
                    # name of it again: a first check in a known directory stays cheap).
                    self._dependents.setdefault(parent[0], set()).add(path)
                    self._indexed += 1
            return resolved

    def _in_known_directory(
        self, path: str, lookups: list[tuple[int, str]], parent: list[Hashable]
    ) -> str | None:
        """`path` resolved as its directory's kept resolution and its last name, or None.

        `lookups` gets what the answer reads beyond the directory's resolution, and `parent`
        that resolution's key when it is kept (else `lookups` gets its reads too).
        """
        head, _, tail = path.rpartition("/")
        if not head or not tail or tail == "." or tail == "..":
            return None
        key = (_DIRECTORY, head)
        known: tuple[str, tuple[tuple[int, str], ...]] | None = self._answers.get(key)
        if known is None:
            walked: list[tuple[int, str]] = []
            resolved = self._walk(head, walked)
            if resolved is None:
                return None
            known = (resolved, tuple(walked))
            self._keep(key, known, walked)
        where, read = known
        wd = self._watch(where)
        if wd is None:
            return None
        if key in self._answers:
            parent.append(key)
        else:
            lookups.extend(read)  # the memo was full: not kept, so not to depend on
        lookups.append((wd, tail))
        full = where + tail if where == "/" else where + "/" + tail
        try:
            mode = os.lstat(full).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return full  # as realpath: a missing name is taken as it is
        except OSError:
            return None
        return None if stat.S_ISLNK(mode) else full  # a link: the whole walk follows it

    def _keep(self, key: Hashable, value: object, lookups: list[tuple[int, str]]) -> None:
        if len(self._answers) >= self._size or self._indexed >= 8 * self._size:
            self._forget_answers()
            return
        self._answers[key] = value
        index = self._index
        for wd, name in lookups:
            index.setdefault(wd, {}).setdefault(name, set()).add(key)
        self._indexed += len(lookups)

    def keeps(self) -> bool:
        """Whether answers can be kept here (inotify is there and could be set up)."""
        with self._lock:
            return self._fd >= 0 or self._start()

    def clear(self) -> None:
        """Drop every answer and watch (the next lookups start again)."""
        with self._lock:
            self._stop()

    # -- inotify ----------------------------------------------------------------------------

    def _start(self) -> bool:
        if self._broken:
            return False
        libc = _inotify()
        if not libc:
            self._broken = True
            return False
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return False  # EMFILE and the like: try again next time
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        return True

    def _stop(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._poll = None
        self._wd_of = {}
        self._generation += 1
        self._forget_answers()

    def _forget_answers(self) -> None:
        self._answers = {}
        self._index = {}
        self._dependents = {}
        self._indexed = 0

    def _drain(self) -> None:
        assert self._poll is not None
        if not self._poll.poll(0):
            return
        while self._fd >= 0:
            try:
                data = os.read(self._fd, _CHUNK)
            except BlockingIOError:
                return
            if len(data) > _CHUNK // 2:
                # A burst (a tool writing a tree): starting again costs less than reading
                # every event, and bounds the time a check spends here.
                self._stop()
                return
            offset = 0
            while offset < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\x00")
                offset += 16 + size
                if mask & (
                    _IN_Q_OVERFLOW | _IN_IGNORED | _IN_UNMOUNT | _IN_DELETE_SELF | _IN_MOVE_SELF
                ):
                    # Lost events, or a watched object gone or moved (its watch now names
                    # another place): start again.
                    self._stop()
                    return
                names = self._index.get(wd)
                if names is None:
                    continue
                if not name:
                    # An attribute of the watched object itself: everything read through it.
                    for read in names.values():
                        self._drop(read)
                    del self._index[wd]
                    continue
                entry = os.fsdecode(name)
                keys = names.get(entry)
                if keys is not None:
                    del names[entry]
                    self._drop(keys)

    def _drop(self, keys: set[Any]) -> None:
        for key in keys:
            self._answers.pop(key, None)
            dependents = self._dependents.pop(key, None)
            if dependents is not None:
                for dependent in dependents:
                    self._answers.pop(dependent, None)

    def _watch(self, path: str) -> int | None:
        known = self._wd_of.get(path)
        if known is not None:
            return known
        if len(self._wd_of) >= self._max_watches or self._fd < 0:
            return None  # the next answer starts again with no watches
        wd: int = _libc.inotify_add_watch(self._fd, os.fsencode(path), self._mask)
        if wd < 0:
            return None
        self._wd_of[path] = wd
        return wd

    def _walk(self, path: str, lookups: list[tuple[int, str]]) -> str | None:
        """Watch each directory resolving `path` looks a name up in, before it looks.

        The resolution is the kernel's (and `os.path.realpath`'s): components left to right,
        a symlink's text put in its place, `..` taken from what is resolved so far. Below a
        name that does not exist nothing is looked up (it is lexical, as `realpath` makes
        it), until a `..` climbs back out. Returns what `os.path.realpath` answers, or None
        when it cannot be guarded (a loop, an unreadable directory, no watch to be had): the
        answer is then not kept.
        """
        pending = path.split("/")
        pending.reverse()
        current = "/"
        missing = 0  # components below the last directory that exists
        links = 0
        while pending:
            name = pending.pop()
            if not name or name == ".":
                continue
            if name == "..":
                current = os.path.dirname(current)
                missing = max(0, missing - 1)
                continue
            full = current + name if current == "/" else current + "/" + name
            if missing:
                current, missing = full, missing + 1
                continue
            wd = self._watch(current)
            if wd is None:
                return None
            lookups.append((wd, name))
            try:
                mode = os.lstat(full).st_mode
            except (FileNotFoundError, NotADirectoryError):
                current, missing = full, 1
                continue
            except OSError:
                return None
            if not stat.S_ISLNK(mode):
                current = full
                continue
            links += 1
            if links > _MAX_LINKS:
                return None
            try:
                text = os.readlink(full)
            except OSError:
                return None
            if text.startswith("/"):
                current = "/"
            parts = text.split("/")
            parts.reverse()
            pending.extend(parts)
        if self._attributes and not missing:
            # The object itself: its mode and type, whichever name they are changed through.
            wd = self._watch(current)
            if wd is None:
                return None
            lookups.append((wd, ""))
        return current

    def _after_fork(self) -> None:
        # The inotify instance is shared with the parent: reading it here would take the
        # parent's events. Drop it without reading (closing this process's copy only).
        self._lock = threading.RLock()
        self._stop()


def _reset_in_child() -> None:
    for memo in list(_all):
        memo._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
