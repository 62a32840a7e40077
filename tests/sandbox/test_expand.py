"""The sandbox's expansion of the policy over the workspace decides as `Policy.check` does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import handrail as hr

PATHS = [".env", "a/b/.env.local", "x.pem", "Foo.PEM", "private", "private/k", "src/a.py",
         "src/b.txt", ".git/config", "sub/.git/config", "ok.txt", "a/.aws/credentials",
         "deep/er/id_ed25519", "ÉTÉ/.env", "src"]


@pytest.mark.parametrize("act", [hr.Act.READ, hr.Act.WRITE])
def test_check_canonical_path_agrees_with_check(tmp_path: Path, act: hr.Act) -> None:
    policy = (hr.Policy.default().layer("x").deny(hr.Act.READ, "private/**")
              .deny(hr.Act.WRITE, "src/*.py").allow(hr.Act.WRITE, "src/**")
              .ask(hr.Act.READ, "ok.txt"))
    root = tmp_path.resolve()
    for rel in PATHS:
        expected = policy.check(hr.Action(act, rel), workspace=root)
        got = policy.check_canonical_path(act, rel)
        assert (got.effect, got.rule, got.layer) == (expected.effect, expected.rule,
                                                     expected.layer), rel


def test_check_canonical_path_takes_paths_only() -> None:
    with pytest.raises(hr.UserError, match="READ and WRITE only"):
        hr.Policy.default().check_canonical_path(hr.Act.NET, "example.org")


def test_a_walk_is_reused_only_while_the_folder_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from handrail.sandbox import _sandbox

    ws = (tmp_path / "ws").resolve()
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "a.txt").write_text("a")
    policy = hr.Policy.default()

    def cached() -> set[str]:  # this workspace's folders in the policy's cache
        return {k.partition("\0")[2] for k in _sandbox._walks.get(policy, {})
                if k.partition("\0")[0] == str(ws)}

    # A fresh folder is "racy": not cached, since a change in the same clock tick would not
    # move its timestamp.
    _sandbox._expand(policy, str(ws))
    assert cached() == set()
    monkeypatch.setattr(_sandbox, "_RACY_NS", -10**18)
    hidden, _ = _sandbox._expand(policy, str(ws))
    assert hidden == [] and cached() == {"", "sub"}
    # An equal policy built anew (a run's effective policy) is answered from the same walk; an
    # unequal one never is.
    assert _sandbox._walks[hr.Policy.default()] is _sandbox._walks[policy]
    stricter = hr.Policy.default().layer("t").deny(hr.Act.READ, "sub/a.txt")
    assert _sandbox._expand(stricter, str(ws))[0] == [("sub/a.txt", False)]
    assert _sandbox._expand(policy, str(ws))[0] == []
    (ws / "sub" / ".env").write_text("SECRET")
    st = (ws / "sub").stat()
    os.utime(ws / "sub", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later tick
    hidden, _ = _sandbox._expand(policy, str(ws))
    assert hidden == [("sub/.env", False)]


@pytest.mark.parametrize(("policy", "network"), [
    (hr.Policy.default(), "none"),
    (hr.Policy.default().with_defaults(net="ask"), "none"),
    (hr.Policy.default().layer("x").ask(hr.Act.NET, "example.org"), "none"),
    (hr.Policy.default().layer("x").deny(hr.Act.NET, "**"), "none"),
    (hr.Policy.default().layer("x").allow(hr.Act.NET, "example.org"), "host"),
    (hr.Policy.default().with_defaults(net="allow"), "host"),
])
def test_only_an_outright_net_allow_gives_a_program_the_network(policy: hr.Policy,
                                                                 network: str) -> None:
    from handrail.sandbox import _sandbox

    # A program cannot ask a person: an ask (default or rule) is no network.
    assert _sandbox._network(policy) == network


def test_a_read_denied_file_inside_a_write_denied_folder_is_hidden(tmp_path: Path) -> None:
    from handrail.sandbox import _sandbox

    ws = (tmp_path / "ws").resolve()
    (ws / "locked" / "deeper").mkdir(parents=True)
    for name in ("locked/plain.txt", "locked/secret.txt", "locked/deeper/key.pem", "open.txt"):
        (ws / name).write_text("x")
    policy = (hr.Policy.default().layer("x").deny(hr.Act.WRITE, "locked/**")
              .deny(hr.Act.WRITE, "locked").deny(hr.Act.READ, "locked/secret.txt"))
    hidden, read_only = _sandbox._expand(policy, str(ws))
    assert sorted(hidden) == [("locked/deeper/key.pem", False), ("locked/secret.txt", False)]
    assert ("locked", True) in read_only
    assert ("open.txt", False) not in read_only and ("open.txt", False) not in hidden


def test_the_walk_cache_keeps_a_few_policies_at_most(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from handrail.sandbox import _sandbox

    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    monkeypatch.setattr(_sandbox, "_RACY_NS", -10**18)
    policies = [hr.Policy.default().layer("x").deny(hr.Act.READ, f"f{i}.txt")
                for i in range(3 * _sandbox._WALKS_KEPT)]
    for policy in policies:
        _sandbox._expand(policy, str(ws))
        assert policy in _sandbox._walks and len(_sandbox._walks) <= _sandbox._WALKS_KEPT
