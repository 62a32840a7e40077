"""Reading handrail.toml strictly: every refusal names the key and its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from manifest_tools import GOOD_TOML, SHELL_SCHEMA

import handrail as hr
from handrail.manifest import AgentSection, Budgets, Grant, Manifest


def _error(text: str, source: str = "handrail.toml") -> str:
    with pytest.raises(hr.ManifestError) as info:
        Manifest.from_toml(text, source=source)
    return str(info.value)


def test_a_full_manifest_parses_into_its_sections() -> None:
    m = Manifest.from_toml(GOOD_TOML, source="handrail.toml")
    assert m.agent == AgentSection(name="ledger-bot",
                                   instructions="Pay invoices; never move more than asked.",
                                   model="openai:gpt-4.1-mini")
    assert [str(g.ref) for g in m.grants] == ["ledger/read", "ledger/transfer", "shell/run"]
    read, transfer, shell = m.grants
    assert (read.mutates, read.idempotent, read.arguments) == (False, True, None)
    assert (transfer.mutates, transfer.idempotent) == (True, False)  # the defaults
    assert shell.arguments == SHELL_SCHEMA
    assert [g.line for g in m.grants] == [7, 13, 17]
    assert m.budgets == Budgets(max_steps=20, max_tokens=200_000, max_wall_seconds=300.0)
    assert m.policy is None
    assert m.source == "handrail.toml"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", m.digest)


def test_an_empty_manifest_is_valid_and_grants_nothing() -> None:
    m = Manifest.from_toml("")
    assert m.grants == ()
    assert m.agent == AgentSection()
    assert m.budgets == Budgets()
    assert m.source == "<string>"
    assert m.grant("ledger/read") is None


def test_grant_lookup_takes_ids_and_strings() -> None:
    m = Manifest.from_toml('[[tools]]\nref = "ledger/read"\n[[tools]]\nref = "plain"\n')
    assert m.grant("ledger/read") is m.grants[0]
    assert m.grant(hr.ToolId("ledger", "read")) is m.grants[0]
    assert m.grant("local/plain") is m.grants[1]  # a bare ref is on the default server
    assert m.grant("plain") is m.grants[1]
    assert m.grant("ledger/write") is None
    assert m.grant("not a/valid/id") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[agent]\nname = "a"\n\nmodle = "m"\n',
         "handrail.toml:4: unknown key 'modle' in [agent] (known: name, instructions, model); "
         "did you mean 'model'?"),
        ('[[tools]]\nref = "a/b"\n[[tools]]\nref = "a/c"\n[[tools]]\nref = "a/d"\n'
         'descripton = "x"\n',
         "handrail.toml:7: unknown key 'descripton' in [[tools]] #3 (known: ref, mutates, "
         "description, idempotent, arguments, output, trusted_output, awaited);"
         " did you mean 'description'?"),
        ('# the budgets\n[budgets]\ndeadline = 3\n',
         "handrail.toml:3: unknown key 'deadline' in [budgets] (known: max_steps, max_tokens, "
         "max_wall_seconds)"),
        ('version = 1\n',
         "handrail.toml:1: unknown key 'version' at the top level (known: agent, tools, policy, "
         "budgets, servers, control)"),
        ('[tool]\nref = "a/b"\n',
         "handrail.toml:1: unknown key 'tool' at the top level (known: agent, tools, policy, "
         "budgets, servers, control); did you mean 'tools'?"),
    ],
)
def test_an_unknown_key_is_refused_naming_it_and_its_line(text: str, expected: str) -> None:
    assert _error(text) == expected


def test_line_numbers_follow_every_toml_spelling() -> None:
    inline = 'tools = [\n  { ref = "a/b" },\n  # c\n  { ref = "a/c", mutate = false },\n]\n'
    assert _error(inline).startswith("handrail.toml:4: unknown key 'mutate' in [[tools]] #2")
    dotted = 'agent.name = "x"\nagent.nam = "y"\n'
    assert _error(dotted).startswith("handrail.toml:2: unknown key 'nam' in [agent]")
    multiline = ('[agent]\ninstructions = """\nline one\n[[tools]]\nnot = "a key"\n"""\n'
                 'colour = "red"\n')
    assert _error(multiline).startswith("handrail.toml:7: unknown key 'colour' in [agent]")
    quoted = '[agent]\n"name" = "x"\n\'spaced key\' = 1\n'
    assert _error(quoted).startswith("handrail.toml:3: unknown key 'spaced key' in [agent]")


def test_every_problem_of_the_file_is_reported_at_once_in_line_order() -> None:
    text = (
        '[budgets]\n'                      # 1
        'max_steps = 0\n'                  # 2
        '[[tools]]\n'                      # 3
        'ref = "ledger/read"\n'            # 4
        'mutates = "no"\n'                 # 5
        '[[tools]]\n'                      # 6
        'ref = "ledger read"\n'            # 7
        '[agent]\n'                        # 8
        'name = 3\n'                       # 9
        'extra = true\n'                   # 10
    )
    lines = _error(text).splitlines()
    assert [line.split(":")[1] for line in lines] == ["2", "5", "7", "9", "10"]
    assert lines[0] == "handrail.toml:2: max_steps in [budgets] must be a positive integer, not 0"
    assert lines[1] == ("handrail.toml:5: mutates in [[tools]] #1 must be true or false, not "
                        "the string 'no'")
    assert lines[2].startswith("handrail.toml:7: invalid ref 'ledger read' in [[tools]] #2: ")
    assert lines[3] == "handrail.toml:9: name in [agent] must be a string, not 3"
    assert lines[4].startswith("handrail.toml:10: unknown key 'extra' in [agent]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[tools]]\nref = "a/b/c"\n',
         "handrail.toml:2: invalid ref 'a/b/c' in [[tools]] #1: invalid tool id 'a/b/c': "
         "expected exactly one '/' (server/name)"),
        ('[[tools]]\nref = ""\n', "handrail.toml:2: invalid ref '' in [[tools]] #1: "),
        ('[[tools]]\nref = "a/b c"\n', "handrail.toml:2: invalid ref 'a/b c' in [[tools]] #1: "),
        ('[[tools]]\nref = 7\n',
         "handrail.toml:2: ref in [[tools]] #1 must be a \"server/name\" string, not 7"),
        ('[[tools]]\ndescription = "x"\n',
         "handrail.toml:1: [[tools]] #1 has no ref; add ref = \"server/name\""),
    ],
)
def test_an_invalid_ref_is_refused(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


def test_a_duplicate_grant_is_refused_naming_both_lines() -> None:
    text = ('[[tools]]\nref = "ledger/read"\n\n[[tools]]\nref = "ledger/write"\n\n'
            '[[tools]]\nref = "ledger/read"\nmutates = false\n')
    assert _error(text) == ("handrail.toml:7: tool 'ledger/read' is granted twice ([[tools]] #1 "
                            "at line 1 and #3); keep one grant")


def test_a_duplicate_spelled_differently_is_still_a_duplicate() -> None:
    assert "tool 'local/x' is granted twice" in _error(
        'tools = [{ref = "x"}, {ref = "local/x"}]\n')


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[tools]\nref = "a/b"\n',
         "handrail.toml:1: tools must be a list of [[tools]] tables, one per granted tool"),
        ('agent = "bot"\n', "handrail.toml:1: agent must be a table ([agent]), not the string "),
        ('budgets = [1]\n', "handrail.toml:1: budgets must be a table ([budgets]), not an array"),
        ('[budgets]\nmax_tokens = 1.5\n',
         "handrail.toml:2: max_tokens in [budgets] must be a positive integer, not 1.5"),
        ('[budgets]\nmax_steps = true\n',
         "handrail.toml:2: max_steps in [budgets] must be a positive integer, not the boolean"),
        ('[budgets]\nmax_wall_seconds = -1\n',
         "handrail.toml:2: max_wall_seconds in [budgets] must be a positive number of seconds"),
        ('[budgets]\nmax_wall_seconds = inf\n',
         "handrail.toml:2: max_wall_seconds in [budgets] must be a positive number of seconds"),
        ('[[tools]]\nref = "a/b"\narguments = "{}"\n',
         "handrail.toml:3: arguments in [[tools]] #1 must be a table (a JSON Schema), not "),
        ('[[tools]]\nref = "a/b"\ndescription = ["x"]\n',
         "handrail.toml:3: description in [[tools]] #1 must be a string, not an array"),
        ('[[tools]]\nref = "a/b"\n[tools.arguments]\ntype = "array"\n',
         "handrail.toml:3: arguments of 'a/b' in [[tools]] #1: arguments must describe a JSON "
         "object"),
        ('[[tools]]\nref = "a/b"\n[tools.arguments]\ntype = "object"\nrequired = "x"\n',
         "handrail.toml:3: arguments of 'a/b' in [[tools]] #1: not a valid JSON Schema: "),
        ('[[tools]]\nref = "a/b"\n[tools.arguments]\ntype = "object"\n\n'
         '[tools.arguments.properties.when]\ndefault = 2024-01-01\n',
         "handrail.toml:7: arguments.properties.when.default of 'a/b' in [[tools]] #1: a TOML "
         "date has no JSON form; write it as a string"),
        ('policy = 3\n', "handrail.toml:1: policy must be a table ([policy]), not 3"),
    ],
)
def test_a_wrongly_typed_value_is_refused_with_its_line(text: str, expected: str) -> None:
    assert _error(text).startswith(expected)


def test_invalid_toml_is_refused_with_its_line() -> None:
    message = _error('[agent]\nname = "x"\nmodel = \n')
    assert message.startswith("handrail.toml:3: not valid TOML: ")
    assert "(at line" not in message
    assert _error('[agent]\nname = "a"\nname = "b"\n').startswith(
        "handrail.toml:3: not valid TOML: ")


def test_load_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "handrail.toml"
    path.write_text('[agent]\nnme = "x"\n', encoding="utf-8")
    with pytest.raises(hr.ManifestError, match=re.escape(f"{path}:2: unknown key 'nme'")):
        Manifest.load(path)
    path.write_text(GOOD_TOML, encoding="utf-8")
    loaded = Manifest.load(str(path))
    assert loaded.source == str(path)
    assert loaded == Manifest.from_toml(GOOD_TOML)


def test_load_refuses_a_missing_or_binary_file(tmp_path: Path) -> None:
    with pytest.raises(hr.ManifestError, match=r"cannot read the manifest .*nope\.toml"):
        Manifest.load(tmp_path / "nope.toml")
    path = tmp_path / "bad.toml"
    path.write_bytes(b'[agent]\nname = "\xff"\n')
    with pytest.raises(hr.ManifestError, match="not UTF-8"):
        Manifest.load(path)


def test_text_is_stored_in_one_spelling() -> None:
    text = ('[agent]\r\ninstructions = """\r\n  Be careful.\r\n  Really.\r\n"""\r\n'
            '[[tools]]\r\nref = "a/b"\r\ndescription = "   "\r\n')
    m = Manifest.from_toml(text)
    assert m.agent.instructions == "Be careful.\n  Really."
    assert m.grants[0].description is None  # blank is no description


def test_a_grant_checks_its_own_fields() -> None:
    assert Grant(ref="ledger/read").ref == hr.ToolId("ledger", "read")
    with pytest.raises(hr.ManifestError, match="mutates must be true or false"):
        Grant(ref="a/b", mutates="yes")  # type: ignore[arg-type]
    with pytest.raises(hr.ManifestError, match="arguments: arguments must describe a JSON obj"):
        Grant(ref="a/b", arguments={"type": "string"})
    with pytest.raises(hr.UserError, match="invalid tool id"):
        Grant(ref="a/b/c")
    with pytest.raises(hr.ManifestError, match=r"\[budgets\] max_steps must be a positive"):
        Budgets(max_steps=0)
    with pytest.raises(hr.ManifestError, match=r"\[agent\] model must be a string"):
        AgentSection(model=3)  # type: ignore[arg-type]


def test_a_manifest_built_in_code_refuses_duplicates() -> None:
    with pytest.raises(hr.ManifestError, match="tool 'a/b' is granted twice"):
        Manifest(grants=(Grant(ref="a/b"), Grant(ref="a/b", mutates=False)))


def test_a_manifest_is_immutable_and_isolated_from_its_inputs() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    m = Manifest(grants=(Grant(ref="a/b", arguments=schema),))
    before = m.digest
    schema["properties"]["y"] = {"type": "integer"}  # the caller's dict, not the manifest's
    assert m.grants[0].arguments == {"type": "object", "properties": {"x": {"type": "string"}}}
    assert Manifest(grants=m.grants).digest == before
    with pytest.raises(AttributeError):
        m.source = "elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        'quote " and backslash \\ and """ triple',
        'ends with a quote "',
        "ends with two quotes \"\"",
        "multi\nline with \"\"\" and \\ and\ttab",
        "control \x00\x01\x1b\x7f chars",
        "unicode: é, ü, 日本, 𝄞",
        "'single' and '''triple''' quotes",
    ],
)
def test_to_toml_round_trips_awkward_text(text: str) -> None:
    m = Manifest(
        agent=AgentSection(name="bot", instructions=text, model=text),
        grants=(Grant(ref="a/b", description=text, arguments={
            "type": "object",
            "properties": {text: {"type": "string", "description": text, "enum": [text, "x"]},
                           "$ref-like key": {"$ref": "#/$defs/x"}},
            "$defs": {"x": {"type": "integer", "minimum": 1.5}},
            "anyOf": [{"required": [text]}, {"required": ["$ref-like key"]}],
        }),),
    )
    back = Manifest.from_toml(m.to_toml())
    assert back == m
    assert back.grants[0].description == m.grants[0].description
    assert back.agent == m.agent
    assert back.grants[0].arguments == m.grants[0].arguments


