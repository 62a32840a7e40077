"""The policy file format: strict loading with locations, and round trips that enforce alike."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.errors import PolicyError
from handrail.policy import Effect, Layer, Policy, Rule

EXAMPLE = """\
[policy]
extends = "default"

[policy.defaults]
net = "ask"

[[policy.layers]]
name = "app"
deny = ["write:src/secrets/**"]
ask = ["call:ledger/transfer/*"]
allow = ["write:src/**", "exec:git status", "net:api.example.com:443"]
"""


def test_example_loads_on_top_of_the_default(tmp_path: Path) -> None:
    policy = Policy.from_toml(EXAMPLE)
    assert [layer.name for layer in policy.layers] == ["secrets", "app"]
    assert policy.defaults["net"] is Effect.ASK and policy.defaults["write"] is Effect.ASK
    check = policy.check
    assert check(hr.Action(hr.Act.WRITE, "src/a.py"), workspace=tmp_path).effect is Effect.ALLOW
    assert check(hr.Action(hr.Act.READ, ".env"), workspace=tmp_path).effect is Effect.DENY


def test_top_level_keys_work_without_the_policy_table() -> None:
    text = '[defaults]\nread = "deny"\n[[layers]]\nname = "x"\nallow = ["read:a"]\n'
    policy = Policy.from_toml(text)
    assert policy.defaults["read"] is Effect.DENY
    assert policy.layers == (Layer("x", (Rule("read", "a", "allow"),)),)


def test_missing_defaults() -> None:
    assert Policy.from_dict({}).defaults == Policy.default().defaults
    only_call = Policy.from_dict({"defaults": {"call": "deny"}})
    assert only_call.defaults["call_read_only"] is Effect.DENY  # follows call


def test_save_and_load(tmp_path: Path) -> None:
    policy = Policy.default().layer("app").allow(hr.Act.WRITE, 'we"ird\\\x7f\n/**')
    path = tmp_path / "policy.toml"
    policy.save(path)
    assert Policy.load(path) == policy
    assert tomllib.loads(path.read_text())["policy"] == policy.to_dict()


def test_to_dict_is_canonical_json() -> None:
    a = Policy().layer("l").allow("read", "a").deny("read", "b")
    b = Policy().layer("l").deny("read", "b").allow("read", "a")
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    assert a == b and hash(a) == hash(b)
    assert list(a.to_dict()["layers"][0]) == ["name", "deny", "allow"]


@pytest.mark.parametrize(("text", "message"), [
    ('[policy]\nlayerz = []\n', r"<policy>:2: policy\.layerz: unknown key 'layerz'"),
    ('[policy.defaults]\nred = "allow"\n', r":2: policy\.defaults\.red: unknown key"),
    ('[policy.defaults]\nread = "permit"\n', r":2: policy\.defaults\.read: unknown effect"),
    ('[[policy.layers]]\nname = "a"\n\n[[policy.layers]]\nname = "b"\nalow = ["read:x"]\n',
     r":6: policy\.layers\[1\]\.alow: unknown key 'alow'"),
    ('[[policy.layers]]\nname = "a"\nallow = [\n  "read:x",\n  "wirte:y",\n]\n',
     r":5: policy\.layers\[0\]\.allow\[1\]: unknown act 'wirte'"),
    ('[[policy.layers]]\nname = "a"\ndeny = ["read:"]\n',
     r":3: policy\.layers\[0\]\.deny\[0\]: an empty pattern"),
    ('[[policy.layers]]\nname = "a"\ndeny = ["read:src/"]\n', r"deny\[0\].*segment 2 is empty"),
    ('[[policy.layers]]\ndeny = ["read:x"]\n', r"policy\.layers\[0\]\.name"),
    ('[policy]\nextends = "strict"\n', r":2: policy\.extends: unknown base"),
    ('[policy\n', r"invalid TOML"),
    ('[policy]\nlayers = {}\n', r"policy\.layers: expected an array"),
])
def test_bad_files_name_the_place(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy.from_toml(text)


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "handrail.toml"
    path.write_text('[policy]\nbogus = 1\n')
    with pytest.raises(PolicyError, match=rf"{path}:2: policy\.bogus"):
        Policy.load(path)
    with pytest.raises(PolicyError, match=r"handrail\.toml \[policy\]: policy\.bogus"):
        Policy.from_dict({"bogus": 1}, source="handrail.toml [policy]")


_PATTERNS = {
    hr.Act.READ: ["**", "*.py", ".env", "src/**", "src/*/x?.txt", "/top", "[!a]b", "**/c/*"],
    hr.Act.WRITE: ["src/**", "*.key", "a b/c", "d\"q", "\\*x"],
    hr.Act.EXEC: ["git", "git **", "rm -rf *", "/bin/sh"],
    hr.Act.NET: ["*.example.com", "example.com:443", "10.0.0.1"],
    hr.Act.CALL: ["ledger/*", "a/b", "**"],
}
_rules = st.sampled_from(list(_PATTERNS)).flatmap(
    lambda act: st.tuples(st.just(act), st.sampled_from(_PATTERNS[act]),
                          st.sampled_from(list(Effect)))
).map(lambda t: Rule(*t))
_policies = st.builds(
    lambda layers, defaults: Policy(tuple(Layer(f"l{i}", tuple(rs))
                                          for i, rs in enumerate(layers)), defaults),
    st.lists(st.lists(_rules, max_size=5), max_size=4),
    st.dictionaries(st.sampled_from(["read", "write", "exec", "net", "call", "call_read_only"]),
                    st.sampled_from(list(Effect))),
)
_actions = st.one_of(
    st.builds(hr.Action, st.sampled_from([hr.Act.READ, hr.Act.WRITE]),
              st.sampled_from(["a.py", "src/x.py", ".env", "top", "src/q/x1.txt", "c/d/c/e",
                               "cb", "ab", "*x", "a b/c", "SRC/A"])),
    st.builds(hr.Action, st.just(hr.Act.EXEC),
              st.sampled_from([("git",), ("git", "push"), ("rm", "-rf", "a"), ("/bin/sh",)])),
    st.builds(hr.Action, st.just(hr.Act.NET),
              st.sampled_from(["a.example.com", "example.com:443", "10.0.0.1:5"])),
    st.builds(hr.Action, st.just(hr.Act.CALL), st.sampled_from(["ledger/x", "a/b/c", "z/z"])),
)


@settings(max_examples=150, deadline=None)
@given(policy=_policies, actions=st.lists(_actions, min_size=1, max_size=8),
       mutates=st.booleans())
def test_round_trip_enforces_identically(
    policy: Policy, actions: list[hr.Action], mutates: bool
) -> None:
    loaded = Policy.from_toml(policy.to_toml())
    assert loaded == policy
    assert Policy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    for action in actions:
        assert loaded.check(action, mutates=mutates) == policy.check(action, mutates=mutates)


# -- issue 9 §2: a BOM is accepted; nesting too deep is a clear error, not a RecursionError ----

def test_a_policy_file_starting_with_a_bom_loads(tmp_path: Path) -> None:
    text = '[policy]\n[[policy.layers]]\nname = "app"\ndeny = ["read:*.pem"]\n'
    path = tmp_path / "policy.toml"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert Policy.load(path) == Policy.from_toml(text)
    assert Policy.from_toml("\ufeff" + text) == Policy.from_toml(text)


@pytest.mark.parametrize("text", [
    "[policy]\nlayers = " + "[" * 5000 + "]" * 5000,
    "[policy]\ndefaults = " + "{a = " * 3000 + "1" + "}" * 3000,
])
def test_nesting_too_deep_is_a_policy_error_naming_the_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=r"policy.toml:2: arrays or inline tables nest more "
                                          r"than 64 levels"):
        Policy.load(path)
