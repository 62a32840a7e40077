"""`check_against`: every way the code and the reviewed manifest disagree, found at once.

Deriving a schema from a type is ergonomics; noticing that the reviewed declaration and the
code have drifted apart is a control. Each problem says what is wrong, why it matters and what
to change, and all of them are reported together so one run of the check fixes them all.
"""

from __future__ import annotations

from handrail.errors import ManifestDrift
from handrail.manifest._manifest import Grant, Manifest, canonical_json, open_schema, plain
from handrail.manifest._toolsets import SpecSource, tools_of
from handrail.tools import Toolset

__all__ = ["check_against", "problems"]


def _where(manifest: Manifest, grant: Grant) -> str:
    if manifest.source == "<string>":
        return "the manifest" + (f" (line {grant.line})" if grant.line else "")
    return f"{manifest.source}:{grant.line}" if grant.line else manifest.source


def _manifest_name(manifest: Manifest) -> str:
    return "the manifest" if manifest.source == "<string>" else manifest.source


def problems(toolset: Toolset | SpecSource, manifest: Manifest) -> list[str]:
    """Every disagreement between `toolset` and `manifest`, as messages; empty when none.

    Tools come in the toolset's order, then grants nothing implements in the manifest's order.
    """
    found: list[str] = []
    implemented = set()
    for tool in tools_of(toolset):
        spec, ref = tool.spec, tool.spec.id
        implemented.add(ref)
        grant = manifest.grant(ref)
        if grant is None:
            found.append(
                f"tool '{ref}' is implemented ({tool.origin}) but not granted in "
                f"{_manifest_name(manifest)} — the code can do what the reviewed declaration "
                f"does not admit; grant it with a [[tools]] entry (ref = \"{ref}\") or remove "
                "it from the toolbox"
            )
            continue
        where = _where(manifest, grant)
        if spec.mutates and not grant.mutates:
            found.append(
                f"tool '{ref}' declares mutates=True ({tool.origin}) but is granted with "
                f"mutates = false in {where} — that exemption would let model-chosen arguments "
                "reach something that changes the world; set mutates = true in the grant, or "
                "declare the tool mutates=False in the code if it truly changes nothing"
            )
        if grant.idempotent and not spec.idempotent:
            found.append(
                f"tool '{ref}' is granted with idempotent = true in {where} but the tool does "
                f"not declare itself idempotent ({tool.origin}) — calls in doubt would be "
                "retried on the manifest's word alone; remove idempotent = true from the grant, "
                "or declare idempotent=True in the code"
            )
        if grant.arguments is not None:
            if tool.typed:
                found.append(
                    f"the grant of '{ref}' in {where} repeats arguments for a tool typed in "
                    f"Python ({tool.origin}) — the second copy can only drift; delete arguments "
                    "from the grant (the schema comes from the type)"
                )
            elif not open_schema(spec.input_schema) and (
                canonical_json(plain(spec.input_schema)) != canonical_json(grant.arguments)
            ):
                found.append(
                    f"the arguments granted for '{ref}' in {where} differ from the schema the "
                    f"tool declares ({tool.origin}) — the reviewed schema is not the one in "
                    "force; update arguments in the grant (`handrail manifest init` prints the "
                    "tool's) or change the tool back"
                )
        if grant.description is None:
            found.append(_no_description(manifest, grant))
    for grant in manifest.grants:
        if grant.ref in implemented:
            continue
        found.append(
            f"tool '{grant.ref}' is granted in {_where(manifest, grant)} but nothing implements "
            "it — the model would be offered a tool that fails; remove the grant or add the "
            "tool to the toolbox"
        )
        if grant.description is None:
            found.append(_no_description(manifest, grant))
    return found


def _no_description(manifest: Manifest, grant: Grant) -> str:
    return (
        f"tool '{grant.ref}' is granted in {_where(manifest, grant)} without a description — "
        "the model would be shown text nobody reviewed; add description = \"...\" to the grant"
    )


def check_against(toolset: Toolset | SpecSource, manifest: Manifest) -> None:
    """Check `toolset` against `manifest`: the one entry for the drift check.

    Raises:
        ManifestDrift: they disagree; `.problems` lists every disagreement.
    """
    found = problems(toolset, manifest)
    if found:
        raise ManifestDrift(found)
