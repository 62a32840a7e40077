"""The file tools: `read_file`, `write_file`, `edit_file`, `list_dir`, `search`.

Their path arguments are `hr.ReadPath` / `hr.WritePath`, the same mechanism any tool uses: the
gate derives the READ/WRITE action from the path, the policy decides on its canonical form,
and at the moment of use the path is canonicalised again (a difference refuses the call) and
the body receives the canonical path, which it opens component by component without following
symlinks (see `_fs`). A path outside the workspace is a model-visible error, never data from
outside.
"""

from __future__ import annotations

import codecs
import fnmatch
import os
import stat
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Annotated, Any, BinaryIO, cast

import anyio.to_thread
from pydantic import AfterValidator, Field, field_validator

from handrail.builtin._fs import (
    Place,
    Refusal,
    atomic_write,
    describe_os_error,
    open_dir,
    open_file,
    place_of,
    shown_path,
    workspace_root,
)
from handrail.policy import SECRETS
from handrail.tools import Act, Action, CallContext, ReadPath, Tool, ToolResult, WritePath

__all__ = [
    "EDIT_LIMIT_BYTES",
    "LIST_LIMIT_ENTRIES",
    "READ_LIMIT_BYTES",
    "SEARCH_LIMIT_FILES",
    "SEARCH_LIMIT_FILE_BYTES",
    "SEARCH_LIMIT_LINE_CHARS",
    "SEARCH_LIMIT_MATCHES",
    "SEARCH_LIMIT_PATTERN_CHARS",
    "SEARCH_LIMIT_SECONDS",
    "SEARCH_LIMIT_TOTAL_BYTES",
    "SKIPPED_DIRS",
    "EditFile",
    "ListDir",
    "ReadFile",
    "Search",
    "WriteFile",
]

READ_LIMIT_BYTES = 256 * 1024
"""`read_file` returns at most this many bytes of text per call."""
EDIT_LIMIT_BYTES = 4 * 1024 * 1024
"""`edit_file` refuses files larger than this."""
LIST_LIMIT_ENTRIES = 1000
"""`list_dir` shows at most this many entries."""
SEARCH_LIMIT_MATCHES = 200
"""`search` stops after this many matching lines."""
SEARCH_LIMIT_FILES = 10_000
"""`search` stops after reading this many files."""
SEARCH_LIMIT_FILE_BYTES = 1024 * 1024
"""`search` skips files larger than this."""
SEARCH_LIMIT_LINE_CHARS = 300
"""`search` shows at most this many characters of a matching line."""
SEARCH_LIMIT_TOTAL_BYTES = 64 * 1024 * 1024
"""`search` stops after reading this many bytes in all."""
SEARCH_LIMIT_SECONDS = 20.0
"""`search` stops scanning after this long and says so (the scan runs in a worker thread)."""
SEARCH_LIMIT_PATTERN_CHARS = 2000
"""The longest pattern `search` accepts."""
# RE2 matches in time linear in the text whatever the pattern (no backtracking, so `(-+)+x`
# cannot run for hours), and bounds the memory a compiled pattern may take.
_RE2_MAX_MEM = 16 * 1024 * 1024
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})
"""Directories `search` never descends into."""

_SNIFF_BYTES = 8192
# A search over a directory is one READ of that directory, so a policy that denies reading
# `.env` would not by itself stop `search(".", "KEY")` from printing it. So search asks the
# policy in force about each file before reading it (`ctx.permits`), and, as a second line
# that holds even outside an agent run, skips (by name, case-folded) the files
# `Policy.default()` calls secret, wherever they are.
_SECRET_NAMES = tuple(p.casefold() for p in SECRETS if "/" not in p)
_Walk = Generator[tuple[str, list[str], list[str], int], None, None]


def _utf8(value: str) -> str:
    # JSON can carry a lone surrogate; it has no UTF-8 form, so it could not be written (and a
    # WRITE action could not carry its bytes).
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text holds a lone surrogate and cannot be encoded as UTF-8") from None
    return value


