"""`check_against`: every way the code and the reviewed manifest disagree, found at once.

Deriving a schema from a type is ergonomics; noticing that the reviewed declaration and the
code have drifted apart is a control. Each problem says what is wrong, why it matters and what
to change, and all of them are reported together so one run of the check fixes them all.

A problem is a `Problem` with a `kind` (a stable identifier, for `--json` and tests) and a
`severity`: an **error** is drift (the check fails, an agent refuses to start); a **warning**
is something not yet pinned or reviewed, reported but passing, and an error under `--strict`
(`review(..., strict=True)`). New kinds of warning that only a strict check should fail on go
in `_tool_review_problems` below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from handrail.errors import ManifestDrift
from handrail.manifest._manifest import Grant, Manifest, canonical_json, open_schema, plain
from handrail.manifest._toolsets import Implemented, SpecSource, tools_of
from handrail.tools import ToolImpl, Toolset

__all__ = ["Problem", "Severity", "agent_problems", "check_against", "problems", "review",
           "schema_changes"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One disagreement between the code and the manifest."""

    kind: str
    """What kind of problem: `not_granted`, `not_implemented`, `mutates_laxer`,
    `idempotent_unbacked`, `schema_changed`, `output_schema_changed`, `schema_not_pinned`,
    `no_description`, `agent_instructions`, `agent_model`, `awaited_not_mcp` (stable;
    `--json` shows it)."""
    severity: Severity
    """`"error"` fails the check; `"warning"` is reported, and fails only a strict check."""
    message: str
    """What is wrong, why it matters, and what to change."""
    ref: str | None = None
    """The tool concerned (`"server/name"`), or None for the `[agent]` section."""

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """The problem as JSON-compatible data (`handrail manifest check --json`)."""
        return {"kind": self.kind, "severity": self.severity, "ref": self.ref,
                "message": self.message}


def _where(manifest: Manifest, grant: Grant) -> str:
    if manifest.source == "<string>":
        return "the manifest" + (f" (line {grant.line})" if grant.line else "")
    return f"{manifest.source}:{grant.line}" if grant.line else manifest.source


def _manifest_name(manifest: Manifest) -> str:
    return "the manifest" if manifest.source == "<string>" else manifest.source


def review(toolset: Toolset | SpecSource, manifest: Manifest, *,
           strict: bool = False) -> list[Problem]:
    """Every problem between `toolset` and `manifest`, errors and warnings; empty when none.

    Tools come in the toolset's order, then grants nothing implements in the manifest's order.
    With `strict`, every warning is reported as an error.
    """
    found: list[Problem] = []
    implemented = set()
    for tool in tools_of(toolset):
        implemented.add(tool.spec.id)
        found.extend(_tool_problems(tool, manifest))
        found.extend(_tool_review_problems(tool, manifest.grant(tool.spec.id)))
    changing = _changing_servers(toolset, manifest)
    for grant in manifest.grants:
        if grant.ref in implemented:
            continue
        if grant.awaited:
            if grant.ref.server not in changing:
                found.append(Problem(
                    kind="awaited_not_mcp", severity="error", ref=str(grant.ref),
                    message=f"tool '{grant.ref}' is granted with awaited = true in "
                    f"{_where(manifest, grant)}, but '{grant.ref.server}' is not an MCP server "
                    "the manifest ([[servers]]) or the toolbox declares — only an MCP "
                    "server's tool list can change; correct the ref, or remove the grant"))
            elif grant.description is None:
                found.append(_no_description(manifest, grant))
            continue  # granted ahead of its server's listing: not drift (docs/mcp.md)
        found.append(Problem(
            kind="not_implemented", severity="error", ref=str(grant.ref),
            message=f"tool '{grant.ref}' is granted in {_where(manifest, grant)} but nothing "
            "implements it — the model would be offered a tool that fails; remove the grant or "
            "add the tool to the toolbox"))
        if grant.description is None:
            found.append(_no_description(manifest, grant))
    if strict:
        found = [Problem(kind=p.kind, severity="error", ref=p.ref, message=p.message)
                 for p in found]
    return found


def _changing_servers(toolset: object, manifest: Manifest) -> set[str]:
    """The names of the MCP servers whose tool lists may change: awaited grants' servers."""
    names = {decl.name for decl in manifest.servers}
    changing = getattr(toolset, "changing", None)
    if callable(changing):
        names.update(str(member.name) for member in changing()
                     if isinstance(getattr(member, "name", None), str))
    return names


