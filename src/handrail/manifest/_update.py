"""`handrail manifest update`: bring a reviewed manifest up to date with the code, by text.

The manifest is reviewed text: comments, the order of grants and the spelling of what a person
wrote are part of the review. So the update is a merge of *blocks* of the file, not a rewrite:
a `[[tools]]` entry (with its sub-tables) or the `[agent]` table is replaced only when its
meaning changes, removed only when nothing implements it, and new grants are appended after the
last one; every other line of the file stays byte for byte. What the update decides:

- a tool in the code and not granted: granted as `init` would write it;
- a grant nothing implements: removed (unless it says `awaited = true`);
- a grant's `arguments` and `output` follow the code (except where the tool leaves its
  arguments to the grant), `mutates`/`idempotent` only ever get stricter, and a description a
  person wrote is kept (one the grant lacks comes from the code);
- for an Agent: `[agent]` instructions and model follow the code, a written name is kept;
- `[policy]` (its `extends` too), `[budgets]`, `[control]` and `[[servers]]` are never
  touched.

A file whose grants are not written as `[[tools]]` tables (`tools = [...]`), or a merge whose
result would not mean exactly the intended manifest, is rewritten whole instead (the note says
so: its comments are lost).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handrail.errors import ManifestError
from handrail.manifest._check import schema_changes
from handrail.manifest._locate import key_lines
from handrail.manifest._manifest import (
    AgentSection,
    Grant,
    Manifest,
    canonical_json,
    grant_for,
    grant_toml,
    open_schema,
    plain,
)
from handrail.manifest._toml_out import table
from handrail.manifest._toolsets import SpecSource, tools_of
from handrail.tools import Toolset

__all__ = ["Updated", "update"]


@dataclass(frozen=True, slots=True)
class Updated:
    """The outcome of `update`: the new text, the manifest it means, and what changed."""

    old_text: str
    """The file as it was."""
    text: str
    """The file as it should be."""
    manifest: Manifest
    """`text`, parsed."""
    changes: list[str] = field(default_factory=list)
    """One line per change, for a reviewer; empty when the file is up to date."""
    note: str | None = None
    """Anything the reviewer must know about how the text was produced."""

    def diff(self, name: str) -> str:
        """A unified diff from the old text to the new one."""
        return "".join(difflib.unified_diff(
            self.old_text.splitlines(keepends=True), self.text.splitlines(keepends=True),
            fromfile=f"{name} (before)", tofile=f"{name} (after)"))


def _same(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


def _merged_grant(old: Grant, spec_grant: Grant, leaves_arguments_open: bool) -> Grant:
    arguments = old.arguments if leaves_arguments_open else spec_grant.arguments
    return Grant(ref=old.ref, description=old.description or spec_grant.description,
                 mutates=old.mutates or spec_grant.mutates,
                 idempotent=old.idempotent and spec_grant.idempotent,
                 arguments=arguments, output=spec_grant.output)


def _grant_changes(old: Grant, new: Grant) -> list[str]:
    ref, out = str(old.ref), []
    if old.description != new.description:
        out.append(f"'{ref}': description taken from the code (the grant had none)")
    if old.mutates != new.mutates:
        out.append(f"'{ref}': mutates = true (the tool declares mutates=True)")
    if old.idempotent != new.idempotent:
        out.append(f"'{ref}': idempotent = false (the tool does not declare itself "
                   "idempotent)")
    for name, noun in (("arguments", "parameter"), ("output", "field")):
        before, after = getattr(old, name), getattr(new, name)
        if _same(before, after):
            continue
        if before is None:
            out.append(f"'{ref}': {'input' if name == 'arguments' else 'output'} schema pinned")
        elif after is None:
            out.append(f"'{ref}': output schema removed (the tool declares none)")
        else:
            for change in schema_changes(before, after, noun=noun):
                out.append(f"'{ref}': {change}")
    return out


def update(old_text: str, toolbox: Toolset | SpecSource, agent: Mapping[str, Any], *,
           source: str = "<string>") -> Updated:
    """Merge what the code declares into the manifest `old_text` (see the module docstring).

    `agent` holds what an Agent target says (`name`, `instructions`, `model`), or is empty.

    Raises:
        ManifestError: `old_text` is not a valid manifest.
    """
    old = Manifest.from_toml(old_text, source=source)
    changes: list[str] = []
    grants: list[Grant] = []
    replaced: dict[int, Grant] = {}  # index in old.grants -> new grant
    removed: list[int] = []
    added: list[Grant] = []
    implemented = set()
    index_of = {g.ref: i for i, g in enumerate(old.grants)}
    for tool in tools_of(toolbox):
        implemented.add(tool.spec.id)
        fresh = grant_for(tool.spec)
        index = index_of.get(tool.spec.id)
        if index is None:
            added.append(fresh)
            changes.append(f"'{tool.spec.id}': granted (new in the code)")
            continue
        before = old.grants[index]
        merged = _merged_grant(before, fresh, open_schema(plain(tool.spec.input_schema)))
        if not _same(merged.canonical(), before.canonical()):
            replaced[index] = merged
            changes.extend(_grant_changes(before, merged))
    for index, grant in enumerate(old.grants):
        if grant.ref not in implemented and not grant.awaited:
            removed.append(index)
            changes.append(f"'{grant.ref}': grant removed (nothing implements it)")
        else:
            grants.append(replaced.get(index, grant))
    grants.extend(added)

    section = old.agent
    if agent:
        section = AgentSection(name=section.name or agent.get("name"),
                               instructions=agent.get("instructions"),
                               model=agent.get("model") or section.model)
        for name in ("name", "instructions", "model"):
            if getattr(section, name) != getattr(old.agent, name):
                changes.append(f"[agent] {name} taken from the code")
    # Everything but the grants and [agent] is the old manifest's, as written: its policy
    # (never inlined), budgets, control and [[servers]].
    intended = dataclasses.replace(old, agent=section, grants=tuple(grants))
    if not changes:
        return Updated(old_text, old_text, old)

    text, note = _merge_text(old_text, old, replaced, removed, added,
                             section if section != old.agent else None)
    parsed: Manifest | None = None
    if text is not None:
        # The merged text must mean exactly the intended manifest; a layout the block merge
        # misreads falls back to a whole rewrite rather than to a file that means more or less.
        try:
            parsed = Manifest.from_toml(text, source=source)
        except ManifestError:
            parsed = None
        if parsed != intended:
            text, parsed = None, None
            note = "the file could not be merged block by block"
    if text is None or parsed is None:
        text = intended.to_toml()
        parsed = Manifest.from_toml(text, source=source)
        note = f"{note}; it was rewritten whole, and its comments are lost"
    return Updated(old_text, text, parsed, changes, note)


# -- the text merge --------------------------------------------------------------------------


def _blocks(text: str, old: Manifest) -> tuple[dict[tuple[str | int, ...], tuple[int, int]],
                                                list[str]] | None:
    """The line span [start, end) of `[agent]` and each `[[tools]]` entry; None if not tables."""
    lines = text.splitlines(keepends=True)
    try:
        where = key_lines(text)
    except (ValueError, IndexError):
        return None
    starts = sorted({line for path, line in where.items() if len(path) >= 1})
    spans: dict[tuple[str | int, ...], tuple[int, int]] = {}
    wanted: list[tuple[tuple[str | int, ...], str]] = [
        (("tools", i), "[[tools]]") for i in range(len(old.grants))]
    if ("agent",) in where:
        wanted.append((("agent",), "[agent]"))
    for path, header in wanted:
        first = where.get(path)
        if first is None or not lines[first - 1].strip().startswith(header):
            return None
        # The block runs to the line before the next thing outside it; blank lines and
        # comments right before that thing belong to it.
        inside = {line for p, line in where.items() if p[:len(path)] == path}
        later = [line for line in starts if line > first and line not in inside]
        end = (min(later) - 1) if later else len(lines)  # 0-based exclusive
        while end > first and (not lines[end - 1].strip()
                               or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        spans[path] = (first - 1, end)
    return spans, lines


def _merge_text(text: str, old: Manifest, replaced: dict[int, Grant], removed: list[int],
                added: list[Grant], agent: AgentSection | None) -> tuple[str | None, str | None]:
    found = _blocks(text, old)
    if found is None:
        return None, ("its grants or [agent] are not written as [[tools]] / [agent] tables")
    spans, lines = found
    edits: list[tuple[int, int, list[str]]] = []
    for index, grant in replaced.items():
        start, end = spans[("tools", index)]
        edits.append((start, end, _keep_comments(grant_toml(grant), lines[start:end])))
    for index in removed:
        start, end = spans[("tools", index)]
        # Take the blank lines that separated it too, so no gap is left behind.
        while end < len(lines) and not lines[end].strip():
            end += 1
        edits.append((start, end, []))
    if added:
        new_lines = [line + "\n" for grant in added for line in ["", *grant_toml(grant)]]
        kept = [spans[("tools", i)][1] for i in range(len(old.grants)) if i not in removed]
        gone = [spans[("tools", i)][0] for i in removed]
        at = max(kept) if kept else min(gone) if gone else len(lines)
        if not kept:
            new_lines = [*new_lines[1:], "\n"]  # it starts a block: the gap goes after it
        if at == len(lines) and lines and not lines[-1].endswith("\n"):
            new_lines.insert(0, "\n")
        edits.append((at, at, new_lines))
    if agent is not None:
        data = {k: v for k, v in agent.canonical().items() if v is not None}
        block = [line + "\n" for line in table("agent", data)]
        if ("agent",) in spans:
            start, end = spans[("agent",)]
            edits.append((start, end, block))
        else:
            at = _after_leading_comments(lines)
            edits.append((at, at, [*block, "\n"]))
    # Apply from the bottom up so earlier spans keep their line numbers; an insertion at the
    # end of a block goes after a replacement of that block.
    edits.sort(key=lambda e: (e[0], e[1]), reverse=True)
    for start, end, new in edits:
        lines[start:end] = new
    return "".join(lines), None


_TRAILING_COMMENT = re.compile(r"[ \t]+#[^\n]*\n?")


def _keep_comments(new: list[str], old: list[str]) -> list[str]:
    # A line the rewrite leaves as it was keeps its trailing comment: `description = "..."
    # # our words` stays so when only the schema changed. Comments on their own line inside
    # the block are lost (the diff shows them go).
    commented: dict[str, str] = {}
    for line in old:
        for candidate in new:
            if (line.startswith(candidate) and candidate.strip()
                    and _TRAILING_COMMENT.fullmatch(line, len(candidate))):
                commented.setdefault(candidate, line.rstrip("\n"))
    return [commented.get(line, line) + "\n" for line in new]


def _after_leading_comments(lines: list[str]) -> int:
    at = 0
    while at < len(lines) and lines[at].lstrip().startswith("#"):
        at += 1
    while at < len(lines) and not lines[at].strip():
        at += 1
    return at
