"""The CLI over a tree of agents: roots listed with their sub-agents counted, the tree drawn
under each delegating call, who asks shown, and a child's question answered."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from trees import asking, effects_of, three_levels

import handrail as hr
from handrail.cli import main


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_childs_question_is_shown_with_its_agent_path_and_answered_from_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    db, effects = str(tmp_path / "runs.db"), str(tmp_path / "effects")
    monkeypatch.setenv("TREE_EFFECTS", effects)

    async def start() -> hr.RunResult:
        async with hr.Store.open(db) as store:
            return await asking(effects).run("paint", store=store)

    paused = anyio.run(start)
    assert isinstance(paused.outcome, hr.AwaitingAnswer)
    question = paused.outcome.question_id

    code, out = _cli(capsys, "pending", "--store", db)
    assert code == 0
    assert question in out and "agent: planner / painter" in out and "Which colour?" in out

    code, out = _cli(capsys, "answer", question, "red", "--agent", "trees:cli_asking",
                     "--store", db)
    assert code == 0, out
    assert "completed" in out and "painted red" in out
    assert effects_of(effects) == ["painted red"]

    code, out = _cli(capsys, "runs", "--json", "--store", db)
    (root,) = json.loads(out)
    assert root["id"] == paused.run_id and root["sub_agent_runs"] == 1
    code, out = _cli(capsys, "answer", question, "blue", "--agent", "trees:cli_asking",
                     "--store", db)
    assert code != 0 and "already decided" in out
    assert effects_of(effects) == ["painted red"]


def test_runs_lists_roots_with_a_count_and_show_draws_the_tree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, effects = str(tmp_path / "runs.db"), str(tmp_path / "effects")

    async def go() -> hr.RunResult:
        async with hr.Store.open(db) as store:
            paused = await three_levels(effects).run("go", store=store)
            assert isinstance(paused.outcome, hr.AwaitingApproval)
            return await hr.resume_with_decision(store, paused.outcome.request_id,
                                                 hr.Decision.approve(),
                                                 agent=three_levels(effects))

    done = anyio.run(go)
    assert done.output == "effect 3 done"

    code, out = _cli(capsys, "runs", "--store", db)
    assert code == 0
    assert done.run_id in out and "planner" in out
    assert "coder" not in out and "tester" not in out  # sub-agents' runs are under their root
    (row,) = [line for line in out.splitlines() if done.run_id in line]
    assert " 2 " in row  # coder and tester

    code, out = _cli(capsys, "show", done.run_id, "--store", db)
    assert code == 0
    lines = out.splitlines()

    def at(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    def indent(i: int) -> int:
        return len(lines[i]) - len(lines[i].lstrip())

    delegation, coder = at("agents/coder"), at("sub-agent coder")
    deeper, tester = at("agents/tester"), at("sub-agent tester")
    effect = at("world/effect")
    assert delegation < coder < deeper < tester < effect
    assert indent(delegation) < indent(coder) <= indent(deeper) < indent(tester) <= indent(effect)

    code, out = _cli(capsys, "show", done.run_id, "--json", "--store", db)
    shown = json.loads(out)
    (coder_json,) = shown["sub_agents"]
    assert coder_json["run"]["agent"] == "coder" and coder_json["run"]["depth"] == 1
    (tester_json,) = coder_json["sub_agents"]
    assert [c["tool"] for c in tester_json["calls"]] == ["world/effect"]
