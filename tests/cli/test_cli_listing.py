"""How the reading commands list a large store (issue 11): a page for a person, everything
for a script, aligned columns without rich, styles only on a terminal.

Story: on a store of 10,000 runs `handrail pending` took 266 ms, ~100 of them drawing 1,000
items through rich that nobody reads on a terminal; `show` read the newest 1,000 runs to find
the rest of a conversation, for every run shown. The commands now print a page (50) and say
how to see the rest, write `--json` item by item, draw their own table, and `show` reads
runs newest first only down to the run it shows.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.cli import main
from handrail.cli._display import Out, printable, style, table, width
from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _store_with_open_items(db: Path, count: int) -> None:
    async def go() -> None:
        async with Store.open(db) as store:
            for i in range(count):
                run = RunRecord(id=f"run-{i:03d}", task=f"task {i}", agent="a",
                                status=RunStatus.AWAITING_APPROVAL, created_at=float(i),
                                outcome={"kind": "awaiting_approval"})
                item = PendingItem(id=f"req-{i:03d}", kind="approval", run_id=run.id,
                                   call_record=f"{run.id}:c", tool="fs/write",
                                   created_at=float(i),
                                   payload={"act": "write", "target": f"out/{i}"})
                await store.write(Batch(run=run, pending=[item]))

    anyio.run(go)


def _listed(out: str) -> list[str]:
    return re.findall(r"^(req-\d+) approval", out, re.MULTILINE)


def test_pending_shows_a_page_and_says_how_to_see_every_item(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    _store_with_open_items(db, 60)
    every = [f"req-{i:03d}" for i in range(60)]

    code, out, err = _cli(capsys, "pending", "--store", str(db))
    assert code == 0, err
    assert _listed(out) == every[:50]  # oldest first
    assert "50 of 60 open items shown" in out and "handrail pending --all" in out

    code, out, _ = _cli(capsys, "pending", "--limit", "3", "--store", str(db))
    assert _listed(out) == every[:3] and "3 of 60 open items shown" in out

    code, out, _ = _cli(capsys, "pending", "--all", "--store", str(db))
    assert _listed(out) == every and "shown" not in out

    code, out, _ = _cli(capsys, "pending", "--json", "--store", str(db))
    assert [p["id"] for p in json.loads(out)] == every  # a script gets every item

    code, out, _ = _cli(capsys, "pending", "--json", "--limit", "2", "--store", str(db))
    assert [p["id"] for p in json.loads(out)] == every[:2]


def test_a_page_that_holds_every_item_says_nothing_more(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    _store_with_open_items(db, 2)
    code, out, err = _cli(capsys, "pending", "--limit", "2", "--store", str(db))
    assert code == 0, err
    assert _listed(out) == ["req-000", "req-001"] and "shown" not in out


@pytest.mark.parametrize("args", [["pending", "--limit", "0"], ["pending", "--limit", "-1"],
                                  ["pending", "--limit", "x"], ["runs", "--limit", "-1"],
                                  ["pending", "--all", "--limit", "3"]])
def test_a_limit_below_one_or_with_all_is_refused(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # SQL reads `LIMIT -1` as no limit: `runs --limit -1` would read a whole store.
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "1 or more" in err or "not allowed with" in err


@pytest.mark.parametrize("items", [[], [{"a": 1}],
                                   [{"id": "x", "payload": {"text": "é\n\u202e", "n": [1, None]}},
                                    {"id": "y", "payload": {}}, {"nested": [[], {}]}]])
def test_json_is_written_item_by_item_as_the_same_text(
        items: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from handrail.cli._runs import _json_list

    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    _json_list(iter(items))
    assert out.getvalue() == json.dumps(items, indent=2) + "\n"


def test_runs_lists_aligned_columns_and_never_cuts_an_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # narrow: nothing is cut or wrapped for it
    db = tmp_path / "runs.db"
    long_id = "run-" + "x" * 60

    async def go() -> None:
        async with Store.open(db) as store:
            for i, (run_id, task) in enumerate([(long_id, "plain"), ("r2", "数据 wide"),
                                                ("r3", "e\u0301 combining")]):
                await store.write(Batch(run=RunRecord(id=run_id, task=task, agent="ag",
                                                      created_at=float(i))))

    anyio.run(go)
    code, out, err = _cli(capsys, "runs", "--store", str(db))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["run", "status", "agent", "task", "steps", "sub-agents",
                                "started"]
    assert any(line.startswith(long_id + "  ") for line in lines)
    # Every column starts at the same terminal column on every line (wide characters take
    # two, a combining accent none); cells are apart by two spaces or more.
    starts = [[width(line[:m.start()]) for m in re.finditer(r"\S+(?: \S+)*", line)]
              for line in lines]
    assert all(len(row) == 7 for row in starts), lines
    assert all(row == starts[0] for row in starts), (starts, lines)


def test_the_table_pads_by_terminal_width() -> None:
    lines = table(["a", "b"], [["数据", "x"], ["ab", "y"], ["e\u0301", "z"]])
    assert [width(line[:-1]) for line in lines[1:]] == [6, 6, 6]
    assert width("数据") == 4 and width("e\u0301") == 1 and width("abc") == 3


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_styles_reach_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    inner = style("green", "y")
    line = f"{style('bold', 'run r1')} — {style('red', f'x {inner} z')}"
    shown = {}
    for name, stream in (("terminal", _Terminal()), ("file", io.StringIO())):
        out = Out(stream)
        out.print(line)
        out.flush()
        shown[name] = stream.getvalue()
    assert shown["file"] == "run r1 — x y z\n"
    # A span closing inside another restores the outer style.
    assert shown["terminal"] == ("\x1b[0m\x1b[1mrun r1\x1b[0m — \x1b[0m\x1b[31mx \x1b[0m\x1b[31m"
                                 "\x1b[32my\x1b[0m\x1b[31m z\x1b[0m\n")
    for env in ({"NO_COLOR": "1"}, {"TERM": "dumb"}):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        stream = _Terminal()
        out = Out(stream)
        out.print(line)
        out.flush()
        assert stream.getvalue() == shown["file"], env
        for key in env:
            monkeypatch.delenv(key)


def test_a_model_cannot_open_close_or_fake_a_style(monkeypatch: pytest.MonkeyPatch) -> None:
    # The style markers are C0 characters: `printable` escapes every one a model writes.
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    hostile = "\x01red\x02evil\x03 \x1b[31mred\x1b[0m"
    stream = _Terminal()
    out = Out(stream)
    out.print(f"{style('bold', 'task')}: {printable(hostile)}")
    out.flush()
    text = stream.getvalue()
    assert "\\x01red\\x02evil\\x03 \\x1b[31mred\\x1b[0m" in text
    assert re.sub(r"\x1b\[[0-9;]*m", "", text) == f"task: {printable(hostile)}\n"
    assert re.findall(r"\x1b\[[0-9;]*m", text) == ["\x1b[0m", "\x1b[1m", "\x1b[0m"]


def test_show_finds_a_conversations_later_runs_past_the_first_page(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from handrail.runs import thread

    db = tmp_path / "runs.db"

    def continues(previous: str) -> list[dict[str, Any]]:
        return [{"kind": "continues", "run": previous, "conversation": "c1", "at": 0}]

    async def go() -> list[str]:
        async with Store.open(db) as store:
            chain = [RunRecord(id="c1", task="first", created_at=1.0),
                     RunRecord(id="c2", task="second", created_at=2.0, events=continues("c1")),
                     RunRecord(id="c3", task="third", created_at=300.0, events=continues("c2"))]
            # 200 other runs between the conversation's second and third: the third is in
            # the first page, the second and first are past it.
            others = [RunRecord(id=f"o{i:03d}", task="other", created_at=10.0 + i)
                      for i in range(200)]
            for run in [*chain, *others]:
                await store.write(Batch(run=run))
            first = await store.run("c1")
            return [r.id for r in await thread(store, first)]

    assert anyio.run(go) == ["c1", "c2", "c3"]
    for shown in ("c1", "c2", "c3"):
        code, out, err = _cli(capsys, "show", shown, "--json", "--store", str(db))
        assert code == 0, err
        assert json.loads(out)["conversation"] == ["c1", "c2", "c3"], shown


def test_run_statuses_offered_by_the_parser_are_the_stores() -> None:
    from handrail.cli._runs import RUN_STATUSES

    assert list(RUN_STATUSES) == [s.value for s in RunStatus]
    assert hr.RunStatus is RunStatus


def test_runs_says_when_there_are_more_than_it_lists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"

    async def go() -> None:
        async with Store.open(db) as store:
            for i in range(4):
                await store.write(Batch(run=RunRecord(id=f"r{i}", task="t", created_at=float(i))))

    anyio.run(go)
    code, out, err = _cli(capsys, "runs", "--limit", "3", "--store", str(db))
    assert code == 0, err
    assert re.findall(r"^(r\d) ", out, re.MULTILINE) == ["r3", "r2", "r1"]
    assert "the newest 3 shown, and there are more" in out
    code, out, _ = _cli(capsys, "runs", "--limit", "4", "--store", str(db))
    assert len(re.findall(r"^r\d ", out, re.MULTILINE)) == 4 and "more" not in out
    code, out, _ = _cli(capsys, "runs", "--limit", "3", "--json", "--store", str(db))
    assert [r["id"] for r in json.loads(out)] == ["r3", "r2", "r1"]
    code, out, _ = _cli(capsys, "runs", "--status", "failed", "--store", str(db))
    assert out.strip() == "no failed runs in this store"


def test_pending_says_when_more_runs_are_ready_than_it_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"

    async def ready(count: int) -> None:
        async with Store.open(db) as store:
            for i in range(count):
                await store.write(Batch(run=RunRecord(id=f"ready-{i:02d}", task="t",
                                                      status=RunStatus.READY,
                                                      created_at=float(i))))

    anyio.run(ready, 20)
    code, out, err = _cli(capsys, "pending", "--store", str(db))
    assert code == 0, err
    assert len(re.findall(r"^run ready-\d+ is ready", out, re.MULTILINE)) == 20
    assert "more runs wait for a resume" not in out
    anyio.run(ready, 21)
    code, out, _ = _cli(capsys, "pending", "--store", str(db))
    assert len(re.findall(r"^run ready-\d+ is ready", out, re.MULTILINE)) == 20
    assert "more runs wait for a resume than these 20: handrail runs --status ready" in out
