"""The per-call disk record: `<records>/<run_id>/<turn>/<call_id>/{input,output}.json`.

`input.json` (`{id, tool, input}`) is written when a call is about to run, `output.json`
(`{stdout, stderr, exit_code, signal, started, ended, verdict, source}`) when the gate has
answered it; a refused call gets both at once, and its input is only the arguments' digest
(a refused write's content never reaches the disk). A call still running (or cut off by a
crash) leaves `input.json` and no `output.json`. Each file is written atomically: a temporary
file in the same folder, fsync, rename, fsync of the folder.

A tool that has its program's raw bytes (a subprocess, a routed capture) hands them over with
`current_call()`: the record keeps them exactly (as text when they are UTF-8, else
`{"base64": ...}`), the model sees a bounded projection naming the record's path. Each stream
takes at most `RECORD_LIMIT_BYTES` of the file, escaped form included (a byte JSON escapes as
six counts six), written a chunk at a time; one cut there is listed under `cut` with the
bytes kept and the total.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import contextvars
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import anyio.to_thread

from handrail.host import _process
from handrail.host._process import Projection

__all__ = ["CallRecords", "CallSlot", "current_call", "record_dir"]

_SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")


def _safe_part(value: str) -> str:
    # The call id is the model's text: it must never name a path of its own choosing
    # ("../../etc"); anything but a short plain token becomes a digest of itself.
    if _SAFE_ID.fullmatch(value) and value not in {".", ".."}:
        return value
    return "h-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def record_dir(root: str | os.PathLike[str], run_id: str, turn: int, call_id: str) -> Path:
    """Where one call's record lives (the call id made safe as a path component)."""
    return Path(root) / _safe_part(run_id) / str(int(turn)) / _safe_part(call_id)


@dataclass(kw_only=True)
class CallSlot:
    """One running call's link to its record and its agent's settings (see `current_call`)."""

    path: Path | None
    """The call's record folder; None when the agent keeps no records."""
    projection: Projection | None = None
    """The agent's projection limits; None: the tool's own (or the defaults)."""
    stdout: bytes | None = None
    """The program's raw stdout, handed over by the tool."""
    stderr: bytes | None = None
    """Its raw stderr."""
    exit_code: int | None = None
    """Its exit status."""
    signal: str | None = None
    """The signal that ended it, if any."""
    source: str | None = None
    """Which implementation answered (`injected`, `registered`, `subprocess`)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the tool wants kept."""

    @property
    def output_path(self) -> str | None:
        """The path the model is told holds the full output."""
        return None if self.path is None else str(self.path / "output.json")


_CURRENT: contextvars.ContextVar[CallSlot | None] = contextvars.ContextVar(
    "handrail_host_call", default=None)


def current_call() -> CallSlot | None:
    """The slot of the call running in this task, when an agent with host features runs it."""
    return _CURRENT.get()


_CHUNK = 64 * 1024


def _write_stream(fh: BinaryIO, data: bytes, limit: int) -> int:
    r"""Write `data` as one JSON value (text when UTF-8, else base64), at most `limit` bytes.

    The bound is on what lands in the file: JSON escapes a control byte as six (`\u0001` for 0x01),
    so a bound on the raw bytes alone would let 64 MiB of them become 384 MiB on disk, and
    the whole escaped string in memory. Written a chunk at a time (memory stays at a chunk).

    Returns:
        How many bytes of `data` the value holds (less than `len(data)`: cut).
    """
    start = fh.tell()
    view = memoryview(data)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    room = limit - 2  # the quotes
    kept = 0
    fh.write(b'"')
    try:
        for at in range(0, len(view), _CHUNK):
            piece = view[at:at + _CHUNK]
            text = decoder.decode(piece, final=at + _CHUNK >= len(view))
            escaped = json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")
            if len(escaped) > room:
                # The longest prefix whose escaped form fits (a character never split).
                low, high = 0, len(text)
                while low < high:
                    mid = (low + high + 1) // 2
                    size = len(json.dumps(text[:mid], ensure_ascii=False).encode("utf-8")) - 2
                    low, high = (mid, high) if size <= room else (low, mid - 1)
                fh.write(json.dumps(text[:low], ensure_ascii=False)[1:-1].encode("utf-8"))
                fh.write(b'"')
                return kept + len(text[:low].encode("utf-8"))
            fh.write(escaped)
            room -= len(escaped)
            kept += len(piece)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        fh.seek(start)
        fh.truncate()
        return _write_base64(fh, view, limit)
    fh.write(b'"')
    return len(view)