POLICY = """[agent]
name = "x"

[policy]
extends = "default"

[[policy.layers]]
name = "app"
deny = ["write:src/secrets/**"]
{rule}
"""


def test_a_policy_section_becomes_the_manifests_policy() -> None:
    m = Manifest.from_toml(POLICY.format(rule='allow = ["write:src/**"]'))
    assert m.policy is not None
    layers = m.policy.to_dict()["layers"]
    assert layers[-1] == {"name": "app", "deny": ["write:src/secrets/**"],
                          "allow": ["write:src/**"]}
    assert m.policy.to_dict() == hr_policy_default_plus_app()
    assert Manifest.from_toml(m.to_toml()) == m


def hr_policy_default_plus_app() -> dict[str, object]:
    from handrail.policy import Policy

    return Policy.from_dict({"extends": "default", "layers": [
        {"name": "app", "deny": ["write:src/secrets/**"], "allow": ["write:src/**"]}]}).to_dict()


def test_a_malformed_policy_names_its_key_path_and_line() -> None:
    with pytest.raises(hr.PolicyError) as info:
        Manifest.from_toml(POLICY.format(rule='alow = ["write:src/**"]'), source="handrail.toml")
    assert str(info.value) == ("handrail.toml:10: policy.layers[0].alow: unknown key 'alow' "
                               "(expected one of: name, deny, ask, allow, limits)")
    with pytest.raises(hr.PolicyError, match=r"^handrail.toml:12: policy.layers\[0\].ask\[1\]: "):
        Manifest.from_toml(POLICY.format(rule='ask = [\n  "call:a/b",\n  "bogus"]'),
                           source="handrail.toml")
    with pytest.raises(hr.PolicyError, match=r"^handrail.toml:5: policy.extends: "):
        Manifest.from_toml(POLICY.format(rule="").replace('"default"', '"strict"'),
                           source="handrail.toml")


