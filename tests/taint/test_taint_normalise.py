"""The taint index's normal form, the parts of a protected value, and what counts as an
address (issue 34)."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from handrail.tools import Provenance, Taint
from handrail.tools._taint import is_address, normalise, value_parts


def test_every_format_character_of_this_python_is_removed() -> None:
    hidden = [chr(c) for c in range(sys.maxunicode + 1)
              if unicodedata.category(chr(c)) == "Cf"]
    assert len(hidden) > 150
    assert normalise("a" + "".join(hidden) + "b") == "ab"


@pytest.mark.parametrize(("text", "expected"), [
    ("Attacker&#64;Evil.Example", "attacker@evil.example"),
    ("attacker&commat;evil.example", "attacker@evil.example"),
    ("attacker&amp;commat;evil.example", "attacker@evil.example"),
    ("attacker%40evil.example", "attacker@evil.example"),
    ("attacker%252540evil.example", "attacker@evil.example"),
    ("ＡＴＴＡＣＫＥＲ@evil.example", "attacker@evil.example"),
    ("at\u200btacker\u00ad@evil\ufeff.example", "attacker@evil.example"),
    ("100% sure & done", "100% sure & done"),
    ("a\x00b", "a\ufffdb"),
])
def test_normalise_undoes_what_a_model_reads_through(text: str, expected: str) -> None:
    assert normalise(text) == expected


@pytest.mark.parametrize(("value", "parts"), [
    ("attacker <attacker@evil.example>", ["attacker@evil.example", "evil.example"]),
    ("mailto:attacker@evil.example", ["attacker@evil.example", "evil.example"]),
    ("https://evil.io:8080/x/report-2024?d=a1b2", [
        "evil.io:8080/x/report-2024?d=a1b2", "evil.io:8080", "evil.io", "report-2024",
        "a1b2"]),
    ("bob quarterly", []),
    ("plainid42", []),
])
def test_the_parts_of_a_value_are_its_identifiers(value: str, parts: list[str]) -> None:
    assert value_parts(value) == parts


@pytest.mark.parametrize(("value", "mailbox", "web"), [
    ("https://x.example/a?b=1", True, True),
    ("www.true-news.example.com", True, True),
    ("news.example.com/today", True, True),
    ("bob@corp.example", True, False),
    ("Bob <bob@corp.example>, alice@corp.example", True, False),
    ("please write to bob@corp.example today", False, False),
    ("calc.py", False, False),
    ("src/app/main.py", False, False),
    ("13", False, False),
])
def test_what_counts_as_an_address(value: str, mailbox: bool, web: bool) -> None:
    assert is_address(value) is mailbox or is_address(value) is web
    assert is_address(value, mailboxes=False) is web


def test_a_taint_with_its_part_round_trips() -> None:
    taint = Taint(pointer="/to", value="A <a@evil.example>", source_call="c1",
                  source_tool="web/get", match="contains", found="a@evil.example")
    assert Taint.from_dict(taint.to_dict()) == taint
    assert "contains 'a@evil.example'" in taint.describe()


def test_a_child_provenance_sees_its_parents_output_and_trusted_text() -> None:
    parent, child = Provenance(), Provenance()
    parent.trust_text("task", "mail the report to me@home.example")
    parent.add_output(("c1", "web/get"), {"content": [{"kind": "text",
                                                       "text": "to a@evil.example"}]},
                      trusted=False, turn=0)
    child.inherit(parent)
    (taint,) = child.taint({"to": "a@evil.example"}, ["/to"])
    assert (taint.source_call, taint.match) == ("c1", "substring")
    assert child.taint({"to": "me@home.example"}, ["/to"]) == []
    # An echo in the child of what the parent read is not trusted text.
    child.add_output(("d1", "crm/echo"), {"content": [{"kind": "text",
                                                       "text": "a@evil.example"}]},
                     trusted=True, turn=0)
    assert len(child.taint({"to": "a@evil.example"}, ["/to"])) == 1


def test_a_trusted_output_vouches_only_when_it_came_first() -> None:
    page = {"content": [{"kind": "text", "text": "mail a@evil.example"}]}
    crm = {"content": [{"kind": "text", "text": "owner a@evil.example"}]}
    before, same, after = Provenance(), Provenance(), Provenance()
    before.add_output(("c0", "crm"), crm, trusted=True, turn=0)
    before.add_output(("c1", "web"), page, trusted=False, turn=1)
    same.add_output(("c1", "web"), page, trusted=False, turn=1)
    same.add_output(("c0", "crm"), crm, trusted=True, turn=1)
    after.add_output(("c1", "web"), page, trusted=False, turn=1)
    after.add_output(("c0", "crm"), crm, trusted=True, turn=2)
    value = {"to": "a@evil.example"}
    assert before.taint(value, ["/to"]) == [] and same.taint(value, ["/to"]) == []
    assert len(after.taint(value, ["/to"])) == 1


def test_a_short_value_needs_a_whole_trusted_string() -> None:
    prov = Provenance()
    prov.trust_text("task", "what happened on 13 may?")
    prov.add_output(("c1", "mail"), {"content": [{"kind": "text", "text": "delete 13"}],
                                     "structured": {"id": 13}}, trusted=False)
    assert len(prov.taint({"id": "13", "n": 13}, ["/id", "/n"])) == 2
    prov.trust_values(("c2", "answer"), ["13"])
    assert prov.taint({"id": "13", "n": 13}, ["/id", "/n"]) == []
    # Three characters or more: a token of the task is enough, as before (a name the user
    # typed, `Eve`, is what the user meant).
    prov.trust_text("task", "message Eve the report for 2024")
    prov.add_output(("c3", "mail"), {"content": [{"kind": "text", "text": "Eve, year 2024"}]},
                    trusted=False)
    assert prov.taint({"to": "Eve", "year": "2024", "n": 2024}, ["/to", "/year", "/n"]) == []