def _write_base64(fh: BinaryIO, view: memoryview, limit: int) -> int:
    head, tail = b'{"base64": "', b'"}'
    fits = max(limit - len(head) - len(tail), 0) // 4 * 3
    kept = min(len(view), fits)
    fh.write(head)
    step = _CHUNK // 3 * 3
    for at in range(0, kept, step):
        fh.write(base64.b64encode(view[at:min(at + step, kept)]))
    fh.write(tail)
    return kept


def _write_atomic(path: Path, data: dict[str, Any], *,
                  streams: dict[str, bytes] | None = None) -> None:
    """Write `data` as JSON atomically; `streams` first, each bounded as `_write_stream` says.

    A stream cut by the bound is listed under `cut` with the bytes kept and the total.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if streams:
                limit = _process.RECORD_LIMIT_BYTES
                cut: dict[str, Any] = {}
                fh.write(b"{")
                for name, raw in streams.items():
                    fh.write(json.dumps(name).encode() + b": ")
                    kept = _write_stream(fh, raw, limit)
                    if kept < len(raw):
                        cut[name] = {"kept_bytes": kept, "total_bytes": len(raw)}
                    fh.write(b",\n")
                rest = {**data, **({"cut": cut} if cut else {})}
                fh.write(json.dumps(rest, ensure_ascii=False, indent=1)[1:].lstrip()
                         .encode("utf-8"))
            else:
                fh.write(json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)




class CallRecords:
    """Writes the disk record of a run's calls (one instance per run driver).

    `before_execute` is the gate's hook (the moment a call's body is about to run);
    `answered` takes the call records the gate answered in a turn.
    """

    def __init__(self, root: str | os.PathLike[str] | None, *,
                 projection: Projection | None = None) -> None:
        self.root = None if root is None else Path(root).expanduser().resolve()
        self.projection = projection
        self._slots: dict[str, CallSlot] = {}

    def path_of(self, record: Any) -> Path | None:
        """The folder of one call record, or None when no records are kept."""
        if self.root is None:
            return None
        return record_dir(self.root, record.run_id, record.turn, record.call_id)

    async def before_execute(self, record: Any) -> None:
        """Write `input.json` (the arguments that will be performed) and open the slot.

        Runs in the task that then runs the body, so the body finds the slot with
        `current_call()`.
        """
        path = self.path_of(record)
        slot = CallSlot(path=path, projection=self.projection)
        self._slots[record.id] = slot
        _CURRENT.set(slot)
        if path is None:
            return
        data = {"id": record.call_id, "tool": record.tool,
                "input": record.performed_arguments if record.performed_arguments is not None
                else _parsed(record.arguments)}
        await anyio.to_thread.run_sync(_write_atomic, path / "input.json", data)

    async def answered(self, records: Iterable[Any]) -> None:
        """Write `output.json` for each answered call (refused ones: both files)."""
        for record in records:
            status = getattr(record.status, "value", record.status)
            if status not in ("refused", "finished"):
                continue
            slot = self._slots.pop(record.id, None)
            path = self.path_of(record)
            if path is None:
                continue
            await anyio.to_thread.run_sync(self._write_output, path, record, slot, status)

    def _write_output(self, path: Path, record: Any, slot: CallSlot | None, status: str) -> None:
        if status == "refused" or not (path / "input.json").exists():
            # Never a refused call's arguments (a refused write's content): its digest only.
            _write_atomic(path / "input.json", {
                "id": record.call_id, "tool": record.tool or record.model_name,
                "input": {"redacted": "a refused call's record keeps only the digest",
                          "digest": record.arguments_digest}
                if status == "refused" else record.performed_arguments})
        result = record.result or {}
        text = "".join(i.get("text", "") for i in result.get("content", [])
                       if i.get("kind") == "text")
        is_error = bool(result.get("is_error"))
        if slot is not None and slot.stdout is not None:
            stdout, stderr = slot.stdout, slot.stderr or b""
            exit_code, sig = slot.exit_code, slot.signal
        else:
            stdout, stderr = text.encode("utf-8", "replace"), b""
            exit_code, sig = (1 if is_error else 0), None
        metadata = result.get("metadata") or {}
        source = (slot.source if slot is not None and slot.source
                  else metadata.get("handrail.source")
                  or ("gate" if status == "refused" else "registered"))
        _write_atomic(path / "output.json", streams={"stdout": stdout, "stderr": stderr},
                      data={
            "exit_code": exit_code,
            "signal": sig,
            "started": record.started_at,
            "ended": record.ended_at,
            "verdict": {"status": status, "policy": record.verdict,
                        "decision": record.decision, "disposition": record.disposition,
                        "error": record.error},
            "source": source,
            # How the program was confined (docs/sandbox.md), when the tool started one.
            **({"sandbox": slot.extra["sandbox"]}
               if slot is not None and "sandbox" in slot.extra else {}),
        })


def _parsed(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
