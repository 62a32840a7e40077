"""`Manifest`: the reviewed statement of what an agent may reach and what the model is told.

The manifest is data: an `[agent]` section, one `Grant` per `[[tools]]` entry, an optional
policy and `[budgets]`. Its `digest` hashes a canonical JSON form of that meaning (see
`Manifest.canonical` and docs/manifest.md), so a run can record which reviewed declaration was
in force and a deployment can pin one.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from handrail.errors import ManifestError, UserError
from handrail.tools import ToolId, Toolset, ToolSpec

if TYPE_CHECKING:
    from handrail.manifest._servers import ServerDecl
    from handrail.manifest._toolsets import SpecSource
    from handrail.policy import Policy

__all__ = [
    "CANONICAL_FORMAT",
    "AgentSection",
    "Budgets",
    "ControlSection",
    "Grant",
    "Manifest",
    "canonical_json",
    "grant_for",
    "grant_toml",
    "json_path",
    "json_problem",
    "open_schema",
    "output_schema_problem",
    "plain",
    "schema_problem",
]

CANONICAL_FORMAT = "handrail.manifest/2"
"""Names the canonical form; it is part of what the digest hashes, and changes with it."""


def _text(value: str | None) -> str | None:
    # Text the model is shown is stored (and hashed) in one spelling: line breaks as "\n",
    # no surrounding blank space. An empty text is no text.
    if value is None:
        return None
    value = value.replace("\r\n", "\n").replace("\r", "\n").strip()
    return value or None


JsonPath = tuple[str | int, ...]


def json_problem(data: Any, where: JsonPath = ()) -> tuple[JsonPath, str] | None:
    """The first place in `data` that has no JSON form, as (path, reason); None if it is JSON.

    TOML has date-times JSON lacks, and floats may be inf or nan; a manifest holds neither.
    """
    if data is None or isinstance(data, bool | int | str):
        return None
    if isinstance(data, float):
        return None if math.isfinite(data) else (where, f"{data!r} has no JSON form")
    if isinstance(data, Mapping):
        for name, item in data.items():
            if not isinstance(name, str):
                return where, f"key {name!r} is not a string"
            found = json_problem(item, (*where, name))
            if found:
                return found
        return None
    if isinstance(data, list | tuple):
        for index, item in enumerate(data):
            found = json_problem(item, (*where, index))
            if found:
                return found
        return None
    return where, (f"a TOML {type(data).__name__} has no JSON form; write it as a string"
                   if type(data).__module__ == "datetime"
                   else f"a {type(data).__name__} has no JSON form")


def json_path(path: JsonPath) -> str:
    """`("properties", "x", 0)` as `properties.x[0]`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` cannot be a tool's input schema, or None when it can."""
    found = json_problem(schema)
    if found:
        path, reason = found
        return f"{json_path(path)}: {reason}" if path else reason
    if schema.get("type", "object") != "object":
        return (f"arguments must describe a JSON object (type = \"object\"), got type "
                f"{schema.get('type')!r}")
    return _meta_schema_problem(canonical_json(schema))


def output_schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` cannot be a tool's output schema, or None when it can."""
    found = json_problem(schema)
    if found:
        path, reason = found
        return f"{json_path(path)}: {reason}" if path else reason
    return _meta_schema_problem(canonical_json(schema))


@functools.lru_cache(maxsize=256)
def _meta_schema_problem(schema_json: bytes) -> str | None:
    # Checking against the meta-schema costs milliseconds; the same schema is checked again
    # whenever its manifest is rebuilt or reloaded, so remember verdicts by canonical form.
    import jsonschema  # lazily: most manifests state no schema

    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message}"
    return None


