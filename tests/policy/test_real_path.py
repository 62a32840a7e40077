"""`real_path`, the kernel's resolution of a path, answers exactly what `os.path.realpath` does;
`kept_real_path`, the same kept between checks, still does after the tree changes.

READ/WRITE confinement rests on it (docs/policy.md, "Paths"): every answer here is compared to
`os.path.realpath` on a real tree of directories, files and symlinks (relative, absolute,
chained, dangling, looping, pointing outside), with `.`, `..` and missing components.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handrail.tools import _workspace
from handrail.tools._workspace import real_path

NAMES = ["a", "b", "f", "link", "up", "loop", "gone", "out", ".", "..", "new"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = Path(os.path.realpath(tmp_path_factory.mktemp("realpath")))
    root, outside = base / "ws", base / "outside"
    (root / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (root / "a" / "f").write_text("x")
    (outside / "f").write_text("x")
    (root / "link").symlink_to("a/b")  # relative
    (root / "a" / "up").symlink_to("..")  # back to the root
    (root / "a" / "b" / "link").symlink_to(root / "a")  # absolute
    (root / "loop").symlink_to("loop")
    (root / "gone").symlink_to("nothing-here")  # dangling
    (root / "out").symlink_to(outside)
    (root / "a" / "b" / "out").symlink_to("../../out/f")  # chained, to a file outside
    return root


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(st.sampled_from(NAMES), min_size=1, max_size=6), trailing=st.booleans())
def test_the_kernels_answer_is_realpaths(tree: Path, parts: list[str], trailing: bool) -> None:
    path = str(tree) + "/" + "/".join(parts) + ("/" if trailing else "")
    assert real_path(path) == os.path.realpath(path), path


@pytest.mark.parametrize(
    "relative",
    [
        "a/b",
        "link",
        "a/up/a/f",
        "a/b/link/f",
        "out/f",
        "a/b/out",
        "link/../f",
        "a/new",
        "link/new",
        "out/new",
        "gone",
        "loop",
        "a/missing/../f",
        "a/f/",
        "a/f/x",
    ],
)
def test_each_kind_of_path_without_the_kernel_too(
    tree: Path, relative: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = f"{tree}/{relative}"
    expected = os.path.realpath(path)
    assert real_path(path) == expected
    monkeypatch.setattr(_workspace, "_by_kernel", False)  # no /proc: realpath itself
    assert real_path(path) == expected


def test_a_file_removed_while_open_is_resolved_by_realpath(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel names an open file that was unlinked `... (deleted)`: never an answer.
    monkeypatch.setattr(os, "readlink", lambda _path: f"{tree}/a/f (deleted)")
    assert real_path(f"{tree}/a/f") == f"{tree}/a/f"


CHANGES = [
    ("retarget", "link", "a"),  # link -> a (was a/b)
    ("retarget", "a/up", "b"),  # a/up -> a/b (was ..)
    ("retarget", "out", "a"),  # no longer outside
    ("retarget", "gone", "a/f"),  # the dangling link now leads somewhere
    ("remove", "a/b/link", ""),
    ("file", "new", ""),  # a missing name now exists
    ("dir", "a/missing", ""),
    ("rename", "a/b", "a/c"),
    ("rename", "a", "z"),
    ("retarget", "loop", "a/b"),
]


@pytest.mark.parametrize("change", CHANGES, ids=[f"{c[0]}-{c[1]}" for c in CHANGES])
def test_a_kept_resolution_is_realpaths_after_a_change(
    tmp_path: Path, change: tuple[str, str, str]
) -> None:
    # The policy resolves through `kept_real_path`: between two checks the tree changes, and
    # the second answer must still be realpath's.
    root = Path(os.path.realpath(tmp_path)) / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "a" / "f").write_text("x")
    (root / "link").symlink_to("a/b")
    (root / "a" / "up").symlink_to("..")
    (root / "a" / "b" / "link").symlink_to(root / "a")
    (root / "loop").symlink_to("loop")
    (root / "gone").symlink_to("nothing-here")
    (root / "out").symlink_to(tmp_path / "outside")
    paths = [
        f"{root}/{'/'.join(parts)}"
        for parts in (
            ["link", "f"],
            ["link", "..", "f"],
            ["a", "up", "a", "f"],
            ["a", "b", "link", "f"],
            ["out", "f"],
            ["gone"],
            ["new"],
            ["new", "x"],
            ["a", "missing", "..", "f"],
            ["a", "b"],
            ["a", "b", "x"],
            ["a", "f"],
            ["loop"],
            ["loop", "x"],
        )
    ]
    for path in paths:
        assert _workspace.kept_real_path(path) == os.path.realpath(path), path
    kind, name, target = change
    where = root / name
    if kind == "retarget":
        where.unlink()
        where.symlink_to(target)
    elif kind == "remove":
        where.unlink()
    elif kind == "file":
        where.write_text("x")
    elif kind == "dir":
        where.mkdir()
    else:
        where.rename(root / target)
    for path in paths:
        assert _workspace.kept_real_path(path) == os.path.realpath(path), (change, path)