def _tool_review_problems(tool: Implemented, grant: Grant | None) -> list[Problem]:
    """Problems of a tool's own declaration that a reviewer should see: warnings by default.

    The place for checks that look at the tool rather than at its grant (for example a plain
    `str` argument named like a path with no declared actions). Return warnings: `review`
    turns them into errors under `strict` (`handrail manifest check --strict`).
    """
    if not tool.unguarded:
        return []
    listed = ", ".join(_param(n) for n in tool.unguarded)
    return [Problem(
        kind="unguarded_path_argument", severity="warning", ref=str(tool.spec.id),
        message=f"tool '{tool.spec.id}' ({tool.origin}): argument(s) {listed} look like a "
        "path, URL or command but are plain strings and the tool declares no actions — the "
        "policy never sees what they name; type them hr.ReadPath / hr.WritePath / "
        "hr.ExecArgv / hr.Url, or declare actions=")]


def _tool_problems(tool: Implemented, manifest: Manifest) -> list[Problem]:
    spec, ref = tool.spec, tool.spec.id
    grant = manifest.grant(ref)
    if grant is None:
        return [Problem(
            kind="not_granted", severity="error", ref=str(ref),
            message=f"tool '{ref}' is implemented ({tool.origin}) but not granted in "
            f"{_manifest_name(manifest)} — the code can do what the reviewed declaration does "
            f"not admit; grant it with a [[tools]] entry (ref = \"{ref}\") or remove it from "
            "the toolbox")]
    found: list[Problem] = []
    where = _where(manifest, grant)
    if spec.mutates and not grant.mutates:
        found.append(Problem(
            kind="mutates_laxer", severity="error", ref=str(ref),
            message=f"tool '{ref}' declares mutates=True ({tool.origin}) but is granted with "
            f"mutates = false in {where} — that exemption would let model-chosen arguments "
            "reach something that changes the world; set mutates = true in the grant, or "
            "declare the tool mutates=False in the code if it truly changes nothing"))
    if grant.idempotent and not spec.idempotent:
        found.append(Problem(
            kind="idempotent_unbacked", severity="error", ref=str(ref),
            message=f"tool '{ref}' is granted with idempotent = true in {where} but the tool "
            f"does not declare itself idempotent ({tool.origin}) — calls in doubt would be "
            "retried on the manifest's word alone; remove idempotent = true from the grant, or "
            "declare idempotent=True in the code"))
    found.extend(_schema_problems(tool, grant, where))
    if grant.description is None:
        found.append(_no_description(manifest, grant))
    return found


def _schema_problems(tool: Implemented, grant: Grant, where: str) -> list[Problem]:
    spec, ref = tool.spec, tool.spec.id
    found: list[Problem] = []
    unpinned: list[str] = []
    own = plain(spec.input_schema)
    if grant.arguments is None:
        unpinned.append("input")
    elif not open_schema(own) and canonical_json(own) != canonical_json(grant.arguments):
        # An open schema (`{"type": "object"}`) leaves the arguments to the grant, which is
        # then the schema offered and enforced at stage 3: nothing to compare.
        found.append(Problem(
            kind="schema_changed", severity="error", ref=str(ref),
            message=f"the input schema of '{ref}' ({tool.origin}) differs from the one pinned "
            f"in {where}: {'; '.join(schema_changes(grant.arguments, own))} — the model would "
            "be offered parameters nobody reviewed; review the change and run `handrail "
            "manifest update` (or edit [tools.arguments]), or change the tool back"))
    own_output = None if spec.output_schema is None else plain(spec.output_schema)
    if own_output is not None and grant.output is None:
        unpinned.append("output")
    elif grant.output is not None and (
        own_output is None or canonical_json(own_output) != canonical_json(grant.output)
    ):
        changes = (["the tool declares no output schema any more"] if own_output is None
                   else schema_changes(grant.output, own_output, noun="field"))
        found.append(Problem(
            kind="output_schema_changed", severity="error", ref=str(ref),
            message=f"the output schema of '{ref}' ({tool.origin}) differs from the one pinned "
            f"in {where}: {'; '.join(changes)} — review the change and run `handrail manifest "
            "update` (or edit [tools.output]), or change the tool back"))
    if unpinned:
        what = " and ".join(unpinned)
        found.append(Problem(
            kind="schema_not_pinned", severity="warning", ref=str(ref),
            message=f"schema not pinned: the grant of '{ref}' in {where} states no {what} "
            f"schema, so the model is offered whatever the code declares, and a changed "
            f"parameter passes unnoticed; run `handrail manifest update` to write it into the "
            f"grant ([tools.{'arguments' if unpinned[0] == 'input' else 'output'}])"))
    return found