def plain(data: Any) -> Any:
    """A deep, JSON-shaped copy: dicts and lists only.

    Nothing the caller holds can change a manifest (and its digest) after construction.
    """
    if isinstance(data, Mapping):
        return {str(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    return copy.copy(data)


def _numbers(data: Any) -> Any:
    # 300 and 300.0 are one number in JSON Schema, in a budget and in TOML's eyes of a reader;
    # the canonical form writes an integral float as an integer so the spelling cannot matter.
    if isinstance(data, float) and data.is_integer():
        return int(data)
    if isinstance(data, dict):
        return {k: _numbers(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_numbers(v) for v in data]
    return data


def canonical_json(data: Any) -> bytes:
    """The canonical bytes of JSON-compatible `data`: what `Manifest.digest` hashes.

    UTF-8, object keys sorted by code point, no insignificant whitespace, integral floats as
    integers, no NaN or infinity.
    """
    return json.dumps(
        _numbers(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentSection:
    """The `[agent]` section: who the agent is and what the model is told up front."""

    name: str | None = None
    """The agent's name (for records and the inbox)."""
    instructions: str | None = None
    """The system instructions the model is given; surrounding blank space is dropped."""
    model: str | None = None
    """The model string (`"openai:gpt-4.1-mini"`)."""

    def __post_init__(self) -> None:
        for name in ("name", "instructions", "model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ManifestError(f"[agent] {name} must be a string, not "
                                    f"{type(value).__name__}")
            object.__setattr__(self, name, _text(value))

    def canonical(self) -> dict[str, Any]:
        """This section's part of `Manifest.canonical()`."""
        return {"name": self.name, "instructions": self.instructions, "model": self.model}


@dataclass(frozen=True, kw_only=True, slots=True)
class Budgets:
    """The `[budgets]` section: limits on one run; None means no limit from the manifest."""

    max_steps: int | None = None
    """Most model turns one run may take."""
    max_tokens: int | None = None
    """Most tokens (input and output, all turns) one run may spend."""
    max_wall_seconds: float | None = None
    """Longest one run may take, in seconds of wall-clock time."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value <= 0):
                raise ManifestError(f"[budgets] {name} must be a positive integer, got "
                                    f"{value!r}")
        seconds = self.max_wall_seconds
        if seconds is not None:
            if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                    or not math.isfinite(seconds) or seconds <= 0):
                raise ManifestError(f"[budgets] max_wall_seconds must be a positive number, "
                                    f"got {seconds!r}")
            object.__setattr__(self, "max_wall_seconds", float(seconds))

    def canonical(self) -> dict[str, Any]:
        """This section's part of `Manifest.canonical()`."""
        return {"max_steps": self.max_steps, "max_tokens": self.max_tokens,
                "max_wall_seconds": self.max_wall_seconds}


@dataclass(frozen=True, kw_only=True, slots=True)
class ControlSection:
    """The `[control]` section: the tool control a deployment pins (docs/control.md).

    `command` is the adjudicator's argv; an agent built with this manifest runs exactly it
    (and refuses another control). Absent, the section is not in the canonical form, so the
    digests of manifests without it are unchanged.
    """

    command: tuple[str, ...] | None = None
    """The adjudicator's argv, or None when the manifest pins none."""
    timeout: float | None = None
    """Seconds it may take per call; None means the default (5)."""

    def __post_init__(self) -> None:
        command = self.command
        if command is not None:
            if isinstance(command, str) or not command or \
                    not all(isinstance(a, str) and "\x00" not in a for a in command) or \
                    not command[0]:
                raise ManifestError(f"[control] command must be a non-empty array of strings "
                                    f"(the program and its arguments), got {command!r}")
            object.__setattr__(self, "command", tuple(command))
        seconds = self.timeout
        if seconds is not None:
            if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                    or not math.isfinite(seconds) or seconds <= 0):
                raise ManifestError(f"[control] timeout must be a positive number of seconds, "
                                    f"got {seconds!r}")
            object.__setattr__(self, "timeout", float(seconds))
        if command is None and seconds is not None:
            raise ManifestError("[control] timeout needs a command")

    def canonical(self) -> dict[str, Any] | None:
        """This section's part of `Manifest.canonical()`, or None when there is none."""
        if self.command is None:
            return None
        return {"command": list(self.command), "timeout": self.timeout}


@dataclass(frozen=True, kw_only=True, slots=True)
class Grant:
    """One `[[tools]]` entry: the manifest admits this tool, and says what the model is told."""

    ref: ToolId
    """The tool granted; a `"server/name"` string is accepted and parsed."""
    mutates: bool = True
    """Whether calls may change the world. May be stricter (True) than the tool, never laxer."""
    description: str | None = None
    """The model-steering text the model is shown for this tool; required by the check."""
    idempotent: bool = False
    """Whether an in-doubt call may be retried; takes effect only if the tool says so too."""
    arguments: dict[str, Any] | None = None
    """The JSON Schema of the arguments the model is offered, pinned: the check refuses a tool
    whose own schema differs. A tool that declares only `{"type": "object"}` (MCP, injected
    tools that leave it to the manifest) is offered this schema instead. None: not pinned."""
    output: dict[str, Any] | None = None
    """The JSON Schema of the tool's structured result, pinned like `arguments`; None when the
    tool declares none (or the grant does not pin it)."""
    trusted_output: bool | None = None
    """Overrides the tool's own `trusted_output` (docs/taint.md): true when a reviewer vouches
    that its output is data nobody outside controls, false to distrust a tool that claims
    otherwise. None: as the code declares."""
    awaited: bool = False
    """Granted before its MCP server lists it (docs/mcp.md): not drift while it is missing,
    offered once the server lists it and it passes the check against this grant (whose
    `arguments` must then be pinned)."""
    line: int | None = field(default=None, compare=False)
    """The line of the manifest that declares this grant, for messages; None if built in code."""

    def __post_init__(self) -> None:
        if not isinstance(self.ref, ToolId):
            object.__setattr__(self, "ref", ToolId.of(self.ref))
        for name in ("mutates", "idempotent", "awaited"):
            if not isinstance(getattr(self, name), bool):
                raise ManifestError(f"grant of '{self.ref}': {name} must be true or false")
        if self.trusted_output is not None and not isinstance(self.trusted_output, bool):
            raise ManifestError(f"grant of '{self.ref}': trusted_output must be true or false")
        if self.description is not None and not isinstance(self.description, str):
            raise ManifestError(f"grant of '{self.ref}': description must be a string")
        object.__setattr__(self, "description", _text(self.description))
        if self.arguments is not None:
            if not isinstance(self.arguments, Mapping):
                raise ManifestError(f"grant of '{self.ref}': arguments must be a JSON Schema "
                                    "table")
            problem = schema_problem(self.arguments)
            if problem:
                raise ManifestError(f"grant of '{self.ref}': arguments: {problem}")
            object.__setattr__(self, "arguments", plain(self.arguments))
        if self.output is not None:
            if not isinstance(self.output, Mapping):
                raise ManifestError(f"grant of '{self.ref}': output must be a JSON Schema "
                                    "table")
            problem = output_schema_problem(self.output)
            if problem:
                raise ManifestError(f"grant of '{self.ref}': output: {problem}")
            object.__setattr__(self, "output", plain(self.output))

    def canonical(self) -> dict[str, Any]:
        """This grant's entry in `Manifest.canonical()["tools"]`."""
        entry = {
            "ref": str(self.ref),
            "mutates": self.mutates,
            "idempotent": self.idempotent,
            "description": self.description,
            "arguments": self.arguments,
            "output": self.output,
        }
        if self.trusted_output is not None:
            # Only when stated: a manifest that says nothing keeps the digest it had.
            entry["trusted_output"] = self.trusted_output
        if self.awaited:
            entry["awaited"] = True  # likewise: only when stated
        return entry


def grant_for(spec: ToolSpec) -> Grant:
    """The grant `manifest init` writes for `spec`: everything as the code declares it."""
    output = None if spec.output_schema is None else plain(spec.output_schema)
    return Grant(ref=spec.id, mutates=spec.mutates, description=spec.description,
                 idempotent=spec.idempotent, arguments=plain(spec.input_schema), output=output)


def grant_toml(grant: Grant) -> list[str]:
    """The lines of one `[[tools]]` entry, schemas as readable sub-tables."""
    from handrail.manifest import _toml_out as out

    entry = grant.canonical()
    ordered = {k: entry[k] for k in ("ref", "description", "mutates", "idempotent")}
    for name in ("trusted_output", "awaited"):
        if name in entry:
            ordered[name] = entry[name]
    for name in ("arguments", "output"):
        if entry[name] is not None:
            ordered[name] = out.encode_json(_readable(entry[name]))
    return out.table("tools", ordered, array=True)


_FIRST = ("type", "description", "required", "default", "enum")


def _readable(schema: Any) -> Any:
    # Key order is not meaning (the digest sorts keys); a reviewer reads a parameter's type and
    # description first.
    if isinstance(schema, dict):
        keys = [k for k in _FIRST if k in schema] + [k for k in schema if k not in _FIRST]
        return {k: _readable(schema[k]) for k in keys}
    if isinstance(schema, list):
        return [_readable(v) for v in schema]
    return schema


def open_schema(schema: Mapping[str, Any]) -> bool:
    """Whether `schema` declares nothing beyond "an object" (it leaves arguments to the grant)."""
    return set(schema) <= {"type"}


@dataclass(frozen=True, kw_only=True, eq=False)
class Manifest:
    """The reviewed declaration an agent runs under: `handrail.toml`, parsed strictly.

    ```python
    manifest = hr.Manifest.load("handrail.toml")
    hr.manifest.check_against(box, manifest)  # ManifestDrift lists every disagreement
    print(manifest.digest)             # sha256:…, recorded with every run
    ```

    Immutable. Two manifests are equal when their digests are, whatever their source.
    """

    agent: AgentSection = field(default_factory=AgentSection)
    """The `[agent]` section."""
    grants: tuple[Grant, ...] = ()
    """The `[[tools]]` entries, in file order."""
    policy: Policy | None = None
    """The `[policy]` section, or None when the manifest states none."""
    budgets: Budgets = field(default_factory=Budgets)
    """The `[budgets]` section."""
    control: ControlSection = field(default_factory=ControlSection)
    """The `[control]` section (the pinned tool control), empty when absent."""
    source: str = "<string>"
    """Where the manifest was read from: its path, or `"<string>"`."""
    servers: tuple[ServerDecl, ...] = ()
    """The `[[servers]]` entries: MCP servers whose tools the grants may name."""
    digest: str = field(init=False)
    """`"sha256:"` + the hex SHA-256 of `canonical_json(self.canonical())`."""
    _by_ref: dict[ToolId, Grant] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        grants = tuple(self.grants)
        by_ref: dict[ToolId, Grant] = {}
        for grant in grants:
            if not isinstance(grant, Grant):
                raise ManifestError(f"a manifest's grants are hr.Grant objects, not "
                                    f"{type(grant).__name__}")
            first = by_ref.get(grant.ref)
            if first is not None:
                raise ManifestError(
                    f"{self.source}: tool '{grant.ref}' is granted twice"
                    f"{_lines_note(first, grant)}; keep one grant"
                )
            by_ref[grant.ref] = grant
        object.__setattr__(self, "grants", grants)
        object.__setattr__(self, "_by_ref", by_ref)
        digest = hashlib.sha256(canonical_json(self.canonical())).hexdigest()
        object.__setattr__(self, "digest", f"sha256:{digest}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Manifest) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    # -- reading and writing ---------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read and strictly parse a `handrail.toml` file.

        Raises:
            ManifestError: the file is missing, not TOML, or breaks the format (the message
                names the line).
            PolicyError: the `[policy]` section is malformed.
        """
        source = os.fspath(path)
        try:
            with open(source, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise ManifestError(f"cannot read the manifest {source}: {exc.strerror}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{source}: not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from exc
        return cls.from_toml(text, source=source)

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<string>") -> Manifest:
        """Strictly parse manifest TOML; `source` names it in messages.

        Raises:
            ManifestError: not TOML, or it breaks the format (the message names the line).
            PolicyError: the `[policy]` section is malformed.
        """
        from handrail.manifest._load import parse

        return parse(text, source=source)

    @classmethod
    def from_toolbox(
        cls,
        toolbox: Toolset | SpecSource,
        *,
        name: str | None = None,
        instructions: str | None = None,
        model: str | None = None,
        policy: Policy | None = None,
    ) -> Manifest:
        """A manifest granting every tool of `toolbox` as the code declares it (for `init`).

        Descriptions, `mutates`/`idempotent` and the input and output schemas come from the
        tools, so the manifest pins exactly what the model is offered. No budgets; `policy`
        only when given.
        """
        from handrail.manifest._toolsets import tools_of

        grants = [grant_for(tool.spec) for tool in tools_of(toolbox)]
        return cls(agent=AgentSection(name=name, instructions=instructions, model=model),
                   grants=tuple(grants), policy=policy)

    def to_toml(self) -> str:
        """This manifest as `handrail.toml` text; `from_toml(m.to_toml()) == m`."""
        from handrail.manifest import _toml_out as out

        blocks: list[list[str]] = [[
            "# handrail.toml: what this agent may reach and what the model is told.",
            "# Reviewed like code; `handrail manifest check` holds the code to it.",
        ]]
        agent = {k: v for k, v in self.agent.canonical().items() if v is not None}
        if agent:
            blocks.append(out.table("agent", agent))
        for grant in self.grants:
            blocks.append(grant_toml(grant))
        if self.policy is not None:
            blocks.append(out.table("policy", self.policy.to_dict()))
        budgets = {k: _numbers(v) for k, v in self.budgets.canonical().items() if v is not None}
        if budgets:
            blocks.append(out.table("budgets", budgets))
        for server in self.servers:  # MCP servers; headers too, so the file stays usable
            entry = {k: v for k, v in server.canonical().items() if v not in (None, [], {})}
            if server.headers:
                entry["headers"] = dict(server.headers)
            if "actions" in entry:
                entry["actions"] = {tool: [{k: v for k, v in a.items() if v is not None}
                                           for a in acts]
                                    for tool, acts in entry["actions"].items()}
            blocks.append(out.table("servers", entry, array=True))
        control = {k: (list(v) if isinstance(v, tuple) else _numbers(v))
                   for k, v in (self.control.canonical() or {}).items() if v is not None}
        if control:
            blocks.append(out.table("control", control))
        return "\n\n".join("\n".join(block) for block in blocks) + "\n"

    # -- meaning ---------------------------------------------------------------------------

    def canonical(self) -> dict[str, Any]:
        """The manifest's meaning as JSON-compatible data: what `digest` hashes.

        Every field is present with defaults filled in (an absent value is None); grants are
        sorted by ref; the policy is `Policy.to_dict()`. A `control` key is present only when
        the manifest pins a tool control, so manifests without one keep their digests. See
        docs/manifest.md.
        """
        canonical = {
            "format": CANONICAL_FORMAT,
            "agent": self.agent.canonical(),
            "tools": [g.canonical() for g in sorted(self.grants, key=lambda g: str(g.ref))],
            "policy": None if self.policy is None else self.policy.to_dict(),
            "budgets": self.budgets.canonical(),
        }
        if self.servers:  # present only when declared, so no earlier digest changes
            canonical["servers"] = [s.canonical() for s in sorted(self.servers,
                                                                  key=lambda s: s.name)]
        control = self.control.canonical()
        if control is not None:
            canonical["control"] = control
        return canonical

    def grant(self, tool_id: ToolId | str) -> Grant | None:
        """The grant of `tool_id` (a ToolId or `"server/name"`), or None."""
        try:
            ref = ToolId.of(tool_id)
        except UserError:  # an unparsable id is simply not granted
            return None
        return self._by_ref.get(ref)

    def offer(self, specs: Iterable[ToolSpec]) -> list[ToolSpec]:
        """The specs the manifest grants, in the order given, as the model should see them.

        Each offered spec carries the grant's description; `mutates` is the stricter of the
        tool's and the grant's (either says True), `idempotent` the stricter too (both must
        say True). A grant's `trusted_output`, when it states one, replaces the tool's. A
        grant's `arguments` become the input schema only where the tool's own
        schema declares nothing beyond `{"type": "object"}` (a tool that leaves its arguments
        to the manifest); a tool with a schema of its own keeps it, and `check_against`
        reports a difference as drift.
        """
        offered = []
        for spec in specs:
            grant = self._by_ref.get(spec.id)
            if grant is None:
                continue
            changes: dict[str, Any] = {
                "mutates": spec.mutates or grant.mutates,
                "idempotent": spec.idempotent and grant.idempotent,
            }
            if grant.description is not None:
                changes["description"] = grant.description
            if grant.trusted_output is not None:
                changes["trusted_output"] = grant.trusted_output
            if grant.arguments is not None and open_schema(spec.input_schema):
                changes["input_schema"] = plain(grant.arguments)
            offered.append(spec.replace(**changes))
        return offered


def _lines_note(first: Grant, second: Grant) -> str:
    if first.line is None or second.line is None:
        return ""
    return f" (at lines {first.line} and {second.line})"
