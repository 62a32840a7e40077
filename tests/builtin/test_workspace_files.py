import os
import stat
from pathlib import Path

import anyio
import pytest

import handrail as hr
from handrail.builtin import _files, _fs
from handrail.builtin._files import (
    LIST_LIMIT_ENTRIES,
    READ_LIMIT_BYTES,
    SEARCH_LIMIT_MATCHES,
)

pytestmark = pytest.mark.anyio


def text_of(result: hr.ToolResult) -> str:
    return result.render_text()


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- read_file -------------------------------------------------------------------------------


async def test_write_then_read_round_trips(call, workspace: Path) -> None:
    written = await call("write_file", path="notes/a.txt", content="héllo\nworld\n")
    assert not written.is_error
    assert written.structured == {"path": "notes/a.txt", "bytes": len("héllo\nworld\n".encode())}
    assert (workspace / "notes" / "a.txt").read_bytes() == "héllo\nworld\n".encode()
    read = await call("read_file", path="notes/a.txt")
    assert not read.is_error
    assert text_of(read) == "héllo\nworld\n"


async def test_read_offset_and_limit(call, workspace: Path) -> None:
    (workspace / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = await call("read_file", path="n.txt", offset=3, limit=2)
    lines = text_of(result).splitlines()
    assert lines[:2] == ["line 3", "line 4"]
    assert "offset=5" in lines[2]
    last = await call("read_file", path="n.txt", offset=9)
    assert text_of(last) == "line 9\nline 10\n"
    past = await call("read_file", path="n.txt", offset=50)
    assert not past.is_error
    assert "has 10 lines" in text_of(past)
    just_past = await call("read_file", path="n.txt", offset=11)
    assert "has 10 lines" in text_of(just_past)


async def test_read_a_last_line_without_newline(call, workspace: Path) -> None:
    (workspace / "n.txt").write_text("a\nb")
    assert text_of(await call("read_file", path="n.txt", offset=2)) == "b"
    assert "has 2 lines" in text_of(await call("read_file", path="n.txt", offset=3))


async def test_read_truncates_at_the_cap_on_a_line_boundary(call, workspace: Path) -> None:
    line = "x" * 99 + "\n"
    total = READ_LIMIT_BYTES // 100 + 50
    (workspace / "big.txt").write_text(line * total)
    result = await call("read_file", path="big.txt")
    text = text_of(result)
    shown = READ_LIMIT_BYTES // 100
    assert text.count(line) == shown
    assert f"offset={shown + 1}" in text
    rest = await call("read_file", path="big.txt", offset=shown + 1)
    assert text_of(rest).count(line) == total - shown


async def test_read_cuts_a_single_line_longer_than_the_cap(call, workspace: Path) -> None:
    (workspace / "one.txt").write_text("é" * READ_LIMIT_BYTES)  # 2 bytes each
    text = text_of(await call("read_file", path="one.txt"))
    body, note = text.rsplit("\n", 1)
    assert body == "é" * (READ_LIMIT_BYTES // 2)  # cut on a character boundary
    assert "longer than" in note


async def test_read_refuses_binary_and_non_utf8(call, workspace: Path) -> None:
    (workspace / "b.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (workspace / "latin.txt").write_bytes("café".encode("latin-1"))
    binary = await call("read_file", path="b.bin")
    assert binary.is_error
    assert "binary" in text_of(binary)
    latin = await call("read_file", path="latin.txt")
    assert latin.is_error
    assert "not UTF-8" in text_of(latin)


async def test_read_errors_for_missing_and_directories(call, workspace: Path) -> None:
    (workspace / "d").mkdir()
    missing = await call("read_file", path="nope.txt")
    assert missing.is_error
    assert "does not exist" in text_of(missing)
    directory = await call("read_file", path="d")
    assert directory.is_error
    assert "directory" in text_of(directory)
    root = await call("read_file", path=".")
    assert root.is_error


async def test_read_empty_file(call, workspace: Path) -> None:
    (workspace / "e.txt").write_bytes(b"")
    result = await call("read_file", path="e.txt")
    assert not result.is_error
    assert "empty" in text_of(result)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
async def test_read_does_not_hang_on_a_fifo(call, workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    result = await call("read_file", path="pipe")
    assert result.is_error
    assert "not a regular file" in text_of(result)


async def test_an_absolute_path_inside_the_workspace_works(call, workspace: Path) -> None:
    (workspace / "a.txt").write_text("inside\n")
    result = await call("read_file", path=str(workspace / "a.txt"))
    assert text_of(result) == "inside\n"


# --- write_file ------------------------------------------------------------------------------


async def test_write_replaces_atomically_and_keeps_the_mode(call, workspace: Path) -> None:
    target = workspace / "run.sh"
    target.write_text("old\n")
    target.chmod(0o751)
    result = await call("write_file", path="run.sh", content="new\n")
    assert not result.is_error
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert names(workspace) == ["run.sh"]  # no temp file left


async def test_write_refuses_a_directory_and_the_root(call, workspace: Path) -> None:
    (workspace / "d").mkdir()
    on_dir = await call("write_file", path="d", content="x")
    assert on_dir.is_error
    assert "directory" in text_of(on_dir)
    on_root = await call("write_file", path=".", content="x")
    assert on_root.is_error
    assert (workspace / "d").is_dir()


async def test_write_refuses_a_lone_surrogate_as_invalid_arguments(box, workspace: Path) -> None:
    handler = box.handler("workspace/write_file", workspace=workspace)
    with pytest.raises(hr.InvalidArguments) as caught:
        await handler.step(hr.Invoke("c", {"path": "a.txt", "content": "\ud800"}))
    assert caught.value.issues[0].path == "$.content"
    assert not (workspace / "a.txt").exists()


# --- edit_file -------------------------------------------------------------------------------


async def test_edit_replaces_the_one_occurrence(call, workspace: Path) -> None:
    (workspace / "m.py").write_text("a = 1\nb = 2\nc = 3\n")
    result = await call("edit_file", path="m.py", old="b = 2", new="b = 20")
    assert not result.is_error
    assert result.structured == {"path": "m.py", "line": 2}
    assert (workspace / "m.py").read_text() == "a = 1\nb = 20\nc = 3\n"


async def test_edit_says_how_often_old_occurs(call, workspace: Path) -> None:
    (workspace / "m.py").write_text("x\nx\nx\n")
    many = await call("edit_file", path="m.py", old="x", new="y")
    assert many.is_error
    assert "3 times" in text_of(many)
    none = await call("edit_file", path="m.py", old="zzz", new="y")
    assert none.is_error
    assert "does not occur" in text_of(none)
    assert (workspace / "m.py").read_text() == "x\nx\nx\n"


async def test_edit_counts_overlapping_occurrences(call, workspace: Path) -> None:
    (workspace / "o.txt").write_text("aaa")
    result = await call("edit_file", path="o.txt", old="aa", new="b")
    assert result.is_error
    assert "2 times" in text_of(result)


async def test_edit_refuses_empty_old(box, workspace: Path) -> None:
    handler = box.handler("workspace/edit_file", workspace=workspace)
    with pytest.raises(hr.InvalidArguments):
        await handler.step(hr.Invoke("c", {"path": "a", "old": "", "new": "x"}))


async def test_edit_missing_file(call) -> None:
    result = await call("edit_file", path="gone.txt", old="a", new="b")
    assert result.is_error
    assert "does not exist" in text_of(result)


# --- list_dir --------------------------------------------------------------------------------


async def test_list_dir_sorts_and_marks(call, workspace: Path, outside: Path) -> None:
    (workspace / "b.txt").write_text("")
    (workspace / "a_dir").mkdir()
    (workspace / ".hidden").write_text("")
    (workspace / "link").symlink_to(outside)
    result = await call("list_dir")
    assert text_of(result).splitlines() == [".hidden", "a_dir/", "b.txt", "link@"]
    sub = await call("list_dir", path="a_dir")
    assert "empty" in text_of(sub)


async def test_list_dir_is_bounded(call, workspace: Path) -> None:
    for i in range(LIST_LIMIT_ENTRIES + 5):
        (workspace / f"f{i:05d}").write_bytes(b"")
    text = text_of(await call("list_dir"))
    lines = text.splitlines()
    assert len(lines) == LIST_LIMIT_ENTRIES + 1
    assert lines[-1] == "[5 more entries not shown]"


async def test_list_dir_on_a_file(call, workspace: Path) -> None:
    (workspace / "f").write_text("x")
    result = await call("list_dir", path="f")
    assert result.is_error


# --- search ----------------------------------------------------------------------------------


async def test_search_reports_file_line_text(call, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("import os\ndef main():\n    return 1\n")
    (workspace / "b.txt").write_text("nothing\ndef other\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("def in git\n")
    (workspace / "blob.bin").write_bytes(b"def\x00binary")
    result = await call("search", pattern=r"^def ")
    assert text_of(result).splitlines() == ["b.txt:2: def other", "src/a.py:2: def main():"]
    assert result.structured["complete"] is True


async def test_search_under_a_path_and_in_one_file(call, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("hit\n")
    (workspace / "top.py").write_text("hit\n")
    under = await call("search", pattern="hit", path="src")
    assert text_of(under) == "src/a.py:1: hit"
    one = await call("search", pattern="hit", path="top.py")
    assert text_of(one) == "top.py:1: hit"
    none = await call("search", pattern="miss")
    assert not none.is_error
    assert "no matches" in text_of(none)


async def test_search_is_bounded(call, workspace: Path) -> None:
    (workspace / "many.txt").write_text("hit\n" * (SEARCH_LIMIT_MATCHES + 50))
    result = await call("search", pattern="hit")
    lines = text_of(result).splitlines()
    assert len(lines) == SEARCH_LIMIT_MATCHES + 1
    assert "stopped at" in lines[-1]
    assert result.structured["complete"] is False


async def test_search_skips_files_named_like_secrets(call, workspace: Path) -> None:
    (workspace / ".env").write_text("API_KEY=sk-live\n")
    (workspace / "deploy").mkdir()
    (workspace / "deploy" / "Server.KEY").write_text("API_KEY=private\n")
    (workspace / "settings.py").write_text("API_KEY = os.environ['API_KEY']\n")
    result = await call("search", pattern="API_KEY")
    text = text_of(result)
    assert "sk-live" not in text
    assert "private" not in text
    assert text.splitlines()[0] == "settings.py:1: API_KEY = os.environ['API_KEY']"
    assert result.structured["secret_files_skipped"] == 2


async def test_search_invalid_regex_is_invalid_arguments(box, workspace: Path) -> None:
    handler = box.handler("workspace/search", workspace=workspace)
    with pytest.raises(hr.InvalidArguments) as caught:
        await handler.step(hr.Invoke("c", {"pattern": "(unclosed"}))
    assert caught.value.issues[0].path == "$.pattern"
    assert "the pattern cannot be used: missing )" in caught.value.issues[0].message


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?<=a)b", r"(?=a)", "a{1000}{1000}", "x" * 3000])
async def test_search_refuses_patterns_re2_cannot_run_with_a_clear_error(
    box, workspace: Path, pattern: str
) -> None:
    handler = box.handler("workspace/search", workspace=workspace)
    with pytest.raises(hr.InvalidArguments) as caught:
        await handler.step(hr.Invoke("c", {"pattern": pattern}))
    message = caught.value.issues[0].message
    assert "RE2" in message or "at most" in message


async def test_a_catastrophic_pattern_returns_promptly(call, workspace: Path) -> None:
    """Issue 9 §2: `(-+)+x` over a line of dashes backtracked for hours holding the GIL."""
    (workspace / "dashes.txt").write_text(("-" * 40 + "\n") * 2000 + "-" * 100_000 + "\n")
    # Linear (RE2): milliseconds. A backtracking engine would take hours here, so the guard
    # below tells them apart on any machine without asserting a time of its own.
    with anyio.fail_after(20):
        result = await call("search", pattern="(-+)+x")
    assert "no matches" in text_of(result)


async def test_search_stops_after_the_total_byte_cap(
    call, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_files, "SEARCH_LIMIT_TOTAL_BYTES", 10)
    for name in "abc":
        (workspace / f"{name}.txt").write_text("hit hit\n")
    result = await call("search", pattern="hit")
    assert result.structured is not None and result.structured["complete"] is False
    assert result.structured["files_read"] == 2
    assert "stopped after reading 10 bytes" in text_of(result)


async def test_search_does_not_follow_symlinks_out(call, workspace: Path, outside: Path) -> None:
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    (workspace / "linkdir").symlink_to(outside)
    (workspace / "own.txt").write_text("no secret here\n")
    result = await call("search", pattern="SECRET|secret")
    assert text_of(result) == "own.txt:1: no secret here"
    assert result.structured["matches"] == 1


# --- confinement -----------------------------------------------------------------------------

FILE_TOOLS = [
    ("read_file", {}),
    ("write_file", {"content": "pwned\n"}),
    ("edit_file", {"old": "TOP", "new": "pwned"}),
    ("list_dir", {}),
    ("search", {"pattern": "SECRET"}),
]


def escapes(outside: Path) -> dict[str, str]:
    return {
        "dotdot": "../outside/secret.txt",
        "dotdot-deep": "a/../../outside/secret.txt",
        "absolute": str(outside / "secret.txt"),
        "absolute-dir": str(outside),
        "symlink-file": "to_secret",
        "symlink-dir": "to_outside/secret.txt",
    }


@pytest.mark.parametrize(("tool", "extra"), FILE_TOOLS, ids=[t for t, _ in FILE_TOOLS])
@pytest.mark.parametrize("how", list(escapes(Path("/x"))))
async def test_paths_outside_the_workspace_are_refused(
    call, workspace: Path, outside: Path, tool: str, extra: dict[str, str], how: str
) -> None:
    (workspace / "to_secret").symlink_to(outside / "secret.txt")
    (workspace / "to_outside").symlink_to(outside)
    before = names(outside)
    result = await call(tool, path=escapes(outside)[how], **extra)
    assert result.is_error
    assert "outside the workspace" in text_of(result)
    assert "SECRET" not in text_of(result)
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
    assert names(outside) == before


async def test_write_through_a_symlinked_dir_creates_nothing_outside(
    call, workspace: Path, outside: Path
) -> None:
    (workspace / "out").symlink_to(outside)
    result = await call("write_file", path="out/new/file.txt", content="x")
    assert result.is_error
    assert not (outside / "new").exists()


async def test_a_symlink_inside_the_workspace_is_followed(call, workspace: Path) -> None:
    (workspace / "real.txt").write_text("real\n")
    (workspace / "alias.txt").symlink_to("real.txt")
    assert text_of(await call("read_file", path="alias.txt")) == "real\n"


def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    workspace: Path, outside: Path
) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "f.txt").write_text("fine\n")
    root = os.path.realpath(workspace)
    place = _fs.locate(root, "d/f.txt")
    # The attacker swaps the directory for a symlink between the check and the open.
    (workspace / "d" / "f.txt").unlink()
    (workspace / "d").rmdir()
    (workspace / "d").symlink_to(outside)
    (outside / "f.txt").write_text("outside\n")
    with pytest.raises(OSError):
        os.close(_fs.open_file(place))
    with pytest.raises(OSError):
        _fs.atomic_write(place, b"pwned")
    assert (outside / "f.txt").read_text() == "outside\n"
    assert names(outside) == ["f.txt", "secret.txt"]


def test_a_final_symlink_swapped_in_is_not_followed(workspace: Path, outside: Path) -> None:
    (workspace / "f.txt").write_text("fine\n")
    place = _fs.locate(os.path.realpath(workspace), "f.txt")
    (workspace / "f.txt").unlink()
    (workspace / "f.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(OSError):
        os.close(_fs.open_file(place))
    # Writing neither follows the link nor replaces it: what was decided was a file.
    with pytest.raises(_fs.Refusal, match="symlink"):
        _fs.atomic_write(place, b"new")
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
    assert (workspace / "f.txt").is_symlink()


# --- the workspace itself --------------------------------------------------------------------


async def test_a_call_without_a_workspace_is_a_user_error(box) -> None:
    with pytest.raises(hr.UserError, match="needs an agent workspace"):
        await box.call("workspace/read_file", {"path": "a.txt"})


async def test_a_relative_workspace_is_a_user_error(box) -> None:
    handler = box.handler("workspace/list_dir", workspace=Path("relative/ws"))
    with pytest.raises(hr.UserError, match="absolute"):
        await handler.step(hr.Invoke("c", {}))


async def test_search_stops_at_its_time_budget(
    call, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_files, "SEARCH_LIMIT_SECONDS", -1.0)
    (workspace / "a.txt").write_text("hit\n")
    result = await call("search", pattern="hit")
    assert result.structured is not None and result.structured["complete"] is False
    assert "stopped after -1 seconds" in text_of(result)