Utf8Text = Annotated[str, AfterValidator(_utf8)]


async def _in_thread(fn: Callable[[], ToolResult], *, abandon_on_cancel: bool) -> ToolResult:
    return await anyio.to_thread.run_sync(fn, abandon_on_cancel=abandon_on_cancel)


def _confined(path: Path, root: str, body: Callable[[Place], ToolResult]) -> ToolResult:
    """Run `body` on the place of `path` (canonical, as the gate bound it) in the workspace.

    Refusals and OS errors become model-visible error results naming the workspace-relative
    path only.
    """
    try:
        place = place_of(root, path)
    except Refusal as refusal:
        return ToolResult.error(str(refusal))
    try:
        return body(place)
    except Refusal as refusal:
        return ToolResult.error(str(refusal))
    except OSError as exc:
        return ToolResult.error(describe_os_error(exc, place.shown))


class ReadFile(Tool, server="workspace", name="read_file", mutates=False):
    """Read a UTF-8 text file in the workspace.

    Returns the text (at most 256 KiB per call; a note says when more follows and which
    offset to ask for). Use offset and limit to read a long file in parts.
    """

    path: ReadPath
    """The file, relative to the workspace root."""
    offset: int = Field(default=1, ge=1)
    """The first line to return, counting from 1."""
    limit: int | None = Field(default=None, ge=1)
    """At most this many lines; default as many as fit in 256 KiB."""

    def actions(self) -> list[Action]:
        """Reads the file."""
        return [Action(Act.READ, os.fspath(self.path))]

    async def run(self, ctx: CallContext) -> ToolResult:
        """Read the file."""
        root = workspace_root(ctx)
        return await _in_thread(lambda: _confined(self.path, root, self._read),
                                abandon_on_cancel=True)

    def _read(self, place: Place) -> ToolResult:
        with os.fdopen(open_file(place), "rb") as f:
            return self._read_lines(place, f)

    def _read_lines(self, place: Place, f: BinaryIO) -> ToolResult:
        cap = READ_LIMIT_BYTES
        line = 1
        while line < self.offset and _skip_line(f):
            line += 1
        out = bytearray()
        count = 0
        cut = False
        more = False
        while True:
            room = cap - len(out)
            raw = f.readline(room + 1)
            if not raw:
                break
            if len(raw) > room:
                if not out:  # one line longer than the whole cap: show its start
                    out += raw[:cap]
                    count, cut = 1, True
                more = True
                break
            out += raw
            count += 1
            if self.limit is not None and count == self.limit:
                more = f.read(1) != b""
                break
        if b"\x00" in out[:_SNIFF_BYTES]:
            size = os.fstat(f.fileno()).st_size
            raise Refusal(f"{place.shown} looks binary ({size} bytes); read_file returns text only")
        try:
            text = codecs.getincrementaldecoder("utf-8")().decode(bytes(out), final=not cut)
        except UnicodeDecodeError:
            raise Refusal(f"{place.shown} is not UTF-8 text; read_file returns text only") from None
        if not out:
            if self.offset == 1:
                return ToolResult.text(f"[{place.shown} is empty]")
            return ToolResult.text(
                f"[{place.shown} has {line - 1} lines; offset {self.offset} is past the end]"
            )
        last = self.offset + count - 1
        if cut:
            note = (f"[truncated: line {last} is longer than {cap} bytes and only its start is "
                    f"shown; continue with offset={last + 1}]")
        elif more:
            note = (f"[showed lines {self.offset}-{last}; more follow: call read_file with "
                    f"offset={last + 1}]")
        else:
            return ToolResult.text(text)
        return ToolResult.text(f"{text}{'' if text.endswith(chr(10)) else chr(10)}{note}")


def _skip_line(f: BinaryIO) -> bool:
    """Skip one line however long it is; False at the end of the file."""
    consumed = False
    while True:
        chunk = f.readline(65536)
        if not chunk:
            return consumed  # a last line without a newline is still a line
        consumed = True
        if chunk.endswith(b"\n"):
            return True


