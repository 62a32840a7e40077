"""`WatchedAnswers` keeps an answer read from disk only while what it read is unchanged.

The property: on a real tree of directories, files and symlinks (relative, absolute,
chained, dangling, pointing outside), after any sequence of changes (files and directories
created, removed and renamed, links made and retargeted, modes changed), every kept answer
equals the answer computed afresh. The answers are what the policy keeps: `os.path.realpath`
of a path (a READ check), and with attributes watched whether the resolved path is an
executable regular file (an EXEC lookup).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handrail.tools import WatchedAnswers

pytestmark = pytest.mark.skipif(
    not WatchedAnswers(attributes=False).keeps(),
    reason="no inotify: nothing is kept, nothing can go stale",
)

SPOTS = ["a", "b", "a/x", "a/y", "b/x", "l", "a/l", "a/b", "a/b/x"]
TARGETS = ["a", "b", "x", "..", "a/x", "../b", "nothing", "l", "OUT", "OUT/x", "a/b"]
QUERY_PARTS = ["a", "b", "x", "y", "l", "..", "."]


def fresh(path: str) -> tuple[str, bool, bool]:
    real = os.path.realpath(path)
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = False
    return real, os.access(path, os.X_OK), regular


def change(root: Path, outside: Path, op: tuple[str, str, str]) -> None:
    kind, spot, target = op
    path = root / spot
    try:
        if kind == "file":
            path.write_text("x")
        elif kind == "dir":
            path.mkdir()
        elif kind == "remove":
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        elif kind == "link":
            text = target.replace("OUT", str(outside))
            tmp = path.with_name(path.name + ".new")
            tmp.symlink_to(text)
            os.replace(tmp, path)  # `ln -sf`: the link retargeted in one step
        elif kind == "rename":
            os.replace(path, root / target.replace("OUT", "b"))
        elif kind == "chmod":
            path.chmod(0o755 if target in ("a", "x") else 0o644)
    except OSError:
        pass  # a change the tree does not allow now (no parent, not empty, ...)


def make_tree(base: Path) -> tuple[Path, Path]:
    root, outside = base / "ws", base / "outside"
    for folder in (root / "a" / "b", root / "b", outside):
        folder.mkdir(parents=True, exist_ok=True)
    (root / "a" / "x").write_text("x")
    (root / "a" / "x").chmod(0o755)
    (outside / "x").write_text("x")
    (root / "l").symlink_to("a")
    (root / "a" / "l").symlink_to(outside / "x")
    return root, outside


OPS = st.tuples(
    st.sampled_from(["file", "dir", "remove", "link", "rename", "chmod"]),
    st.sampled_from(SPOTS),
    st.sampled_from(TARGETS),
)
QUERIES = st.lists(
    st.lists(st.sampled_from(QUERY_PARTS), min_size=1, max_size=4), min_size=1, max_size=8
)


def check_all(
    memo: WatchedAnswers[str, object],
    queries: list[str],
    compute: Callable[[str], object],
    resolutions: WatchedAnswers[str, object] | None = None,
) -> None:
    for query in queries:
        kept = memo.answer(query, lambda q=query: compute(q), lambda q=query: (q,))  # type: ignore[misc]
        assert kept == compute(query), query
        if resolutions is not None:
            # `real_path`: resolved by the walk itself, names in known directories by one lstat.
            assert resolutions.real_path(query, _unkept) == os.path.realpath(query), query


def _unkept(path: str) -> str:
    return os.path.realpath(path)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(OPS, max_size=8), parts=QUERIES, attributes=st.booleans())
def test_a_kept_answer_is_the_fresh_one_after_any_change(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, str, str]],
    parts: list[list[str]],
    attributes: bool,
) -> None:
    base = Path(os.path.realpath(tmp_path_factory.mktemp("watched")))
    root, outside = make_tree(base)
    queries = [str(root) + "/" + "/".join(p) for p in parts]
    memo: WatchedAnswers[str, object] = WatchedAnswers(attributes=attributes)
    resolutions: WatchedAnswers[str, object] = WatchedAnswers(attributes=attributes)
    compute: Callable[[str], object] = fresh if attributes else os.path.realpath
    try:
        check_all(memo, queries, compute, resolutions)
        for op in ops:
            change(root, outside, op)
            check_all(memo, queries, compute, resolutions)
    finally:
        memo.clear()
        resolutions.clear()


def test_an_answer_is_kept_while_nothing_changes(tmp_path: Path) -> None:
    root, _ = make_tree(tmp_path)
    memo: WatchedAnswers[str, str] = WatchedAnswers(attributes=False)
    computed: list[str] = []

    def compute() -> str:
        computed.append("x")
        return os.path.realpath(root / "l" / "x")

    path = str(root / "l" / "x")
    for _ in range(3):
        assert memo.answer("k", compute, lambda: (path,)) == str(root / "a" / "x")
    assert len(computed) == 1
    (root / "b" / "other").write_text("y")  # not a name the answer read
    (root / "a" / "x").write_text("new content")  # content is not resolution
    assert memo.answer("k", compute, lambda: (path,)) == str(root / "a" / "x")
    assert len(computed) == 1
    (root / "l").unlink()
    (root / "l").symlink_to("b")  # retargeted: the answer is read again
    assert memo.answer("k", compute, lambda: (path,)) == str(root / "b" / "x")
    assert len(computed) == 2
    memo.clear()


def test_a_forked_child_does_not_take_its_parents_events(tmp_path: Path) -> None:
    root, _ = make_tree(tmp_path)
    memo: WatchedAnswers[str, str] = WatchedAnswers(attributes=False)
    path = str(root / "l" / "x")

    def ask() -> str:
        return memo.answer("k", lambda: os.path.realpath(path), lambda: (path,))

    assert ask() == str(root / "a" / "x")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: retarget, then ask (it must not read the parent's queue)
        try:
            (root / "l").unlink()
            (root / "l").symlink_to("b")
            os.write(write, ask().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        assert pipe.read() == str(root / "b" / "x")
    os.waitpid(pid, 0)
    assert ask() == str(root / "b" / "x")  # the parent saw the event itself
    memo.clear()


FIXED_QUERIES = [
    "l/x",
    "a/l",
    "a/l/..",
    "a/b/../x",
    "y/../a/x",
    "a/y/../x",
    "l/../b/x",
    "b/x",
    "a/b/x",
    "l/b/x",
    "a/y/z/../../x",
]
# (None goes below a file: a watched file replaced would start the memo again, hiding a bug.)
EVERY_OP = [
    (kind, spot, target)
    for kind in ("file", "dir", "remove", "link", "rename", "chmod")
    for spot in SPOTS
    for target in (TARGETS if kind in ("link", "rename") else ["a", "b"])
]


@pytest.mark.parametrize("attributes", [False, True])
def test_every_single_change_is_seen(tmp_path: Path, attributes: bool) -> None:
    # The property test's changes, each one alone on a fresh tree, checked everywhere.
    compute: Callable[[str], object] = fresh if attributes else os.path.realpath
    for n, op in enumerate(EVERY_OP):
        root, outside = make_tree(tmp_path / str(n))
        queries = [f"{root}/{q}" for q in FIXED_QUERIES]
        memo: WatchedAnswers[str, object] = WatchedAnswers(attributes=attributes)
        resolutions: WatchedAnswers[str, object] = WatchedAnswers(attributes=attributes)
        try:
            check_all(memo, queries, compute, resolutions)
            change(root, outside, op)
            for query in queries:
                kept = memo.answer(query, lambda q=query: compute(q), lambda q=query: (q,))  # type: ignore[misc]
                assert kept == compute(query), (op, query)
                again = resolutions.real_path(query, _unkept)
                assert again == os.path.realpath(query), (op, query)
        finally:
            memo.clear()
            resolutions.clear()


def test_a_mode_changed_through_another_hard_link_is_seen(tmp_path: Path) -> None:
    root, _ = make_tree(tmp_path)
    (root / "b" / "alias").hardlink_to(root / "a" / "x")
    path = f"{root}/a/x"
    memo: WatchedAnswers[str, object] = WatchedAnswers(attributes=True)
    assert memo.answer("k", lambda: fresh(path), lambda: (path,)) == (path, True, True)
    (root / "b" / "alias").chmod(0o644)  # not through the name the answer read
    assert memo.answer("k", lambda: fresh(path), lambda: (path,)) == (path, False, True)
    memo.clear()


def test_a_burst_of_events_starts_again(tmp_path: Path) -> None:
    # More events than one read takes: nothing is parsed, everything is dropped (a check's
    # time in the queue stays bounded whatever a tool does to the tree).
    root, _ = make_tree(tmp_path)
    memo: WatchedAnswers[str, str] = WatchedAnswers(attributes=False)
    path = str(root / "l" / "x")
    assert memo.answer("k", lambda: os.path.realpath(path), lambda: (path,)) == f"{root}/a/x"
    for n in range(3000):  # in the watched root, names the answer never read
        (root / f"f{n}").write_text("")
    (root / "l").unlink()
    (root / "l").symlink_to("b")
    assert memo.answer("k", lambda: os.path.realpath(path), lambda: (path,)) == f"{root}/b/x"
    memo.clear()


def test_an_answer_whose_walk_ran_out_of_watches_is_not_kept(tmp_path: Path) -> None:
    root, _ = make_tree(tmp_path)
    memo: WatchedAnswers[str, str] = WatchedAnswers(attributes=False, watches=2)
    path = str(root / "a" / "b" / "x")  # more directories than two watches cover
    assert memo.answer("k", lambda: os.path.realpath(path), lambda: (path,)) == path
    (root / "a" / "b").rename(root / "a" / "c")
    (root / "a" / "b").symlink_to("../b")  # a change only an unwatched directory would see
    expected = os.path.realpath(path)
    assert expected == f"{root}/b/x"
    assert memo.answer("k", lambda: os.path.realpath(path), lambda: (path,)) == expected
    memo.clear()