def test_an_empty_policy_section_is_a_policy() -> None:
    assert Manifest.from_toml("[policy]\n").policy is not None
    assert Manifest.from_toml("[policy]\n") != Manifest.from_toml("")


# -- issue 9 §2: a BOM is accepted; nesting too deep is a clear error, not a RecursionError ----

def test_a_manifest_starting_with_a_bom_is_read_as_without(tmp_path: Path) -> None:
    path = tmp_path / "handrail.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_TOML.encode("utf-8"))
    assert Manifest.load(path) == Manifest.from_toml(GOOD_TOML)
    assert Manifest.from_toml("\ufeff" + GOOD_TOML).grants[0].line == 7  # lines unchanged


@pytest.mark.parametrize("text", [
    "x = " + "[" * 5000 + "]" * 5000,
    "x = " + "{a = " * 3000 + "1" + "}" * 3000,
    "[agent]\nname = \"a\"\n\ninstructions = " + "[" * 100 + "]" * 100,
])
def test_nesting_too_deep_is_a_manifest_error_naming_the_line(
    tmp_path: Path, text: str
) -> None:
    message = _error(text)
    assert "nest more than 64 levels" in message
    assert message.startswith("handrail.toml:")
    path = tmp_path / "handrail.toml"
    path.write_text(text)
    with pytest.raises(hr.ManifestError, match=r"handrail.toml:\d+: arrays or inline tables"):
        Manifest.load(path)


def test_brackets_inside_strings_and_comments_are_not_nesting() -> None:
    text = 'x = "' + "[" * 500 + '"\ny = \'\'\'' + "{" * 500 + "'''\n# " + "[" * 500 + "\n"
    assert "unknown key" in _error(text)
