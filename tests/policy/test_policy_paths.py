"""Path confinement: canonical spellings, symlinks in and out, and hypothesis over spellings.

The oracle for the property tests is the kernel itself: a spelling that opens (O_PATH) is
resolved by Linux, and /proc/self/fd tells where it landed, independently of our code.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.policy import (
    CONFINEMENT,
    Effect,
    OutsideWorkspace,
    Policy,
    UncanonicalPath,
    canonicalize,
    resolve_in_workspace,
)

# The workspace fixture is read-only for the examples: sharing it across them is safe.
_FIXTURE = [HealthCheck.function_scoped_fixture]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc oracle")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A workspace with secrets, code, and symlinks pointing in, out and at itself."""
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "config").mkdir()
    outside.mkdir()
    (outside / "stolen.txt").write_text("x")
    (root / ".env").write_text("SECRET=1")
    (root / "config" / "server.pem").write_text("pem")
    (root / "src" / "app.py").write_text("print()")
    (root / "src" / "pkg" / "mod.py").write_text("")
    (root / "café.txt").write_text("")
    os.symlink("src", root / "code")  # in
    os.symlink(".env", root / "innocent.txt")  # a harmless name for a secret
    os.symlink(str(outside), root / "out")  # out
    os.symlink(".", root / "self")  # the root itself
    os.symlink("../../outside/stolen.txt", root / "src" / "up")  # out, relatively
    os.symlink(str(root / "config"), outside / "back")  # from outside, back in
    return root


def test_canonical_spellings_collapse(tree: Path) -> None:
    assert canonicalize("src/app.py", tree) == "src/app.py"
    assert canonicalize("./src//pkg/../app.py", tree) == "src/app.py"
    assert canonicalize("src/app.py/", tree) == "src/app.py"
    assert canonicalize(str(tree / "src" / "app.py"), tree) == "src/app.py"
    assert canonicalize(".", tree) == "."
    assert canonicalize("src/..", tree) == "."
    assert canonicalize("new/file.txt", tree) == "new/file.txt"  # need not exist


def test_symlinks_are_resolved(tree: Path) -> None:
    assert canonicalize("code/app.py", tree) == "src/app.py"
    assert canonicalize("innocent.txt", tree) == ".env"
    assert canonicalize("self/self/src/app.py", tree) == "src/app.py"
    # `link/..` is the link target's parent, as the kernel sees it.
    assert canonicalize("code/pkg/..", tree) == "src"
    # An absolute path elsewhere that resolves inside is judged by where it lands.
    assert canonicalize(str(tree.parent / "outside" / "back" / "server.pem"), tree) == (
        "config/server.pem"
    )


@pytest.mark.parametrize("target", [
    "..", "../outside/stolen.txt", "src/../../outside", "/etc/passwd", "out/stolen.txt",
    "src/up", "code/../../outside", "/", "self/..",
])
def test_outside_is_refused(tree: Path, target: str) -> None:
    with pytest.raises(OutsideWorkspace):
        canonicalize(target, tree)


@pytest.mark.parametrize("target", ["", "a\x00b", "bad\udc80name", "\udfff"])
def test_uncanonical_is_refused(tree: Path, target: str) -> None:
    with pytest.raises(UncanonicalPath):
        canonicalize(target, tree)


def test_non_string_target_is_refused(tree: Path) -> None:
    with pytest.raises(UncanonicalPath):
        canonicalize(b"src/app.py", tree)  # type: ignore[arg-type]


def test_a_sibling_with_the_root_as_prefix_is_outside(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws2").mkdir()
    with pytest.raises(OutsideWorkspace):
        canonicalize(str(tmp_path / "ws2" / "x"), tmp_path / "ws")


def test_a_symlinked_workspace_root(tree: Path) -> None:
    alias = tree.parent / "alias"
    os.symlink(tree, alias)
    assert canonicalize("src/app.py", alias) == "src/app.py"
    assert canonicalize(str(alias / ".env"), tree) == ".env"
    assert resolve_in_workspace("code", alias) == tree.resolve() / "src"


def test_policy_denies_confinement_failures_whatever_the_rules(tree: Path) -> None:
    policy = Policy.permissive()
    for target in ("../outside/stolen.txt", "out/stolen.txt", "a\x00b", "x\udc80"):
        for act in (hr.Act.READ, hr.Act.WRITE):
            verdict = policy.check(hr.Action(act, target), workspace=tree)
            assert verdict.effect is Effect.DENY, target
            assert verdict.layer == CONFINEMENT and verdict.rule is None
    verdict = policy.check(hr.Action(hr.Act.READ, "out/stolen.txt"), workspace=tree)
    assert verdict.reason == "path resolves outside the workspace"
    bad = policy.check(hr.Action(hr.Act.READ, "x\udc80"), workspace=tree)
    bad.target.encode("utf-8")  # shown safely: no lone surrogate leaks into records
    assert "lone surrogate" in bad.reason


def test_workspace_none_is_the_current_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree)
    policy = Policy.default()
    assert policy.check(hr.Action(hr.Act.READ, "innocent.txt")).target == ".env"
    assert policy.check(hr.Action(hr.Act.READ, "../x")).effect is Effect.DENY


