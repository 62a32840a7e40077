"""`[[servers]]` in handrail.toml: strict parsing, the digest, the round trip."""

from __future__ import annotations

import pytest

import handrail as hr
from handrail.mcp import ArgumentAction

BASE = """
[[tools]]
ref = "fs/write_file"
description = "Write."

[[servers]]
name = "fs"
command = "mcp-server-filesystem"
args = ["/srv"]
headers = {}
timeout = 30

[servers.actions]
write_file = [{ act = "write", argument = "path", content = "content" }]
"""


def test_servers_parse_into_declarations() -> None:
    [decl] = hr.Manifest.from_toml(BASE).servers
    assert decl.name == "fs" and decl.command == "mcp-server-filesystem"
    assert decl.args == ("/srv",) and decl.timeout == 30.0
    assert decl.actions == {"write_file": (ArgumentAction(act=hr.Act.WRITE, argument="path",
                                                          content="content"),)}


def test_round_trip_and_digest() -> None:
    manifest = hr.Manifest.from_toml(BASE)
    assert hr.Manifest.from_toml(manifest.to_toml()) == manifest
    without = hr.Manifest.from_toml(BASE.split("[[servers]]")[0])
    assert "servers" not in without.canonical()  # no earlier digest changes
    remapped = hr.Manifest.from_toml(BASE.replace('act = "write"', 'act = "read"')
                                     .replace(', content = "content"', ""))
    assert remapped.digest != manifest.digest  # what arguments touch is reviewed
    # Headers carry credentials: they are not hashed (and so not pinned).
    token = hr.Manifest.from_toml(BASE.replace("headers = {}",
                                               'headers = { Authorization = "Bearer x" }'))
    assert token.digest == manifest.digest


@pytest.mark.parametrize(("text", "expected"), [
    ('[[servers]]\nname = "a"\n', "needs exactly one of command"),
    ('[[servers]]\nname = "a"\ncommand = "x"\nurl = "http://h/"\n', "exactly one of"),
    ('[[servers]]\nname = "a b"\ncommand = "x"\n', "invalid tool name"),
    ('[[servers]]\nname = "a"\ncommand = "x"\nargs = "y"\n', "args in [[servers]] #1 must be"),
    ('[[servers]]\nname = "a"\ncommand = "x"\ntimeout = -1\n', "positive number"),
    ('[[servers]]\nname = "a"\ncommand = "x"\n[servers.actions]\nt = [{ act = "read" }]\n',
     "must name an argument"),
    ('[[servers]]\nname = "a"\ncommand = "x"\n[servers.actions]\n'
     't = [{ act = "read", argument = "p", content = "c" }]\n', "only a write has one"),
    ('[[servers]]\nname = "a"\ncommand = "x"\n[servers.actions]\n'
     't = [{ act = "read", argument = "p", path = "c" }]\n', "unknown key(s) ['path']"),
    ('[[servers]]\nname = "a"\ncommand = "x"\n\n[[servers]]\nname = "a"\ncommand = "y"\n',
     "repeats 'a'"),
])
def test_a_malformed_server_is_refused_with_its_line(text: str, expected: str) -> None:
    with pytest.raises(hr.ManifestError) as info:
        hr.Manifest.from_toml(text, source="handrail.toml")
    assert expected in str(info.value)
    assert "handrail.toml:" in str(info.value)
