"""The drift check: each problem alone, all of them at once, and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
from manifest_tools import GOOD_TOML, SHELL_SCHEMA, Transfer, make_box, read, shell_tool

import handrail as hr
from handrail.manifest import Grant, Manifest, check_against, problems
from handrail.manifest._toolsets import tools_of


def _manifest(*grants: str) -> Manifest:
    return Manifest.from_toml("\n".join(grants), source="handrail.toml")


READ = '[[tools]]\nref = "ledger/read"\nmutates = false\ndescription = "Read."\n'
TRANSFER = '[[tools]]\nref = "ledger/transfer"\ndescription = "Move."\n'
SHELL = ('[[tools]]\nref = "shell/run"\ndescription = "Run."\n'
         'arguments = { type = "object", properties = { cmd = { type = "string", '
         'description = "The command line." } }, required = ["cmd"] }\n')


def test_a_matching_manifest_has_no_problems() -> None:
    box = make_box()
    m = Manifest.from_toml(GOOD_TOML)
    assert problems(box, m) == []
    check_against(box, m)
    assert problems(box, _manifest(READ, TRANSFER, SHELL)) == []


def test_the_manifest_module_is_the_one_entry() -> None:
    # The tool layer does not know manifests exist (issue 22): no method on Toolbox.
    assert not hasattr(hr.Toolbox, "check_against")


def test_a_tool_implemented_but_not_granted() -> None:
    found = problems(make_box(), _manifest(READ, SHELL))
    assert found == [
        "tool 'ledger/transfer' is implemented (class manifest_tools.Transfer) but not granted "
        "in handrail.toml — the code can do what the reviewed declaration does not admit; "
        "grant it with a [[tools]] entry (ref = \"ledger/transfer\") or remove it from the "
        "toolbox"
    ]


def test_a_tool_granted_but_not_implemented() -> None:
    extra = '[[tools]]\nref = "ledger/refund"\ndescription = "Refund."\n'
    found = problems(make_box(), _manifest(READ, TRANSFER, SHELL, extra))
    line = READ.count("\n") + TRANSFER.count("\n") + SHELL.count("\n") + 4
    assert found == [
        f"tool 'ledger/refund' is granted in handrail.toml:{line} but nothing implements it — "
        "the model would be offered a tool that fails; remove the grant or add the tool to the "
        "toolbox"
    ]


def test_a_mutating_tool_granted_as_not_mutating() -> None:
    lax = TRANSFER.replace('description', 'mutates = false\ndescription')
    found = problems(make_box(), _manifest(READ, lax, SHELL))
    assert len(found) == 1
    assert found[0].startswith(
        "tool 'ledger/transfer' declares mutates=True (class manifest_tools.Transfer) but is "
        "granted with mutates = false in handrail.toml:6 — that exemption would let "
        "model-chosen arguments reach something that changes the world; set mutates = true")


def test_an_operator_may_be_stricter_than_the_author() -> None:
    strict = READ.replace("mutates = false", "mutates = true")
    assert problems(make_box(), _manifest(strict, TRANSFER, SHELL)) == []
    not_idempotent = READ  # read declares idempotent=True; the grant leaves it false
    assert problems(make_box(), _manifest(not_idempotent, TRANSFER, SHELL)) == []


def test_a_grant_claiming_idempotence_the_tool_does_not_declare() -> None:
    lax = TRANSFER.replace('description', 'idempotent = true\ndescription')
    found = problems(make_box(), _manifest(READ, lax, SHELL))
    assert len(found) == 1
    assert found[0].startswith("tool 'ledger/transfer' is granted with idempotent = true in "
                               "handrail.toml:6 but the tool does not declare itself idempotent")


def test_a_typed_tool_whose_schema_differs_from_the_pinned_one() -> None:
    pinned = READ + ('arguments = { type = "object", properties = { account = { type = '
                     '"string" } } }\n')
    found = problems(make_box(), _manifest(pinned, TRANSFER, SHELL))
    assert found == [
        "the input schema of 'ledger/read' (function manifest_tools.read) differs from the one "
        "pinned in handrail.toml:1: changed parameter 'account': now required, description "
        "\"The account's id.\" added; keyword 'additionalProperties' false added — the model "
        "would be offered parameters nobody reviewed; review the change and run `handrail "
        "manifest update` (or edit [tools.arguments]), or change the tool back"
    ]
    # An identical copy is the pin, for a class tool as for a function.
    schema = dict(Transfer.__handrail_tool__.spec.input_schema)
    m = Manifest(grants=(Grant(ref="ledger/transfer", description="Move.", arguments=schema),))
    assert problems(hr.Toolbox([Transfer]), m) == []


def test_a_grant_without_a_description() -> None:
    bare = TRANSFER.replace('description = "Move."\n', "")
    found = problems(make_box(), _manifest(READ, bare, SHELL))
    assert found == [
        "tool 'ledger/transfer' is granted in handrail.toml:6 without a description — the model "
        "would be shown text nobody reviewed; add description = \"...\" to the grant"
    ]


def test_an_untyped_tool_whose_schema_differs_from_the_grant() -> None:
    changed = dict(SHELL_SCHEMA, required=[])
    box = hr.Toolbox([read, Transfer, shell_tool(changed)])
    found = problems(box, _manifest(READ, TRANSFER, SHELL))
    assert len(found) == 1
    assert found[0].startswith("the input schema of 'shell/run' (spec shell/run) differs from the "
                               "one pinned in handrail.toml:10: changed parameter 'cmd': now "
                               "optional")


def test_an_untyped_tool_may_leave_its_schema_to_the_grant() -> None:
    open_tool = shell_tool({"type": "object"})
    box = hr.Toolbox([read, Transfer, open_tool])
    m = _manifest(READ, TRANSFER, SHELL)
    assert problems(box, m) == []
    (offered,) = m.offer([open_tool.spec])
    assert offered.input_schema == SHELL_SCHEMA
    # ... or grant it without arguments, keeping its own schema.
    assert problems(make_box(), _manifest(READ, TRANSFER, '[[tools]]\nref = "shell/run"\n'
                                          'description = "Run."\n')) == []


def test_every_problem_is_listed_at_once() -> None:
    text = (
        '[[tools]]\nref = "ledger/read"\nmutates = false\n'                    # 1-3: no descr.
        'arguments = { type = "object", properties = { a = {} } }\n'           # 4: changed
        '[[tools]]\nref = "ledger/transfer"\nmutates = false\n'                # 5-7: lax
        'description = "Move."\n'
        '[[tools]]\nref = "ledger/refund"\ndescription = "Refund."\n'          # 9: ghost
    )
    m = Manifest.from_toml(text, source="handrail.toml")
    with pytest.raises(hr.ManifestDrift) as info:
        check_against(make_box(), m)
    found = info.value.problems
    assert [p.split(" — ")[0] for p in found] == [
        "the input schema of 'ledger/read' (function manifest_tools.read) differs from the one "
        "pinned in handrail.toml:1: added parameter 'account' (string, required); removed "
        "parameter 'a' (optional); keyword 'additionalProperties' false added",
        "tool 'ledger/read' is granted in handrail.toml:1 without a description",
        "tool 'ledger/transfer' declares mutates=True (class manifest_tools.Transfer) but is "
        "granted with mutates = false in handrail.toml:5",
        "tool 'shell/run' is implemented (spec shell/run) but not granted in handrail.toml",
        "tool 'ledger/refund' is granted in handrail.toml:9 but nothing implements it",
    ]
    assert str(info.value).startswith("the code has drifted from the manifest (5 problems):\n"
                                      "  - the input schema of 'ledger/read'")
    assert found == problems(make_box(), m)


def test_a_spec_only_source_is_checked_as_untyped() -> None:
    class Specs:
        def specs(self) -> list[hr.ToolSpec]:
            return [read.spec]

    m = _manifest(READ + 'arguments = { type = "object", properties = { x = {} } }\n')
    found = problems(Specs(), m)
    assert len(found) == 1
    assert "differs from the one pinned" in found[0]


def test_anything_else_is_refused() -> None:
    with pytest.raises(hr.UserError, match="expected a Toolbox"):
        problems([read], Manifest())  # type: ignore[arg-type]


def test_offer_shows_only_granted_tools_with_the_reviewed_text() -> None:
    box = make_box()
    m = _manifest(
        TRANSFER.replace('"Move."', '"Move money; ask first."'),
        '[[tools]]\nref = "ledger/read"\nmutates = true\nidempotent = true\n',
    )
    offered = m.offer(box.specs())
    assert [str(s.id) for s in offered] == ["ledger/read", "ledger/transfer"]  # the box's order
    read_spec, transfer_spec = offered
    assert transfer_spec.description == "Move money; ask first."
    assert transfer_spec.input_schema == Transfer.__handrail_tool__.spec.input_schema
    assert read_spec.description == read.spec.description  # no grant text: the tool's own
    assert read_spec.mutates is True  # the stricter of the two
    assert read_spec.idempotent is True  # both say so
    assert Manifest.from_toml(READ).offer(box.specs())[0].idempotent is False  # grant withdraws
    assert m.offer([]) == []


def test_from_toolbox_grants_everything_as_declared() -> None:
    box = make_box()
    m = Manifest.from_toolbox(box, name="bot", model="scripted")
    assert problems(box, m) == []
    by_ref: dict[str, Any] = {str(g.ref): g for g in m.grants}
    assert by_ref["ledger/read"] == Grant(
        ref="ledger/read", mutates=False, idempotent=True,
        description="Read a ledger account's balance.",
        arguments=dict(read.spec.input_schema), output={"type": "integer"})
    assert by_ref["shell/run"].arguments == SHELL_SCHEMA
    assert by_ref["ledger/transfer"].arguments == Transfer.__handrail_tool__.spec.input_schema
    assert by_ref["ledger/transfer"].output is None
    assert m.agent.name == "bot"
    assert Manifest.from_toml(m.to_toml()) == m


def test_function_and_class_tools_count_as_typed_and_a_schema_tool_does_not() -> None:
    # Read from a marker on the impl's class, so the manifest never imports the typed tool
    # core (and pydantic) to ask (issue 11).
    found = {str(t.spec.id): t.typed for t in tools_of(hr.Toolbox([read, Transfer,
                                                                  shell_tool(SHELL_SCHEMA)]))}
    assert found == {"ledger/read": True, "ledger/transfer": True, "shell/run": False}