def _no_description(manifest: Manifest, grant: Grant) -> Problem:
    return Problem(
        kind="no_description", severity="error", ref=str(grant.ref),
        message=f"tool '{grant.ref}' is granted in {_where(manifest, grant)} without a "
        "description — the model would be shown text nobody reviewed; add description = "
        "\"...\" to the grant")


# -- naming what changed in a schema ---------------------------------------------------------

_SHOWN = 120  # longest rendering of one value in a message; schemas can be large
_LISTED = 25  # most changes named one by one; a schema can have thousands of parameters
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _safe(text: str) -> str:
    # Schemas may come from an MCP server: nothing in them may drive the terminal that shows
    # the check's report.
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _show(value: Any) -> str:
    text = _safe(json.dumps(value, ensure_ascii=False, sort_keys=True))
    return text if len(text) <= _SHOWN else text[:_SHOWN - 1] + "…"


def _param(name: str) -> str:
    shown = _safe(name)
    return f"'{shown if len(shown) <= _SHOWN else shown[:_SHOWN - 1] + '…'}'"


def _describe(schema: Any, required: bool) -> str:
    parts: list[str] = []
    if isinstance(schema, Mapping):
        if "type" in schema:
            kind = schema["type"]
            parts.append(" or ".join(map(str, kind)) if isinstance(kind, list) else str(kind))
        elif "anyOf" in schema or "oneOf" in schema:
            options = schema.get("anyOf") or schema.get("oneOf") or []
            parts.append(" or ".join(str(o.get("type", "…")) if isinstance(o, Mapping) else "…"
                                     for o in options))
    parts.append("required" if required else "optional")
    if isinstance(schema, Mapping) and "default" in schema:
        parts.append(f"default {_show(schema['default'])}")
    return ", ".join(parts)


