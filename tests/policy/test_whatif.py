"""`hr.policy.what_if` and `suggest` on the record of a realistic agent (issue 39).

The agent (tests/policy/whatif_agent.py) reads, writes, runs programs, fetches, calls an MCP
server's tool and delegates to a sub-agent, 15 runs of it, ~300 calls, recorded in a real
SQLite file; the same record is copied into PostgreSQL for the backend tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import whatif_agent as wa

import handrail as hr
from handrail.store import Batch, CallRecord, RunRecord

# Recording the agent (15 runs, ~330 calls, each exec a process) is the first test's setup:
# on a loaded machine it takes longer than the default per-test timeout allows.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

RUNS = 15


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Recorded:
    """The recorded agent: its workspace, store file, HTTP port, MCP tools and history."""

    ws: Path
    db: Path
    port: int
    mcp: Any
    history: list[tuple[RunRecord, list[CallRecord]]]
    mutates: dict[str, bool]


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with wa.http_server() as p:
        yield p


@pytest.fixture(scope="module")
async def recorded(tmp_path_factory: pytest.TempPathFactory, port: int,
                   ) -> AsyncIterator[Recorded]:
    root = tmp_path_factory.mktemp("whatif")
    ws = wa.workspace(root)
    argv = wa.mcp_argv(root / "mcp.log")
    mcp_policy = hr.Policy.default().layer("mcp").allow("exec", " ".join(argv))
    async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="fx", policy=mcp_policy,
                                       sandbox="off") as mcp:
        db = root / "runs.db"
        store = hr.Store.open(db)
        results = await wa.record(store, ws, port, mcp, runs=RUNS)
        assert all(isinstance(r.outcome, hr.Completed) for r in results)
        history = [pair async for pair in store.call_history()]
        await store.close()
        agent = wa.agent(ws, 0, port, mcp, wa.current(port))
        mutates = {str(s.id): s.mutates for s in agent.toolbox.specs()}
        yield Recorded(ws, db, port, mcp, history, mutates)


def _actions(record: CallRecord) -> list[hr.Action]:
    return [hr.Action(hr.Act(a["act"]),
                      tuple(a["target"]) if a["act"] == "exec" else a["target"])
            for a in record.actions]


def expected_flips(rec: Recorded, policy: hr.Policy) -> dict[tuple[str, str], tuple[str, str]]:
    """What `Policy.check` says the proposed policy does to each recorded call that it
    changes: (run, call) -> (before, after). The disk is as it was when the calls ran."""
    out = {}
    for run, records in rec.history:
        for record in records:
            if not record.verdict or "effect" not in record.verdict:
                continue
            verdict = policy.check_all(_actions(record), workspace=run.workspace,
                                       mutates=rec.mutates[record.tool or ""])
            before = record.verdict["effect"]
            if verdict.effect.value != before:
                out[run.id, record.call_id] = (before, verdict.effect.value)
    return out


def tighter(port: int) -> hr.Policy:
    """Sources become read-only, fetching is refused, the sub-agent is asked for."""
    return (wa.current(port).layer("review").deny(hr.Act.WRITE, "src/**")
            .deny(hr.Act.NET, "**").ask(hr.Act.CALL, "agents/**"))


def looser(port: int) -> hr.Policy:
    """Every write is allowed, any host may be fetched, `ls` may run (the deny rules still
    hold)."""
    return (wa.current(port).layer("open").allow(hr.Act.WRITE, "**").allow(hr.Act.NET, "**")
            .allow(hr.Act.EXEC, "ls **"))


async def test_the_record_is_realistic(recorded: Recorded) -> None:
    calls = [c for _, cs in recorded.history for c in cs]
    assert len(calls) >= 250
    acts = Counter(a["act"] for c in calls for a in c.actions)
    assert {"read", "write", "exec", "net", "call"} <= set(acts)
    outcomes = Counter(c.status.value for c in calls)
    assert outcomes["refused"] and outcomes["finished"]
    kinds = Counter((c.decision or {}).get("kind") for c in calls)
    assert kinds["approve"] and kinds["deny"]
    assert any(run.parent_id for run, _ in recorded.history)
    assert any(c.tool == "fx/echo" for c in calls)


@pytest.fixture(scope="module")
async def shared(recorded: Recorded) -> list[tuple[RunRecord, list[CallRecord]]]:
    """The same history as the command reads it: the SQLite file on a read-only connection,
    what the policy decided on only, each distinct JSON text decoded once (records recorded
    alike share one value, and the replay one shape)."""
    from handrail.store._sqlite import read_history

    history = [pair async for pair in read_history(str(recorded.db), decisions_only=True)]
    calls = [c for _, cs in history for c in cs]
    # Proof that the shared path is the one exercised: far fewer values than records.
    assert len({id(c.verdict) for c in calls}) < len(calls) / 2
    assert len({id(c.actions) for c in calls}) < len(calls) / 2
    return history


@pytest.mark.parametrize("read", ["records", "shared"])
@pytest.mark.parametrize("proposal", [tighter, looser])
async def test_every_flip_what_if_reports_is_what_policy_check_decides(
        recorded: Recorded, shared: list[tuple[RunRecord, list[CallRecord]]], proposal: Any,
        read: str) -> None:
    policy = proposal(recorded.port)
    report = hr.policy.replay(recorded.history if read == "records" else shared, policy)
    expected = expected_flips(recorded, policy)
    assert expected, "the proposal changes nothing: the test would prove nothing"
    got = {(f.run_id, f.call_id): (f.before.value, f.after.value) for f in report.flips}
    assert got == expected
    assert report.replayed == sum(len(cs) for _, cs in recorded.history)
    assert report.undecided == 0
    # Counts per change, per tool and per rule are the flips' own.
    assert report.by_change() == dict(Counter(f"{b} -> {a}" for b, a in expected.values()))
    by_id = {(r.run_id, r.call_id): r for _, cs in recorded.history for r in cs}
    assert report.by_tool() == dict(Counter(by_id[k].tool for k in expected))
    assert sum(report.by_rule().values()) == len(expected)
    # Each flip names the call behind it, its target as decided, and its agent path.
    runs = {run.id: run for run, _ in recorded.history}
    for flip in report.flips:
        record = by_id[flip.run_id, flip.call_id]
        assert flip.tool == record.tool
        assert flip.agent == ("coder/helper" if runs[flip.run_id].parent_id else "coder")
        verdict = policy.check_all(_actions(record), workspace=runs[flip.run_id].workspace,
                                   mutates=recorded.mutates[record.tool or ""])
        assert (flip.target, flip.reason_after) == (verdict.target, verdict.reason)
        assert not flip.approximate


async def test_a_tightening_fails_when_it_denies_what_a_person_approved(recorded: Recorded) -> None:
    report = hr.policy.replay(recorded.history, tighter(recorded.port))
    assert report.failed
    gating = report.gating
    assert gating and all(f.outcome == "approved" and f.after is hr.Effect.DENY
                          for f in gating)
    assert {f.target for f in gating} >= {"src/app.py", "src/models.py"}
    # The sub-agent's approved write is not under src/: asked for, not gating.
    assert any(f.tool == "agents/helper" and f.change == "allow -> ask" for f in report.flips)
    assert "deny write 'src/**' in layer 'review'" in " ".join(report.by_rule())


async def test_a_loosening_fails_when_it_allows_what_was_refused(recorded: Recorded) -> None:
    report = hr.policy.replay(recorded.history, looser(recorded.port))
    assert report.failed
    loosened = {(f.outcome, f.target) for f in report.gating}
    # The NET default's refusal, and what a person denied, would go through; a deny rule
    # (src/generated) and the secrets layer still hold.
    assert ("refused", "example.com:443") in loosened
    assert ("denied", "docs/plan.md") in loosened
    assert ("denied", "/usr/bin/ls -a") in loosened or ("denied", "/bin/ls -a") in loosened
    # A call with two actions (read README.md, write docs/README.md) a person denied: both
    # now allowed, the verdict names the first (as `check_all` does).
    assert [(f.tool, f.target) for f in report.gating if f.tool == "repo/copy"] == [
        ("repo/copy", "README.md")] * RUNS
    assert not any(f.target in ("src/generated/out.py", ".env") for f in report.flips)
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["gating"] == len(report.gating) and data["failed"] is True


async def test_the_recorded_policy_flips_nothing(recorded: Recorded) -> None:
    report = hr.policy.replay(recorded.history, wa.current(recorded.port))
    assert report.flips == () and not report.failed


async def test_replay_uses_the_targets_as_decided_not_todays_disk(
        tmp_path: Path, recorded: Recorded) -> None:
    ws = wa.workspace(tmp_path)
    store = hr.Store.open(tmp_path / "runs.db")
    await wa.record(store, ws, recorded.port, recorded.mcp, runs=1)
    history = [pair async for pair in store.call_history()]
    await store.close()
    # alias.md led to notes/real.md; it now leads into docs/, and the policy keeps notes out.
    (ws / "alias.md").unlink()
    (ws / "alias.md").symlink_to(ws / "docs" / "other.md")
    proposal = wa.current(recorded.port).layer("t").deny(hr.Act.READ, "notes/**")
    report = hr.policy.replay(history, proposal)
    assert [(f.target, f.change) for f in report.flips] == [("notes/real.md", "allow -> deny")]
    # Deciding today, against the disk, would have said the opposite.
    run = history[0][0]
    assert proposal.check(hr.Action(hr.Act.READ, "alias.md"),
                          workspace=run.workspace).effect is hr.Effect.ALLOW


async def test_suggest_lets_the_same_run_through_without_asking(
        tmp_path: Path, recorded: Recorded) -> None:
    suggestion = hr.policy.suggest_from(recorded.history)
    text = suggestion.to_toml(header="suggested from the record")
    policy = hr.Policy.from_toml(text)
    assert policy == suggestion.policy
    assert suggestion.conflicts == ()
    # Folders where several files were written are generalised, never the root.
    assert suggestion.generalised == ("write:notes/*", "write:src/*")
    allows = [r.pattern for layer in policy.layers for r in layer.rules
              if r.effect is hr.Effect.ALLOW]
    assert allows and not [p for p in allows if p.startswith(("*", "**"))]
    # Replaying the record against it: nothing a person approved is denied, nothing refused
    # is let through.
    report = hr.policy.replay(recorded.history, policy)
    assert not report.failed
    assert not [f for f in report.flips if f.after is hr.Effect.DENY
                and f.outcome in ("allowed", "approved")]
    # The same scripted run completes under it, and nobody is asked anything.
    asked: list[str] = []

    def nobody(request: hr.Request) -> hr.Decision:
        asked.append(f"{request.act.value} {request.target}")
        return hr.Decision.deny("nobody is here")

    ws = wa.workspace(tmp_path)
    store = hr.Store.memory()
    [result] = await wa.record(store, ws, recorded.port, recorded.mcp, runs=1, policy=policy,
                               approver=hr.CallbackApprover(nobody))
    assert isinstance(result.outcome, hr.Completed)
    assert asked == []
    # A call the record never made is denied (NET elsewhere, a write below the kept deny).
    assert policy.check(hr.Action(hr.Act.NET, "evil.example:443")).effect is hr.Effect.DENY
    assert policy.check(hr.Action(hr.Act.WRITE, "src/generated/new.py"),
                        workspace=ws).effect is hr.Effect.DENY
    assert policy.check(hr.Action(hr.Act.READ, ".env.local"),
                        workspace=ws).effect is hr.Effect.DENY
    # ... and anything else the record never let through is asked for.
    assert policy.check(hr.Action(hr.Act.WRITE, "docs/new.md"),
                        workspace=ws).effect is hr.Effect.ASK
    assert policy.check(hr.Action(hr.Act.EXEC, ("echo", "other")),
                        workspace=ws).effect is hr.Effect.ASK


async def test_suggest_for_one_agent_covers_only_its_calls(recorded: Recorded) -> None:
    helper = hr.policy.suggest_from(recorded.history, agent="helper")
    allowed = {r.spec for layer in helper.policy.layers for r in layer.rules
               if r.effect is hr.Effect.ALLOW}
    assert allowed == {"read:src/util.py", "write:tests/test_util.py"}
    assert helper.runs == RUNS
    with pytest.raises(hr.UserError, match=r"no recorded run of agent 'nobody'.*coder"):
        hr.policy.suggest_from(recorded.history, agent="nobody")


async def test_what_if_for_one_agent_by_name_or_path(recorded: Recorded) -> None:
    by_name = hr.policy.replay(recorded.history, tighter(recorded.port), agent="helper")
    by_path = hr.policy.replay(recorded.history, tighter(recorded.port), agent="coder/helper")
    assert by_name == by_path and by_name.runs == RUNS
    assert {f.agent for f in by_name.flips} <= {"coder/helper"}
    for bad in ("", " ", "x" * 1001, "a\x1b[2Jb"):
        with pytest.raises(hr.UserError, match="agent"):
            hr.policy.replay(recorded.history, tighter(recorded.port), agent=bad)


def _digest(db: Path) -> dict[str, str]:
    """The file's bytes and its WAL's (an empty WAL, which any reader may create, is none)."""
    out = {}
    for name in (db.name, db.name + "-wal"):
        try:
            data = (db.parent / name).read_bytes()
        except FileNotFoundError:
            continue
        if data:
            out[name] = hashlib.sha256(data).hexdigest()
    return out


async def test_what_if_reads_a_sqlite_store_without_writing_it(tmp_path: Path,
                                                            recorded: Recorded) -> None:
    db = tmp_path / "runs.db"
    writer = hr.Store.open(db)
    await _copy(recorded.history, writer)
    # The writer is still open: what it wrote is in its log, not folded into the tables.
    raw = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    unfolded = raw.execute("SELECT count(*) FROM log WHERE kind = 1").fetchone()[0]
    assert unfolded > 0
    before = _digest(db)
    reader = hr.Store.open(db)
    # What the policy decided on is read the same with and without the rest of each call.
    full = [pair async for pair in reader.call_history()]
    light = [pair async for pair in reader.call_history(decisions_only=True)]
    assert [[_decided(c) for c in cs] for _, cs in light] == [
        [_decided(c) for c in cs] for _, cs in full] == [
        [_decided(c) for c in cs] for _, cs in recorded.history]
    assert full == recorded.history and light[0][1][0].result is None
    report = await hr.policy.what_if(reader, tighter(recorded.port))
    suggestion = await hr.policy.suggest(reader)
    await reader.close()
    assert _digest(db) == before
    assert raw.execute("SELECT count(*) FROM log WHERE kind = 1").fetchone()[0] == unfolded
    raw.close()
    assert report == hr.policy.replay(recorded.history, tighter(recorded.port))
    assert suggestion == hr.policy.suggest_from(recorded.history)
    await writer.close()


def _decided(c: CallRecord) -> tuple[Any, ...]:
    return (c.id, c.run_id, c.call_id, c.turn, c.index, c.model_name, c.tool, c.actions,
            c.verdict, c.decision, c.decided_by, c.status)


async def _copy(history: list[tuple[RunRecord, list[CallRecord]]], store: hr.Store) -> None:
    for run, calls in history:
        await store.write(Batch(run=run, calls=list(calls)))


async def test_postgres_reads_the_same_history_read_only(pg_url: str,
                                                         recorded: Recorded) -> None:
    store = hr.Store.open(pg_url)
    await _copy(recorded.history, store)
    history = [pair async for pair in store.call_history()]
    assert [(r.id, [c.id for c in cs]) for r, cs in history] == [
        (r.id, [c.id for c in cs]) for r, cs in recorded.history]
    for proposal in (tighter, looser):
        policy = proposal(recorded.port)
        assert (await hr.policy.what_if(store, policy)
                == hr.policy.replay(recorded.history, policy))
    assert await hr.policy.suggest(store) == hr.policy.suggest_from(recorded.history)
    await store.close()


async def test_since_keeps_only_the_runs_started_since(tmp_path: Path,
                                                      recorded: Recorded) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    old = [(_aged(run, 10 * 86400), calls) for run, calls in recorded.history[:4]]
    await _copy(old + recorded.history[4:], store)
    recent = await hr.policy.what_if(store, tighter(recorded.port), since="7d")
    everything = await hr.policy.what_if(store, tighter(recorded.port))
    assert recent.runs == len(recorded.history) - 4 and everything.runs == len(recorded.history)
    for bad, says in (("7x", "neither an age"), ("0d", "no time at all"),
                      ("2999-01-01", "in the future"), ("-3d", "neither an age")):
        with pytest.raises(hr.UserError, match=says):
            await hr.policy.what_if(store, tighter(recorded.port), since=bad)
    await store.close()


def _aged(run: RunRecord, seconds: float) -> RunRecord:
    from dataclasses import replace

    return replace(run, created_at=run.created_at - seconds)


# -- the command ----------------------------------------------------------------------


async def _handrail(*argv: str, cwd: Path) -> tuple[int, str, str]:
    done = await anyio.run_process([sys.executable, "-m", "handrail.cli", *argv], cwd=cwd,
                                   check=False, env={**os.environ, "NO_COLOR": "1"})
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_the_command_gates_a_policy_change(tmp_path: Path, recorded: Recorded) -> None:
    db = str(recorded.db)
    (tmp_path / "tight.toml").write_text(tighter(recorded.port).to_toml())
    (tmp_path / "same.toml").write_text(wa.current(recorded.port).to_toml())
    code, out, err = await _handrail("policy", "what-if", "tight.toml", "--store", db,
                                     cwd=tmp_path)
    assert code == 1, err
    assert "FAIL: " in out and "GATING" in out and "src/app.py" in out
    assert "rule deny write 'src/**' in layer 'review'" in out
    code, out, err = await _handrail("policy", "what-if", "tight.toml", "--store", db, "--json",
                                     cwd=tmp_path)
    assert code == 1
    data = json.loads(out)
    assert data == {"proposed": "tight.toml",
                    **json.loads(json.dumps(hr.policy.replay(
                        recorded.history, tighter(recorded.port)).to_dict()))}
    code, out, err = await _handrail("policy", "what-if", "same.toml", "--store", db,
                                     cwd=tmp_path)
    assert (code, err) == (0, "") and "Nothing flips" in out
    # Filters: one agent, a window.
    code, out, _ = await _handrail("policy", "what-if", "tight.toml", "--store", db, "--json",
                                   "--agent", "coder/helper", "--since", "1d", cwd=tmp_path)
    assert json.loads(out)["runs"] == RUNS


async def test_the_command_says_what_was_wrong(tmp_path: Path, recorded: Recorded) -> None:
    db = str(recorded.db)
    (tmp_path / "tight.toml").write_text(tighter(recorded.port).to_toml())
    (tmp_path / "bad.toml").write_text('[[layers]]\nname = "x"\nallow = ["wirte:src/**"]\n')
    for argv, says in (
            (("what-if", "missing.toml"), "cannot read the proposed policy missing.toml"),
            (("what-if", "bad.toml"), "unknown act 'wirte'"),
            (("what-if", "tight.toml", "--since", "soon"), "neither an age"),
            (("what-if", "tight.toml", "--agent", "nobody"), "no recorded run of agent"),
            (("suggest", "--agent", "nobody"), "no recorded run of agent"),
            (("suggest", "-o", str(tmp_path)), "is a folder")):
        code, _, err = await _handrail("policy", *argv, "--store", db, cwd=tmp_path)
        assert code == 1 and says in err, (argv, err)
    code, _, err = await _handrail("policy", "what-if", "tight.toml", "--store",
                                   str(tmp_path / "none.db"), cwd=tmp_path)
    assert code == 1 and "no handrail store" in err
    assert not (tmp_path / "none.db").exists()


async def test_the_suggested_policy_passes_its_own_what_if(tmp_path: Path,
                                                           recorded: Recorded) -> None:
    db = str(recorded.db)
    before = _digest(recorded.db)
    code, _, err = await _handrail("policy", "suggest", "--store", db, "-o", "least.toml",
                                   cwd=tmp_path)
    assert code == 0 and "wrote least.toml" in err
    policy = hr.Policy.load(tmp_path / "least.toml")
    assert policy == hr.policy.suggest_from(recorded.history).policy
    code, out, err = await _handrail("policy", "what-if", "least.toml", "--store", db,
                                     "--json", cwd=tmp_path)
    assert code == 0, out
    assert not [f for f in json.loads(out)["flips"] if f["after"] == "deny"
                and f["outcome"] in ("allowed", "approved")]
    code, out, _ = await _handrail("policy", "suggest", "--store", db, cwd=tmp_path)
    assert code == 0 and hr.Policy.from_toml(out) == policy
    assert _digest(recorded.db) == before


def test_calls_recorded_alike_in_two_workspaces_are_each_replayed_in_their_own() -> None:
    # One call of two actions, recorded twice with the very same decoded values (as a
    # store's history shares them), in runs of two workspaces. Its paths are absolute and
    # carry no decided form: made canonical against each run's workspace, they lie inside
    # the first and outside the second, which confinement denies.
    actions = [{"act": "read", "target": "/ws/one/a.py"},
               {"act": "write", "target": "/ws/one/b.py"}]
    verdict = {"effect": "allow", "rule": None, "layer": None, "reason": "default",
               "target": "a.py"}
    history = []
    for n, ws in enumerate(("/ws/one", "/ws/two")):
        run = RunRecord(id=f"r{n}", task="t", agent="a", workspace=ws, created_at=n)
        history.append((run, [CallRecord(id=f"r{n}:c", run_id=f"r{n}", call_id="c", turn=0,
                                         index=0, model_name="s/t", tool="s/t",
                                         actions=actions, verdict=verdict)]))
    report = hr.policy.replay(history, hr.Policy.permissive())
    assert [(f.run_id, f.after) for f in report.flips] == [("r1", hr.Effect.DENY)]
    assert report.flips[0].reason_after.startswith("path resolves outside the workspace")


def test_calls_recorded_alike_keep_their_own_outcome() -> None:
    # The same asked call, approved once and denied once: one shape, two outcomes. Denying
    # it fails the check for the approval only; allowing it, for the denial only.
    actions = [{"act": "write", "target": "src/a.py"}]
    verdict = {"effect": "ask", "rule": None, "layer": None, "reason": "default",
               "target": "src/a.py"}
    run = RunRecord(id="r", task="t", agent="a", workspace="/ws")
    calls = [CallRecord(id=f"r:{kind}", run_id="r", call_id=kind, turn=i, index=0,
                        model_name="s/t", tool="s/t", actions=actions, verdict=verdict,
                        decision={"kind": kind})
             for i, kind in enumerate(("approve", "deny"))]
    deny = hr.Policy.default().layer("x").deny(hr.Act.WRITE, "src/**")
    allow = hr.Policy.default().layer("x").allow(hr.Act.WRITE, "src/**")
    assert [(f.call_id, f.outcome, f.gating) for f in hr.policy.replay([(run, calls)], deny)
            .flips] == [("approve", "approved", True), ("deny", "denied", False)]
    assert [(f.call_id, f.gating) for f in hr.policy.replay([(run, calls)], allow)
            .flips] == [("approve", False), ("deny", True)]


async def test_a_history_read_decodes_each_text_once_and_shares_it(recorded: Recorded,
                                                                   monkeypatch: Any) -> None:
    from handrail.store._rows import DecisionRows
    from handrail.store._sqlite import read_history

    async def read() -> list[CallRecord]:
        return [c async for _, cs in read_history(str(recorded.db), decisions_only=True)
                for c in cs]

    calls = await read()
    by_text: dict[str, set[int]] = {}
    for c in calls:
        by_text.setdefault(json.dumps(c.verdict, sort_keys=True), set()).add(id(c.verdict))
    assert all(len(ids) == 1 for ids in by_text.values())  # equal text: one value
    assert len(by_text) > 10  # and different texts: different values
    # Nothing remembered (a record of all-distinct texts): the same records, none shared.
    monkeypatch.setattr(DecisionRows, "MEMO", 0)
    alone = await read()
    assert alone == calls
    assert len({id(c.verdict) for c in alone}) == len(alone)


async def test_the_memory_store_gives_the_same_history(recorded: Recorded) -> None:
    store = hr.Store.memory()
    await _copy(recorded.history, store)
    history = [pair async for pair in store.call_history()]
    assert history == recorded.history
    later = [pair async for pair in store.call_history(since=recorded.history[5][0].created_at)]
    assert [r.id for r, _ in later] == [r.id for r, _ in recorded.history[5:]]
    assert (await hr.policy.what_if(store, looser(recorded.port))
            == hr.policy.replay(recorded.history, looser(recorded.port)))
    await store.close()