# Its output only echoes the path it was given and a byte count: nothing from outside. An echo
# vouches for nothing an untrusted output showed first (the taint index orders them by turn).
class WriteFile(Tool, server="workspace", name="write_file", mutates=True,
                protected=["/path"], trusted_output=True):
    """Create or overwrite a file in the workspace with the given text (UTF-8).

    Missing parent directories are created. The file is replaced atomically: nobody ever sees
    a half-written file.
    """

    path: WritePath
    """The file, relative to the workspace root."""
    content: Utf8Text
    """The file's whole new content."""

    def actions(self) -> list[Action]:
        """Writes exactly these bytes to the file."""
        return [Action(Act.WRITE, os.fspath(self.path), content=self.content.encode("utf-8"))]

    async def run(self, ctx: CallContext) -> ToolResult:
        """Write the file."""
        root = workspace_root(ctx)
        return await _in_thread(lambda: _confined(self.path, root, self._write),
                                abandon_on_cancel=False)

    def _write(self, place: Place) -> ToolResult:
        data = self.content.encode("utf-8")
        atomic_write(place, data)
        return ToolResult.text(f"wrote {len(data)} bytes to {place.shown}",
                               structured={"path": place.shown, "bytes": len(data)})


class EditFile(Tool, server="workspace", name="edit_file", mutates=True,
               protected=["/path"], trusted_output=True):
    """Replace one exact piece of text in a workspace file.

    `old` must occur exactly once in the file (include surrounding lines to make it unique);
    it is replaced by `new`, matching bytes exactly (no whitespace or case folding).
    """

    path: WritePath
    """The file, relative to the workspace root."""
    old: Utf8Text = Field(min_length=1)
    """The exact text to replace; it must occur exactly once."""
    new: Utf8Text
    """The text to put in its place."""

    def actions(self) -> list[Action]:
        """Writes the file.

        The action carries no content: the new bytes depend on the file as it is when the body
        runs, and `actions()` has no workspace to read it from. An approver sees `old` and `new`
        in the call's arguments instead.
        """
        return [Action(Act.WRITE, os.fspath(self.path), content=None)]

    async def run(self, ctx: CallContext) -> ToolResult:
        """Edit the file."""
        root = workspace_root(ctx)
        return await _in_thread(lambda: _confined(self.path, root, self._edit),
                                abandon_on_cancel=False)

    def _edit(self, place: Place) -> ToolResult:
        with os.fdopen(open_file(place), "rb") as f:
            data = f.read(EDIT_LIMIT_BYTES + 1)
        if len(data) > EDIT_LIMIT_BYTES:
            raise Refusal(f"{place.shown} is larger than {EDIT_LIMIT_BYTES} bytes; edit_file "
                          "refuses files that large (write_file replaces a whole file)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(f"{place.shown} is not UTF-8 text; edit_file edits text only") from None
        found = _occurrences(text, self.old)
        if found != 1:
            if found == 0:
                raise Refusal(f"the text to replace does not occur in {place.shown}; read the "
                              "file and copy the text exactly (whitespace included)")
            raise Refusal(f"the text to replace occurs {found} times in {place.shown}; include "
                          "more surrounding text so it occurs exactly once")
        if self.old == self.new:
            return ToolResult.text(f"old and new are identical; {place.shown} is unchanged")
        at = text.index(self.old)
        line = text.count("\n", 0, at) + 1
        atomic_write(place, text.replace(self.old, self.new, 1).encode("utf-8"))
        return ToolResult.text(f"replaced 1 occurrence at line {line} of {place.shown}",
                               structured={"path": place.shown, "line": line})


def _occurrences(text: str, old: str) -> int:
    """How many times `old` occurs in `text`, overlapping occurrences included."""
    n = 0
    at = text.find(old)
    while at != -1:
        n += 1
        at = text.find(old, at + 1)
    return n


class ListDir(Tool, server="workspace", name="list_dir", mutates=False):
    """List a directory in the workspace.

    One entry per line, sorted; directories end with `/`, symlinks with `@` (a symlink that
    leads outside the workspace cannot be read).
    """

    path: ReadPath = Path(".")
    """The directory, relative to the workspace root; default the root."""

    def actions(self) -> list[Action]:
        """Reads the directory."""
        return [Action(Act.READ, os.fspath(self.path))]

    async def run(self, ctx: CallContext) -> ToolResult:
        """List the directory."""
        root = workspace_root(ctx)
        return await _in_thread(lambda: _confined(self.path, root, self._list),
                                abandon_on_cancel=True)

    def _list(self, place: Place) -> ToolResult:
        entries: list[str] = []
        with open_dir(place) as fd, os.scandir(fd) as it:
            for entry in it:
                if entry.is_symlink():
                    entries.append(f"{entry.name}@")
                elif entry.is_dir(follow_symlinks=False):
                    entries.append(f"{entry.name}/")
                else:
                    entries.append(entry.name)
        entries.sort()
        if not entries:
            return ToolResult.text(f"[{place.shown} is empty]",
                                   structured={"path": place.shown, "total": 0})
        shown = entries[:LIST_LIMIT_ENTRIES]
        text = "\n".join(shown)
        if len(entries) > len(shown):
            text += f"\n[{len(entries) - len(shown)} more entries not shown]"
        return ToolResult.text(text, structured={"path": place.shown, "total": len(entries)})


class Search(Tool, server="workspace", name="search", mutates=False):
    """Search text files in the workspace for a regular expression (RE2 syntax).

    Each matching line is returned as `file:line: text`, at most 200 of them. Binary files,
    files over 1 MiB, symlinks, `.git` directories and files named like secrets (`.env`,
    `*.pem`, `*.key`...) are skipped.
    """

    pattern: str = Field(min_length=1, max_length=SEARCH_LIMIT_PATTERN_CHARS)
    """An RE2 regular expression (Python-like; no backreferences or lookaround), per line."""
    path: ReadPath = Path(".")
    """A directory to search under, or a single file; default the workspace root."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        _compile(value)
        return value

    def actions(self) -> list[Action]:
        """Reads everything under the path."""
        return [Action(Act.READ, os.fspath(self.path))]

    async def run(self, ctx: CallContext) -> ToolResult:
        """Search.

        The scan runs in a worker thread; a cancelled or timed-out call returns at once
        (the thread is abandoned) and the scan stops at its next file or 4096 lines.
        """
        root = workspace_root(ctx)
        stop = threading.Event()
        try:
            return await _in_thread(
                lambda: _confined(self.path, root,
                                  lambda place: self._search(place, ctx, stop)),
                abandon_on_cancel=True)
        finally:
            stop.set()

    def _search(self, place: Place, ctx: CallContext, stop: threading.Event) -> ToolResult:
        state = _SearchState(_compile(self.pattern), ctx, stop)
        if not place.parts:
            self._search_dir(place, state)
        else:
            with open_dir(place, parent=True) as parent:
                mode = os.stat(place.name, dir_fd=parent, follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    self._search_dir(place, state)
                elif stat.S_ISREG(mode):
                    state.scan(parent, place.name, place.shown)
                else:
                    raise Refusal(f"{place.shown} is neither a directory nor a regular file")
        return state.result(self.pattern, place.shown)

    def _search_dir(self, place: Place, state: _SearchState) -> None:
        with open_dir(place) as top:
            # typeshed says Iterator; it is a generator, and closing it closes its descriptors.
            walk = cast(_Walk, os.fwalk(".", dir_fd=top))
            try:
                for dirpath, dirnames, filenames, dirfd in walk:
                    dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
                    for name in sorted(filenames):
                        if state.full:
                            return
                        state.scan(dirfd, name, shown_path(place, dirpath, name))
            finally:
                walk.close()


def _compile(pattern: str) -> Any:
    """The pattern compiled by RE2.

    Raises:
        ValueError: RE2 cannot compile it (a model-visible invalid-arguments error).
    """
    import re2

    options = re2.Options()
    options.log_errors = False  # the reason goes to the model, not to our stderr
    options.max_mem = _RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(
            f"the pattern cannot be used: {reason}. search takes RE2 syntax (like Python's, "
            "without backreferences or lookaround, and of bounded size); simplify the pattern"
        ) from None


class _SearchState:
    """Matches found so far, and the bounds on how far a search goes."""

    def __init__(self, regex: Any, ctx: CallContext, stop: threading.Event) -> None:
        self.regex = regex
        self.stop = stop
        self.deadline = time.monotonic() + SEARCH_LIMIT_SECONDS
        self.bytes = 0
        self.ctx = ctx
        self.refused = 0
        self.lines: list[str] = []
        self.files = 0
        self.skipped = 0
        self.secrets = 0
        self.stopped: str | None = None

    @property
    def full(self) -> bool:
        return self.stopped is not None

    def scan(self, dirfd: int, name: str, shown: str) -> None:
        if any(fnmatch.fnmatchcase(name.casefold(), p) for p in _SECRET_NAMES):
            self.secrets += 1
            return
        if not self.ctx.permits(Action(Act.READ, shown)):
            self.refused += 1
            return
        if self.files >= SEARCH_LIMIT_FILES:
            self.stopped = f"stopped after reading {SEARCH_LIMIT_FILES} files"
            return
        if self.bytes >= SEARCH_LIMIT_TOTAL_BYTES:
            self.stopped = f"stopped after reading {SEARCH_LIMIT_TOTAL_BYTES} bytes"
            return
        if time.monotonic() > self.deadline or self.stop.is_set():
            self.stopped = f"stopped after {SEARCH_LIMIT_SECONDS:g} seconds"
            return
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dirfd)
        except OSError:
            self.skipped += 1  # a symlink (ELOOP), vanished or unreadable: not ours to read
            return
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > SEARCH_LIMIT_FILE_BYTES:
                self.skipped += 1
                return
            data = f.read(SEARCH_LIMIT_FILE_BYTES + 1)
        self.files += 1
        self.bytes += len(data)
        if b"\x00" in data[:_SNIFF_BYTES] or len(data) > SEARCH_LIMIT_FILE_BYTES:
            self.skipped += 1
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            self.skipped += 1
            return
        # Split on \n only, so line numbers agree with read_file's offsets.
        for number, line in enumerate(text.split("\n"), 1):
            if number % 4096 == 0 and (time.monotonic() > self.deadline or self.stop.is_set()):
                self.stopped = f"stopped after {SEARCH_LIMIT_SECONDS:g} seconds"
                return
            line = line.removesuffix("\r")
            if self.regex.search(line):
                if len(line) > SEARCH_LIMIT_LINE_CHARS:
                    line = line[:SEARCH_LIMIT_LINE_CHARS] + "…"
                self.lines.append(f"{shown}:{number}: {line}")
                if len(self.lines) >= SEARCH_LIMIT_MATCHES:
                    self.stopped = (f"stopped at {SEARCH_LIMIT_MATCHES} matches; narrow the "
                                    "pattern or the path")
                    return

    def result(self, pattern: str, shown: str) -> ToolResult:
        structured: dict[str, Any] = {
            "matches": len(self.lines),
            "files_read": self.files,
            "files_skipped": self.skipped,
            "secret_files_skipped": self.secrets,
            "files_refused_by_policy": self.refused,
            "complete": self.stopped is None,
        }
        if not self.lines:
            text = f"no matches for {pattern!r} under {shown}"
        else:
            text = "\n".join(self.lines)
        if self.secrets:
            text += (f"\n[{self.secrets} file(s) named like secrets (.env, *.key...) were not "
                     "searched]")
        if self.stopped is not None:
            text += f"\n[{self.stopped}]"
        return ToolResult.text(text, structured=structured)
