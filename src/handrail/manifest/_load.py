"""Strict parsing of `handrail.toml`: every refusal names the key and the line it is on.

`tomllib` checks the syntax; this module checks the format (known keys, types, refs, no
duplicate grants), collecting every problem of the file into one `ManifestError` so one edit
fixes them all. `[policy]` is handed to `Policy.from_dict` as is.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from handrail.errors import ManifestError, PolicyError, UserError
from handrail.manifest._locate import Path, key_lines, line_of
from handrail.manifest._manifest import (
    AgentSection,
    Budgets,
    ControlSection,
    Grant,
    Manifest,
    json_path,
    json_problem,
    output_schema_problem,
    schema_problem,
)
from handrail.manifest._servers import SERVER_KEYS, ServerDecl, parse_servers
from handrail.manifest._toml_out import decode_json
from handrail.policy import MAX_NESTING, too_deep, without_bom
from handrail.tools import ToolId

if TYPE_CHECKING:
    from handrail.policy import Policy

__all__ = ["KNOWN_KEYS", "parse"]

KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "": ("agent", "tools", "policy", "budgets", "servers", "control"),
    "agent": ("name", "instructions", "model"),
    "tools": ("ref", "mutates", "description", "idempotent", "arguments", "output",
              "trusted_output", "awaited"),
    "budgets": ("max_steps", "max_tokens", "max_wall_seconds"),
    "servers": SERVER_KEYS,  # MCP servers: see _servers.py
    "control": ("command", "timeout"),
}
"""The keys each section accepts, in the order messages list them."""

_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)$")


def _section(path: Path) -> str:
    if not path:
        return "at the top level"
    if path[0] in ("tools", "servers") and len(path) > 1:
        return f"in [[{path[0]}]] #{int(path[1]) + 1}"
    return f"in [{path[0]}]"


class _Reader:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        try:
            self.lines = key_lines(text)
        except (ValueError, IndexError):
            # The scanner only adds line numbers to messages; a TOML spelling it misreads
            # must not make a valid manifest unloadable.
            self.lines = {}
        self.errors: list[tuple[int, str]] = []

    def where(self, path: Path) -> tuple[int, str]:
        line = line_of(self.lines, path)
        return (line or 0), (f"{self.source}:{line}" if line else self.source)

    def error(self, path: Path, message: str) -> None:
        line, where = self.where(path)
        self.errors.append((line, f"{where}: {message}"))

    def table(self, data: Any, path: Path, kind: str) -> dict[str, Any] | None:
        if isinstance(data, dict):
            self.known(data, path, kind)
            return data
        self.error(path, f"{path[-1]} must be a table ([{path[-1]}]), not "
                   f"{_kind(data)}")
        return None

    def known(self, data: dict[str, Any], path: Path, kind: str) -> None:
        known = KNOWN_KEYS[kind]
        for name in data:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                self.error((*path, name), f"unknown key '{name}' {_section(path)} "
                           f"(known: {', '.join(known)}){hint}")

    def typed(self, table: dict[str, Any], path: Path, name: str,
              check: Callable[[Any], bool], expected: str) -> Any:
        value = table.get(name)
        if value is None or check(value):
            return value
        self.error((*path, name), f"{name} {_section(path)} must be {expected}, not "
                   f"{_kind(value)}")
        return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"the string {value!r}"
    return repr(value)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_count(v: Any) -> bool:
    return type(v) is int and v > 0


def _is_argv(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(a, str) and "\x00" not in a
                                                   for a in v) and bool(v[0])


def _is_seconds(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v > 0


def parse(text: str, *, source: str = "<string>") -> Manifest:
    """Parse and check manifest TOML (see `Manifest.from_toml`)."""
    text = without_bom(text)
    line = too_deep(text)
    if line is not None:
        raise ManifestError(f"{source}:{line}: arrays or inline tables nest more than "
                            f"{MAX_NESTING} levels deep; a manifest needs only a few")
    try:
        data = tomllib.loads(text)
    except RecursionError:  # pragma: no cover - too_deep refuses such text first
        raise ManifestError(f"{source}: nested too deeply to parse") from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_LINE.search(message)
        where = f"{source}:{found.group(1)}" if found else source
        if found:
            message = message[:found.start()].rstrip()
        raise ManifestError(f"{where}: not valid TOML: {message}") from None

    reader = _Reader(text, source)
    reader.known(data, (), "")

    agent = AgentSection()
    if "agent" in data:
        section = reader.table(data["agent"], ("agent",), "agent")
        if section is not None:
            values = {name: reader.typed(section, ("agent",), name, _is_str, "a string")
                      for name in KNOWN_KEYS["agent"]}
            agent = AgentSection(**values)

    budgets = Budgets()
    if "budgets" in data:
        section = reader.table(data["budgets"], ("budgets",), "budgets")
        if section is not None:
            path: Path = ("budgets",)
            budgets = Budgets(
                max_steps=reader.typed(section, path, "max_steps", _is_count,
                                       "a positive integer"),
                max_tokens=reader.typed(section, path, "max_tokens", _is_count,
                                        "a positive integer"),
                max_wall_seconds=reader.typed(section, path, "max_wall_seconds", _is_seconds,
                                              "a positive number of seconds"),
            )

    control = ControlSection()
    if "control" in data:
        section = reader.table(data["control"], ("control",), "control")
        if section is not None:
            path = ("control",)
            command = reader.typed(section, path, "command", _is_argv,
                                   "a non-empty array of strings (the program and its "
                                   "arguments)")
            timeout = reader.typed(section, path, "timeout", _is_seconds,
                                   "a positive number of seconds")
            if command is None and "command" not in section:
                reader.error(path, "[control] needs command = [\"program\", ...]")
            elif command is not None:
                control = ControlSection(command=tuple(command), timeout=timeout)

    grants = _grants(reader, data.get("tools", []))

    # -- MCP servers (`[[servers]]`, parsed in _servers.py) -------------------------------
    servers: list[ServerDecl] = []
    if "servers" in data:
        servers = parse_servers(reader, data["servers"])
    # -- end of MCP servers ----------------------------------------------------------------

    if reader.errors:
        reader.errors.sort(key=lambda e: e[0])
        raise ManifestError("\n".join(message for _, message in reader.errors))

    policy = None
    if "policy" in data:
        section = data["policy"]
        if not isinstance(section, dict):
            reader.error(("policy",), f"policy must be a table ([policy]), not {_kind(section)}")
            raise ManifestError(reader.errors[0][1])
        policy = _policy(reader, section)

    return Manifest(agent=agent, grants=tuple(grants), policy=policy, budgets=budgets,
                    source=source, servers=tuple(servers), control=control)


def _policy(reader: _Reader, section: dict[str, Any]) -> Policy:
    from handrail.policy import Policy

    _, where = reader.where(("policy",))
    try:
        return Policy.from_dict(section, source=f"{where} [policy]")
    except PolicyError as exc:
        # The policy names the key path of its complaint; the manifest knows its line.
        path, detail = getattr(exc, "path", None), getattr(exc, "detail", None)
        if not (isinstance(path, list) and path[:1] == ["policy"] and isinstance(detail, str)):
            raise
        _, where = reader.where(tuple(path))
        raise PolicyError(f"{where}: {json_path(tuple(path))}: {detail}") from None


def _grants(reader: _Reader, entries: Any) -> list[Grant]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        reader.error(("tools",), "tools must be a list of [[tools]] tables, one per granted "
                     "tool")
        return []
    grants: list[Grant] = []
    seen: dict[ToolId, int] = {}
    for index, entry in enumerate(entries):
        path: Path = ("tools", index)
        reader.known(entry, path, "tools")
        ref_text = entry.get("ref")
        if ref_text is None:
            reader.error(path, f"[[tools]] #{index + 1} has no ref; add ref = \"server/name\"")
            continue
        if not isinstance(ref_text, str):
            reader.error((*path, "ref"), f"ref {_section(path)} must be a \"server/name\" "
                         f"string, not {_kind(ref_text)}")
            continue
        try:
            ref = ToolId.parse(ref_text)
        except UserError as exc:
            reader.error((*path, "ref"), f"invalid ref {ref_text!r} {_section(path)}: {exc}")
            continue
        if ref in seen:
            first = seen[ref]
            first_line, _ = reader.where(("tools", first))
            reader.error(path, f"tool '{ref}' is granted twice ([[tools]] #{first + 1} at line "
                         f"{first_line} and #{index + 1}); keep one grant")
            continue
        seen[ref] = index
        mutates = reader.typed(entry, path, "mutates", _is_bool, "true or false")
        idempotent = reader.typed(entry, path, "idempotent", _is_bool, "true or false")
        description = reader.typed(entry, path, "description", _is_str, "a string")
        trusted_output = reader.typed(entry, path, "trusted_output", _is_bool, "true or false")
        awaited = reader.typed(entry, path, "awaited", _is_bool, "true or false")
        arguments = _schema(reader, entry, path, ref, "arguments")
        if awaited and arguments is None:
            reader.error(path, f"tool '{ref}' is granted with awaited = true but without "
                         "[tools.arguments]: a tool granted before anyone has seen it must "
                         "have its arguments pinned (the schema it will be held to); add "
                         "[tools.arguments], or grant it once its server lists it")
            continue
        output = _schema(reader, entry, path, ref, "output")
        grants.append(Grant(
            ref=ref,
            mutates=True if mutates is None else mutates,
            description=description,
            idempotent=False if idempotent is None else idempotent,
            arguments=arguments,
            output=output,
            trusted_output=trusted_output,
            awaited=bool(awaited),
            line=reader.where(path)[0] or None,
        ))
    return grants


def _schema(reader: _Reader, entry: dict[str, Any], path: Path, ref: ToolId,
            name: str) -> dict[str, Any] | None:
    # A grant's `arguments` or `output`: a JSON Schema spelled in TOML, `null` and other values
    # TOML lacks written as `{ "$json" = "..." }` (see _toml_out).
    schema = entry.get(name)
    if schema is None:
        return None
    if not isinstance(schema, dict):
        reader.error((*path, name), f"{name} {_section(path)} must be a table (a JSON Schema), "
                     f"not {_kind(schema)}")
        return None
    if found := json_problem(schema):
        inner, reason = found
        reader.error((*path, name, *inner),
                     f"{name}.{json_path(inner)} of '{ref}' {_section(path)}: {reason}")
        return None
    try:
        decoded: dict[str, Any] = decode_json(schema)
    except ValueError as exc:
        reader.error((*path, name), f"{name} of '{ref}' {_section(path)}: {exc}")
        return None
    if not isinstance(decoded, dict):
        reader.error((*path, name), f"{name} of '{ref}' {_section(path)} must be a JSON Schema "
                     "object")
        return None
    problem = (schema_problem if name == "arguments" else output_schema_problem)(decoded)
    if problem:
        reader.error((*path, name), f"{name} of '{ref}' {_section(path)}: {problem}")
        return None
    return decoded