# -- property tests over spellings ------------------------------------------------------

_SECRETS = (".env", "config/server.pem")
_ALIASES = {"src": ("src", "code", "self/src", "self/code")}


def _spell(draw: st.DrawFn, root: Path, canonical: str) -> str:
    """A random spelling of `canonical` that the kernel resolves to the same file."""
    parts = canonical.split("/")
    out: list[str] = []
    for part in parts:
        for _ in range(draw(st.integers(0, 2))):
            out.append(draw(st.sampled_from([".", "src/..", "self", "code/..", "nope/.."])))
        choices = _ALIASES.get(part, (part,)) if not out or out == ["."] else (part,)
        out.append(draw(st.sampled_from(choices)))
    sep = draw(st.sampled_from(["/", "//", "/./"]))
    text = sep.join(out)
    if draw(st.booleans()):
        text = "./" + text
    if draw(st.booleans()):
        text += "/"
    if draw(st.booleans()):
        base = draw(st.sampled_from([str(root), str(root.parent / "outside" / ".." / "ws")]))
        text = base + "/" + text
    return text


@linux_only
@settings(max_examples=300, deadline=None, suppress_health_check=_FIXTURE)
@given(data=st.data())
def test_no_spelling_of_a_denied_path_escapes_deny(tree: Path, data: st.DataObject) -> None:
    policy = Policy.default().layer("open").allow(hr.Act.READ, "**").allow(hr.Act.WRITE, "**")
    canonical = data.draw(st.sampled_from(_SECRETS))
    spelling = _spell(data.draw, tree, canonical)
    if data.draw(st.booleans()):
        # Case and normalisation variants name the same file on macOS and Windows.
        spelling = spelling[:-len(canonical)] + canonical.upper() if spelling.endswith(
            canonical) else spelling
    act = data.draw(st.sampled_from([hr.Act.READ, hr.Act.WRITE]))
    verdict = policy.check(hr.Action(act, spelling), workspace=tree)
    assert verdict.effect is Effect.DENY, (spelling, verdict)


def _kernel_path(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_PATH)
    except OSError:
        return None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


_WORDS = ["..", ".", "", "src", "code", "out", "self", "up", "pkg", "app.py", ".env",
          "innocent.txt", "config", "server.pem", "stolen.txt", "outside", "ws", "café.txt",
          unicodedata.normalize("NFD", "café.txt"), "x y", "ünï"]


@linux_only
@settings(max_examples=500, deadline=None, suppress_health_check=_FIXTURE)
@given(words=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=7),
       absolute=st.sampled_from(["", "root", "slash"]), trailing=st.booleans())
def test_nothing_outside_is_ever_allowed(
    tree: Path, words: list[str], absolute: str, trailing: bool
) -> None:
    spelling = "/".join(words) + ("/" if trailing else "")
    if absolute == "root":
        spelling = f"{tree}/{spelling}"
    elif absolute == "slash":
        spelling = "/" + spelling
    policy = Policy.permissive()
    verdict = policy.check(hr.Action(hr.Act.READ, spelling), workspace=tree)
    full = spelling if spelling.startswith("/") else f"{tree}/{spelling}"
    landed = _kernel_path(full)
    root = str(tree.resolve())
    if not spelling:
        assert verdict.effect is Effect.DENY  # empty: cannot be canonicalised
    elif landed is not None:
        inside = landed == root or landed.startswith(root + "/")
        if inside:
            rel = "." if landed == root else landed[len(root) + 1:]
            assert verdict.effect is Effect.ALLOW and verdict.target == rel, (spelling, verdict)
        else:
            assert verdict.effect is Effect.DENY, (spelling, landed, verdict)
    if verdict.effect is Effect.ALLOW:
        # Whatever the kernel says, an allowed target is a plain relative path inside.
        assert not verdict.target.startswith("/") and ".." not in verdict.target.split("/")
        assert os.path.realpath(tree / verdict.target).startswith(root)


@linux_only
@settings(max_examples=200, deadline=None, suppress_health_check=_FIXTURE)
@given(name=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"),
                    min_size=1, max_size=12))
def test_unicode_names_canonicalise_to_themselves(tree: Path, name: str) -> None:
    if name in (".", "..") or os.path.lexists(tree / name):
        # A name the tree already holds is what it is: `code` is a link to `src` (a draw of
        # "code" once failed here, correctly canonicalised to "src").
        return
    assert canonicalize(name, tree) == name
    assert canonicalize(f"src/../{name}", tree) == name
