"""The line finder behind every manifest message: each TOML spelling, each string flavour."""

from __future__ import annotations

import tomllib

from handrail.manifest._locate import key_lines, line_of

TRICKY = '''# a comment with [[tools]] in it
top = 1
agent.name = "x"  # trailing comment
[budgets]
max_steps = 3
[[tools]]
ref = "a/b"
description = """
multi \\""" line
[[fake]]
not = "a key"
"""
[tools.arguments]
type = "object"
properties = { x = { type = "string" }, "y z" = {} }
[[tools]]
ref = 'c/d'
arr = [
  1, # c
  { k = 1 },
]
"k\\u0041" = 2
'lit' = 1
ml = \'\'\'
'' still inside \'\'\'
dt = 1979-05-27 07:32:00Z
after = "a\\"b"
'''


def test_every_key_is_found_on_its_line() -> None:
    tomllib.loads(TRICKY)  # the scanner's premise: valid TOML
    lines = key_lines(TRICKY)
    assert lines == {
        ("top",): 2,
        ("agent",): 3,
        ("agent", "name"): 3,
        ("budgets",): 4,
        ("budgets", "max_steps"): 5,
        ("tools",): 6,
        ("tools", 0): 6,
        ("tools", 0, "ref"): 7,
        ("tools", 0, "description"): 8,
        ("tools", 0, "arguments"): 13,
        ("tools", 0, "arguments", "type"): 14,
        ("tools", 0, "arguments", "properties"): 15,
        ("tools", 0, "arguments", "properties", "x"): 15,
        ("tools", 0, "arguments", "properties", "x", "type"): 15,
        ("tools", 0, "arguments", "properties", "y z"): 15,
        ("tools", 1): 16,
        ("tools", 1, "ref"): 17,
        ("tools", 1, "arr"): 18,
        ("tools", 1, "arr", 0): 19,
        ("tools", 1, "arr", 1): 20,
        ("tools", 1, "arr", 1, "k"): 20,
        ("tools", 1, "kA"): 22,
        ("tools", 1, "lit"): 23,
        ("tools", 1, "ml"): 24,
        ("tools", 1, "dt"): 26,
        ("tools", 1, "after"): 27,
    }


def test_line_of_falls_back_to_the_nearest_ancestor() -> None:
    lines = key_lines('[agent]\nname = "x"\n')
    assert line_of(lines, ("agent", "name", "deeper", 3)) == 2
    assert line_of(lines, ("budgets",)) is None


def test_the_paths_are_tomllibs_paths() -> None:
    data = tomllib.loads(TRICKY)
    for path in key_lines(TRICKY):
        node = data
        for part in path:
            node = node[part]  # every recorded path exists in the parsed document