def _same(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


def schema_changes(pinned: Mapping[str, Any], current: Mapping[str, Any], *,
                   noun: str = "parameter") -> list[str]:
    """Each difference from the `pinned` schema to the `current` one, named for a reviewer.

    Parameters (the top-level `properties`) added, removed, or changed keyword by keyword
    (type, required-ness, default, enum, constraints, description…); then any other top-level
    keyword. Values are shown as JSON, cut at a bounded length, control characters escaped;
    at most 25 changes are listed, then how many more.
    """
    changes: list[str] = []
    old_props = pinned.get("properties")
    new_props = current.get("properties")
    old_props = old_props if isinstance(old_props, Mapping) else {}
    new_props = new_props if isinstance(new_props, Mapping) else {}
    old_req = set(pinned.get("required") or []) if isinstance(pinned.get("required"),
                                                                list) else set()
    new_req = set(current.get("required") or []) if isinstance(current.get("required"),
                                                                list) else set()
    for name, schema in new_props.items():
        if name not in old_props:
            changes.append(f"added {noun} {_param(name)} ({_describe(schema, name in new_req)})")
    for name, schema in old_props.items():
        if name not in new_props:
            changes.append(f"removed {noun} {_param(name)} "
                           f"({_describe(schema, name in old_req)})")
    for name, new in new_props.items():
        if name not in old_props:
            continue
        old = old_props[name]
        details: list[str] = []
        if (name in old_req) != (name in new_req):
            details.append("now required" if name in new_req else "now optional")
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for keyword in [*old, *(k for k in new if k not in old)]:
                word = _param(keyword)[1:-1]
                if keyword not in new:
                    details.append(f"{word} {_show(old[keyword])} removed")
                elif keyword not in old:
                    details.append(f"{word} {_show(new[keyword])} added")
                elif not _same(old[keyword], new[keyword]):
                    details.append(f"{word} {_show(old[keyword])} → {_show(new[keyword])}")
        elif not _same(old, new):
            details.append(f"{_show(old)} → {_show(new)}")
        if details:
            changes.append(f"changed {noun} {_param(name)}: {', '.join(details)}")
    for keyword in [*pinned, *(k for k in current if k not in pinned)]:
        if keyword in ("properties", "required"):
            continue
        if keyword not in current:
            changes.append(f"keyword {_param(keyword)} {_show(pinned[keyword])} removed")
        elif keyword not in pinned:
            changes.append(f"keyword {_param(keyword)} {_show(current[keyword])} added")
        elif not _same(pinned[keyword], current[keyword]):
            changes.append(f"keyword {_param(keyword)} {_show(pinned[keyword])} → "
                           f"{_show(current[keyword])}")
    if not changes and not _same(pinned.get("required"), current.get("required")):
        changes.append(f"keyword 'required' {_show(pinned.get('required'))} → "
                       f"{_show(current.get('required'))}")
    if len(changes) > _LISTED:
        changes = [*changes[:_LISTED], f"… and {len(changes) - _LISTED} more changes"]
    return changes or ["the schemas differ"]


# -- the [agent] section ---------------------------------------------------------------------


def agent_problems(manifest: Manifest, *, instructions: str | None,
                   model: str | None) -> list[Problem]:
    """How an agent's instructions and model differ from the manifest's `[agent]` section.

    A manifest whose `[agent]` states anything pins the instructions exactly (stating none
    pins "no instructions"); the model is pinned when the section states one. `model` is the
    agent's model label (`Model.name`, e.g. `"openai:gpt-4.1-mini"`).
    """
    from handrail.manifest._manifest import AgentSection

    section = manifest.agent
    if section == AgentSection():
        return []
    found: list[Problem] = []
    where = _manifest_name(manifest)
    told = AgentSection(instructions=instructions).instructions  # the one spelling
    if told != section.instructions:
        if section.instructions is None:
            detail = (f"[agent] in {where} states no instructions, but the agent is given "
                      f"instructions {_show(told)}")
        elif told is None:
            detail = (f"[agent] in {where} states instructions {_show(section.instructions)}, "
                      "but the agent is given none")
        else:
            detail = (f"the agent's instructions {_show(told)} differ from [agent] "
                      f"instructions in {where}, {_show(section.instructions)}")
        found.append(Problem(
            kind="agent_instructions", severity="error", message=f"{detail} — the model would "
            "be told text nobody reviewed; leave instructions= out (the manifest's are used) "
            "or change [agent] instructions in the manifest"))
    if section.model is not None and model != section.model:
        found.append(Problem(
            kind="agent_model", severity="error", message=f"the agent's model is "
            f"{_show(model)}, but [agent] in {where} pins model {_show(section.model)} — "
            "another model would be told the reviewed instructions and given the tools; use "
            "the manifest's model (hr.Agent.from_manifest) or change [agent] model"))
    return found


# -- the raising forms -----------------------------------------------------------------------


def problems(toolset: Toolset | SpecSource, manifest: Manifest) -> list[str]:
    """The errors between `toolset` and `manifest`, as messages; empty when there are none.

    Warnings (a schema not pinned) are left out: see `review` for every problem with its
    severity.
    """
    return [p.message for p in review(toolset, manifest) if p.severity == "error"]


class _Listed:
    """Some tools as a Toolset (no registry: nothing to clash with)."""

    def __init__(self, tools: list[ToolImpl]) -> None:
        self._tools = tools

    def impls(self) -> list[ToolImpl]:
        return self._tools


def refusals(tools: Iterable[ToolImpl], manifest: Manifest) -> dict[str, str]:
    """Why each of `tools` fails the manifest check, by tool id; empty when every one passes.

    The check a toolbox's construction runs (`review`'s errors), for tools that appeared
    later (an MCP server's `tools/list_changed`): `Toolbox.refreshed(check=...)` refuses
    each one listed here, with its first problem as the reason.
    """
    listed = list(tools)
    ids = {str(tool.spec.id) for tool in listed}
    found: dict[str, str] = {}
    for problem in review(_Listed(listed), manifest):
        if problem.severity == "error" and problem.ref in ids:
            found.setdefault(problem.ref, f"The tool '{problem.ref}' appeared after the "
                             f"manifest check and is refused: {problem.message}")
    return found


def check_against(toolset: Toolset | SpecSource, manifest: Manifest, *,
                  strict: bool = False) -> None:
    """Check `toolset` against `manifest`: the one entry for the drift check.

    Args:
        toolset: The tools in code.
        manifest: The reviewed manifest.
        strict: Fail on warnings too (a schema not pinned).

    Raises:
        ManifestDrift: they disagree; `.problems` lists every disagreement.
    """
    found = [p.message for p in review(toolset, manifest, strict=strict)
             if p.severity == "error"]
    if found:
        raise ManifestDrift(found)
