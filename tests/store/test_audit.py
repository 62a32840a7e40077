"""The tamper-evident record: a real SQLite store, tampered with each way, and `audit verify`.

The record is made by the demo (`handrail demo`: a read, a denied secret, a deferred write)
and `handrail approve` in the same store, so it holds every kind of fact: a run's start and
its statuses, calls refused, allowed and approved, a pending approval and its decision.
Each tamper edits the file with plain `sqlite3`, as an administrator could.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from handrail.cli import main
from handrail.store import audit


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a finished, approved demo run (made once; each test tampers a copy)."""
    folder = tmp_path_factory.mktemp("recorded")
    path = folder / "runs.db"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["demo", "--store", str(path)]) == 0
    found = re.search(r" approve (\S+)", out.getvalue())
    assert found
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["approve", found.group(1), "--store", str(path)]) == 0
    return path


@pytest.fixture
def store(recorded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "runs.db"
    # SQLite's backup, not a copy of the file: what a closed store left in its WAL (a
    # checkpoint a busy machine put off) is in the copy too.
    source, target = sqlite3.connect(recorded), sqlite3.connect(copy)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return copy


def verify(path: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(["audit", "verify", "--store", str(path), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def edit(path: Path, *statements: str, params: tuple[Any, ...] = ()) -> None:
    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement, params if "?" in statement else ())
    db.commit()
    db.close()


def rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def first(report: Any) -> dict[str, Any]:
    assert report["ok"] is False and report["breaks"], report
    return report["breaks"][0]  # type: ignore[no-any-return]


def test_the_untouched_record_verifies(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = verify(store, capsys=capsys)
    assert code == 0 and report["ok"], report
    kinds = {r[0] for r in rows(store, "SELECT kind FROM audit")}
    assert kinds == {"run", "status", "call", "pending"}
    # Every call and item there is is covered, and the chain has no gap.
    assert report["rows"] == len(rows(store, "SELECT id FROM calls")) + len(
        rows(store, "SELECT id FROM pending")) + 1
    (count, top), = rows(store, "SELECT count(*), max(seq) FROM audit")
    assert count == top == report["head"]["seq"]


def test_an_edited_verdict_is_named(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (denied,), = rows(store, "SELECT id FROM calls WHERE verdict LIKE '%\"deny\"%'")
    edit(store, "UPDATE calls SET verdict = replace(verdict, '\"deny\"', '\"allow\"') "
                "WHERE id = ?", params=(denied,))
    code, report = verify(store, capsys=capsys)
    assert code == 1
    b = first(report)
    assert (b["what"], b["where"]) == ("edited", f"call {denied}")
    # A call's fact keeps the hash of its row, not a copy: the fact is named, not the column.
    (seq,), = rows(store, "SELECT max(seq) FROM audit WHERE ref = ?", (denied,))
    assert b["seq"] == seq and f"fact #{seq}" in b["detail"]


def test_an_edited_decision_and_approver_are_named(store: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (item,), = rows(store, "SELECT id FROM pending")
    edit(store, "UPDATE pending SET decided_by = 'mallory' WHERE id = ?", params=(item,))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and (b["what"], b["where"]) == ("edited", f"pending item {item}")
    assert "decided_by" in b["detail"]


def test_a_deleted_call_is_named(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (call,), = rows(store, "SELECT id FROM calls WHERE turn = 1")
    edit(store, "DELETE FROM calls WHERE id = ?", params=(call,))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and (b["what"], b["where"]) == ("deleted", f"call {call}")


def test_a_call_deleted_with_its_facts_breaks_the_chain(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (call,), = rows(store, "SELECT id FROM calls WHERE turn = 1")
    (seq,), = rows(store, "SELECT min(seq) FROM audit WHERE ref = ?", (call,))
    edit(store, "DELETE FROM calls WHERE id = ?", "DELETE FROM audit WHERE ref = ?",
         params=(call,))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and b["what"] == "deleted"
    assert b["seq"] == seq + 1  # the fact after the hole


def test_two_swapped_calls_are_named(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (a, ta), (b_, tb) = rows(store, "SELECT id, turn FROM calls WHERE turn IN (0, 1) "
                                    "ORDER BY turn")
    edit(store, "UPDATE calls SET turn = -1 WHERE id = ?", params=(a,))
    edit(store, "UPDATE calls SET turn = ? WHERE id = ?", params=(ta, b_))
    edit(store, "UPDATE calls SET turn = ? WHERE id = ?", params=(tb, a))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and b["what"] == "reordered"
    assert b["where"] in (f"call {a}", f"call {b_}")


def test_two_swapped_facts_are_named(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The chain's own rows swapped (their content moved between the two places; version 3
    # keeps no `prev` to compare: each hashes right only after what the other follows).
    cols = "run_id, n, kind, ref, body, hash"
    (r3,), (r4,) = [rows(store, f"SELECT {cols} FROM audit WHERE seq = ?", (s,)) for s in (3, 4)]
    for seq, row in ((3, r4), (4, r3)):
        edit(store, "UPDATE audit SET kind = ?, ref = ?, body = ?, hash = ? "
                    "WHERE seq = ?", params=(*row[2:6], seq))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and b["what"] == "reordered" and b["seq"] == 3


def test_an_edited_fact_in_the_chain_is_named(store: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # A fact's own body changed: the run's first status, which no row holds any more (the
    # run moved on), so only the fact's hash shows it.
    (seq,), = rows(store, "SELECT min(seq) FROM audit WHERE kind = 'status'")
    edit(store, "UPDATE audit SET body = replace(body, '\"running\"', '\"failed\"') "
                "WHERE seq = ?", params=(seq,))
    assert "failed" in rows(store, "SELECT body FROM audit WHERE seq = ?", (seq,))[0][0]
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and (b["what"], b["seq"]) == ("edited", seq), report
    assert "does not match its hash" in b["detail"]


def test_a_forged_approval_is_named(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (call, run), = rows(store, "SELECT id, run_id FROM calls WHERE turn = 1")
    edit(store, "INSERT INTO pending (id, kind, run_id, call_record, agent, tool, payload, "
                "created_at, state, decision, decided_by, decided_at) VALUES ('ap-forged', "
                "'approval', ?, ?, 'demo', "
                "'workspace/read_file', '{}', 1.0, 'decided', '{\"kind\":\"approve\"}', "
                "'alice', 2.0)", params=(run, call))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and (b["what"], b["where"]) == ("inserted", "pending item ap-forged")


def test_a_forged_fact_in_the_chain_is_named(store: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # A forger who writes a well-formed fact (its run hash right) into the middle of the
    # chain: the store-wide links and the run's next fact no longer follow.
    (run, n, prev, link), = rows(store, "SELECT run_id, n, hash, link FROM audit "
                                        "WHERE seq = 5")
    body = audit.status_body(run, "completed", None)
    digest = audit.fact_hash(prev, body)
    edit(store, "UPDATE audit SET seq = seq + 1000, n = n + 1 WHERE seq > 5",
         "UPDATE audit SET seq = seq - 999 WHERE seq > 1000")
    edit(store, "INSERT INTO audit VALUES (6, ?, ?, 'status', ?, ?, NULL, ?, ?, 0)",
         params=(run, n + 1, run, body, digest, audit.fact_link(link, digest)))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and (b["what"], b["where"]) == ("inserted", "fact #6"), report


def _rewrite_run(path: Path) -> None:
    """What a forger with handrail's own code does: edit a verdict, then rebuild every fact
    of the store (bodies from the rows, both chains) so the chain is consistent again."""
    from handrail.store._sqlite import _CALL_COLUMNS

    db = sqlite3.connect(path)
    db.execute("UPDATE calls SET verdict = replace(verdict, '\"deny\"', '\"allow\"')")
    calls = {r[0]: r for r in db.execute(f"SELECT {_CALL_COLUMNS} FROM calls")}
    link, tips = audit.ZERO_HASH, {}
    for seq, run, _n, kind, ref, body, digest in db.execute(
            "SELECT seq, run_id, n, kind, ref, body, hash FROM audit ORDER BY seq").fetchall():
        prev = tips.get(run, audit.ZERO_HASH)
        if kind == "call" and seq == max(s for (s,) in db.execute(
                "SELECT seq FROM audit WHERE ref = ?", (ref,))):
            digest = audit.fact_hash(prev, audit.call_body(calls[ref]))
        elif body is not None:
            digest = audit.fact_hash(prev, body)
        # (A call's earlier state keeps its hash alone: nobody can recompute it, so a
        # forger leaves it as it is; its link covers it, and they recompute that.)
        link = audit.fact_link(link, digest)
        tips[run] = digest
        db.execute("UPDATE audit SET hash = ?, link = ? WHERE seq = ?", (digest, link, seq))
    db.commit()
    db.close()


def test_a_rewritten_run_is_caught_by_a_signed_head(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "keygen", str(tmp_path / "key")]) == 0
    capsys.readouterr()
    key, pub = str(tmp_path / "key"), str(tmp_path / "key.pub")
    code, report = verify(store, "--sign", key, capsys=capsys)
    assert code == 0 and report["signed"]["seq"] == report["head"]["seq"]
    code, report = verify(store, "--key", pub, capsys=capsys)
    assert code == 0 and report["signed_upto"] == report["head"]["seq"]

    _rewrite_run(store)
    # The chain alone is consistent again: what it cannot prove (docs/audit.md)...
    code, report = verify(store, capsys=capsys)
    assert code == 0, report
    # ...and what the signature does.
    code, report = verify(store, "--key", pub, capsys=capsys)
    b = first(report)
    assert code == 1 and b["what"] == "rewritten" and b["where"] == (
        f"signed head #{report['head']['seq']}")


def test_a_forged_signature_and_a_wrong_key_are_refused(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("key", "other"):
        assert main(["audit", "keygen", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert verify(store, "--sign", str(tmp_path / "key"), capsys=capsys)[0] == 0
    code, report = verify(store, "--key", str(tmp_path / "other.pub"), capsys=capsys)
    assert code == 1 and "no head is signed by this key" in first(report)["detail"]
    edit(store, "UPDATE audit_signatures SET signature = ? ",
         params=("00" * 64,))
    code, report = verify(store, "--key", str(tmp_path / "key.pub"), capsys=capsys)
    assert code == 1 and first(report)["what"] == "rewritten"
    assert "does not verify" in first(report)["detail"]


def test_sign_refuses_a_broken_record(store: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "keygen", str(tmp_path / "key")]) == 0
    edit(store, "DELETE FROM calls WHERE turn = 0")
    capsys.readouterr()
    code, report = verify(store, "--sign", str(tmp_path / "key"), capsys=capsys)
    assert code == 1 and report["signed"] is None
    # (The table of signatures is made by the first one.)
    assert rows(store, "SELECT count(*) FROM sqlite_master WHERE name = 'audit_signatures'"
                ) == [(0,)]


def test_verify_one_run_and_the_first_break_in_words(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run,), = rows(store, "SELECT id FROM runs")
    assert main(["audit", "verify", "--store", str(store), "--run", run]) == 0
    assert "The record verifies" in capsys.readouterr().out
    edit(store, "UPDATE runs SET status = 'failed'")
    assert main(["audit", "verify", "--store", str(store), "--run", run]) == 1
    out = capsys.readouterr().out
    assert f"BROKEN: edited: run {run}" in out and "status" in out
    assert main(["audit", "verify", "--store", str(store), "--run", "nope"]) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_the_export_verifies_with_plain_json_and_hashlib(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "keygen", str(tmp_path / "key")]) == 0
    capsys.readouterr()
    assert verify(store, "--sign", str(tmp_path / "key"), capsys=capsys)[0] == 0
    out = tmp_path / "chain.jsonl"
    assert main(["audit", "export", "--store", str(store), "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, *facts = lines
    signatures = [f for f in facts if f["type"] == "signature"]
    facts = [f for f in facts if f["type"] == "fact"]
    assert header["type"] == "header" and header["version"] == 3
    # What an auditor writes without handrail: recompute each hash and each link (version
    # 3: over the hashes' 32 bytes).
    link, tips = bytes.fromhex(header["link_before"]), {}
    for f in facts:
        assert f["v"] == 3 and f["prev"] == tips.get(f["run"], "0" * 64)
        prev = bytes.fromhex(f["prev"])
        if f["body"] is not None:  # null: a call (its row, below, or its hash alone)
            assert hashlib.sha256(prev + f["body"].encode()).hexdigest() == f["hash"]
            version, kind, run, ref, _ = json.loads(f["body"])
            assert (version, kind, run, ref) == (3, f["kind"], f["run"], f["ref"])
        link = hashlib.sha256(link + bytes.fromhex(f["hash"])).digest()
        assert link.hex() == f["link"]
        tips[f["run"]] = f["hash"]
    assert len(facts) == rows(store, "SELECT count(*) FROM audit")[0][0]
    # Every call's latest state is in the export (its row, as the fact recorded it), and
    # hashes as recorded in the row encoding, written here from its description alone.
    latest = {f["ref"]: f for f in facts if f["kind"] == "call"}
    assert len(latest) == rows(store, "SELECT count(*) FROM calls")[0][0]
    for f in latest.values():
        assert f["body"] is None and f["row"] is not None
        data = _row_bytes([3, "call", f["row"]])
        assert hashlib.sha256(bytes.fromhex(f["prev"]) + data).hexdigest() == f["hash"]
    # The decision and who made it are readable in the export as they were recorded.
    names = audit.ENCODING["pending"]
    decided = dict(zip(names, [json.loads(f["body"]) for f in facts
                               if f["kind"] == "pending"][-1][4], strict=True))
    assert decided["state"] == "decided" and decided["decided_by"]
    (sig,) = signatures
    assert sig["seq"] == facts[-1]["seq"] and sig["link"] == facts[-1]["link"]
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(sig["key"]))
    key.verify(bytes.fromhex(sig["signature"]),
               f"handrail-audit/1 head {sig['seq']} {sig['link']}".encode())


def _row_bytes(value: Any) -> bytes:
    """The row encoding as docs/audit.md describes it, without handrail."""
    import struct

    if value is None:
        return b"N"
    if isinstance(value, list):
        return b"(" + struct.pack("<I", len(value)) + b"".join(map(_row_bytes, value))
    if isinstance(value, int):
        assert -2**31 <= value < 2**31  # (larger ones: `l`, not in this record)
        return b"i" + struct.pack("<i", value)
    if isinstance(value, float):
        return b"g" + struct.pack("<d", value)
    data = value.encode("utf-8", "surrogatepass")
    return b"u" + struct.pack("<I", len(data)) + data


def test_the_row_encoding_is_marshal_format_2_as_described() -> None:
    # The writer's bytes (CPython's marshal) are the described encoding, every value kind.
    row = ("r:c", "r", "c", 0, -3, "é\udc80", None, 2**31 - 1, -2**31, 2**31, -2**70, 1.5,
           -0.0, 1e300, "", '{"a":"\\""}')
    assert audit.call_body(row) == audit.encode_row((3, "call", row))
    assert audit.call_body(row, 2) == audit.encode_row((2, "call", row))
    assert audit.encode_row((2, "call", row))[:1] == b"("
    assert audit.encode_row(2**31) == b"l\x03\x00\x00\x00\x00\x00\x00\x00\x02\x00"
    # An enum's value (a str subclass) is written as the text the store keeps.
    import enum

    class Kind(enum.StrEnum):
        A = "a"

    assert audit.call_body(("x", Kind.A)) == audit.call_body(("x", "a"))


def test_the_export_since_starts_at_a_verifiable_link(store: Path, tmp_path: Path) -> None:
    edit(store, "UPDATE audit SET at = 10 WHERE seq <= 5", "UPDATE audit SET at = 1.6e9 "
                "WHERE seq > 5")
    out = tmp_path / "chain.jsonl"
    assert main(["audit", "export", "--store", str(store), "--out", str(out),
                 "--since", "2020-01-01"]) == 0
    header, *facts = [json.loads(line) for line in out.read_text().splitlines()]
    assert header["from_seq"] == 6 == facts[0]["seq"]
    (hash5, link5), = rows(store, "SELECT hash, link FROM audit WHERE seq = 5")
    assert header["link_before"] == link5.hex()
    assert hashlib.sha256(link5 + bytes.fromhex(facts[0]["hash"])).hexdigest() == (
        facts[0]["link"])
    # The run's previous hash, which the store does not keep, is given (the demo's one
    # run: fact 5's): the first fact's own hash checks from there too.
    assert facts[0]["prev"] == hash5.hex() and facts[0]["body"] is not None
    assert hashlib.sha256(hash5 + facts[0]["body"].encode()).hexdigest() == facts[0]["hash"]


def test_content_markers_stay_verifiable(store: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # The approved write's content is kept as {sha256, bytes} once performed; the chain
    # covers the marker, so it cannot be swapped for another file's digest.
    (call, arguments), = rows(store, "SELECT id, arguments FROM calls WHERE arguments LIKE "
                                     "'%\"sha256\"%'")
    marker = re.search(r'"sha256":"([0-9a-f]{64})"', arguments)
    assert marker
    edit(store, "UPDATE calls SET arguments = replace(arguments, ?, ?)",
         params=(marker.group(1), "f" * 64))
    code, report = verify(store, capsys=capsys)
    b = first(report)
    assert code == 1 and (b["what"], b["where"]) == ("edited", f"call {call}")


def test_a_migrated_store_chains_its_record_as_found(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from handrail.store import Store
    from handrail.store._sqlite import MIGRATIONS

    # A store as the previous schema left it: no chain.
    edit(store, "DROP TABLE audit", "DROP TABLE IF EXISTS audit_signatures",
         "DELETE FROM _migrations WHERE name = '0010_audit_chain'",
         f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    code = main(["audit", "verify", "--store", str(store)])
    assert code == 1 and "to migrate it" in capsys.readouterr().err

    async def reopen() -> None:
        await Store.open(store).close()

    import anyio

    anyio.run(reopen)
    code, report = verify(store, capsys=capsys)
    assert code == 0 and report["facts"] > 0, report


@pytest.mark.anyio
async def test_two_stores_on_one_file_chain_one_after_the_other(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each store caches the chain's tips and checks them against the store's newest fact
    # in each write: when the other one chained meanwhile, it reads the facts written
    # since. Turns alternate between the two: the chain stays one.
    import time

    from handrail.store import Batch, CallRecord, RunRecord, RunStatus, Store
    from handrail.store._records import CallStatus

    path = tmp_path / "runs.db"
    a, b = Store.open(path), Store.open(path)
    try:
        runs = {s: RunRecord(id=name, task="t", agent="a", created_at=time.time(),
                             policy={"layers": []}, status=RunStatus.RUNNING)
                for s, name in ((a, "ra"), (b, "rb"))}
        for turn in range(6):
            for store in (a, b) if turn % 2 else (b, a):
                run = runs[store]
                run.steps = turn
                await store.write(Batch(run=run, calls=[CallRecord(
                    id=f"{run.id}:c{turn}", run_id=run.id, call_id=f"c{turn}", turn=turn,
                    index=0, model_name="m", status=CallStatus.FINISHED,
                    started_at=time.time())]))
        assert rows(path, "SELECT count(*) FROM log WHERE c23 IS NOT NULL")[0][0] > 0
    finally:
        await a.close()
        await b.close()
    code, report = verify(path, capsys=capsys)
    assert code == 0, report["breaks"]
    assert report["rows"] == 2 + 12 and report["facts"] == 2 * (2 + 6)


@pytest.mark.anyio
async def test_a_store_catches_up_on_facts_another_folded_out_of_the_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Another connection chains and folds the log: the log holds no fact then, and the
    # writer that chained before it finds the facts since in the table (an empty log is not
    # "nothing new").
    import time

    from handrail.store import Batch, CallRecord, RunRecord, RunStatus, Store
    from handrail.store._records import CallStatus
    from handrail.store._sqlite import _fold_rows

    path = tmp_path / "runs.db"
    a, b = Store.open(path), Store.open(path)
    try:
        runs = {s: RunRecord(id=name, task="t", agent="a", created_at=time.time(),
                             policy={"layers": []}, status=RunStatus.RUNNING)
                for s, name in ((a, "ra"), (b, "rb"))}

        async def turn(store: Any, n: int) -> None:
            run = runs[store]
            run.steps = n
            await store.write(Batch(run=run, calls=[CallRecord(
                id=f"{run.id}:c{n}", run_id=run.id, call_id=f"c{n}", turn=n, index=0,
                model_name="m", status=CallStatus.FINISHED, started_at=time.time())]))

        await turn(a, 0)
        await turn(b, 0)
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        _fold_rows(db)
        db.execute("COMMIT")
        db.close()
        assert rows(path, "SELECT count(*) FROM log")[0][0] == 0
        await turn(a, 1)
    finally:
        await a.close()
        await b.close()
    code, report = verify(path, capsys=capsys)
    assert code == 0, report["breaks"]
    assert report["facts"] == 2 + 2 + 1 + 2


def _as_version_2(path: Path) -> None:
    """The store as handrail wrote it before migration 0013: every fact chained in version 2
    (bodies `[2, ...`, each fact's `prev`, hashes and links as hex text), the log with the
    six fact columns of migration 0012 (c23..c28), and 0013 not run yet."""
    from handrail.store._sqlite import _CALL_COLUMNS, _SIGNATURES_TABLE, MIGRATIONS

    db = sqlite3.connect(path)
    calls = {r[0]: r for r in db.execute(f"SELECT {_CALL_COLUMNS} FROM calls")}
    latest = dict(db.execute("SELECT ref, max(seq) FROM audit WHERE kind = 'call' "
                             "GROUP BY ref").fetchall())
    link, tips = audit.ZERO, {}
    for seq, run, _kind, ref, body in db.execute(
            "SELECT seq, run_id, kind, ref, body FROM audit ORDER BY seq").fetchall():
        prev = tips.get(run, audit.ZERO)
        if body is not None:
            value = json.loads(body)
            body = json.dumps([2, *value[1:]], separators=(",", ":"))
            digest = audit.chain_hash(prev, body)
        elif latest[ref] == seq:
            digest = audit.chain_hash(prev, audit.call_body(calls[ref], 2))
        else:  # a call's earlier state: its hash alone, whatever it hashed
            digest = hashlib.sha256(f"state {seq}".encode()).hexdigest()
        link = audit.link_hash(link, digest)
        tips[run] = digest
        db.execute("UPDATE audit SET body = ?, prev = ?, hash = ?, link = ? WHERE seq = ?",
                   (body, prev, digest, link, seq))
    assert db.execute("SELECT count(*) FROM log").fetchone() == (0,)
    db.execute("ALTER TABLE log ADD COLUMN c28")
    db.execute(_SIGNATURES_TABLE)  # (made with the schema then)
    db.execute("DELETE FROM _migrations WHERE name = '0013_raw_hashes'")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    db.commit()
    db.close()


async def _extended(path: Path, opened: Any, capsys: pytest.CaptureFixture[str],
                    facts: int) -> None:
    """`opened` (the store at `path`, migrated) verifies with `facts` facts, and a new run
    written now (version 3) extends the chain, which verifies with them."""
    import time

    from handrail.store import Batch, CallRecord, RunRecord
    from handrail.store._records import CallStatus

    try:
        assert rows(path, "SELECT count(*) FROM log") == [(0,)]
        code, report = verify(path, capsys=capsys)
        assert code == 0 and report["facts"] == facts, report
        new = RunRecord(id="after", task="t", created_at=time.time(), policy={"layers": []})
        await opened.write(Batch(run=new, calls=[CallRecord(
            id="after:c0", run_id="after", call_id="c0", turn=0, index=0, model_name="m",
            status=CallStatus.FINISHED, started_at=time.time())]))
    finally:
        await opened.close()
    code, report = verify(path, capsys=capsys)
    assert code == 0 and report["facts"] == facts + 3, report
    kinds = rows(path, "SELECT typeof(hash), count(*) FROM audit GROUP BY typeof(hash)")
    assert dict(kinds) == {"text": facts, "blob": 3}  # versions 2 and 3, each as written
    # A version 2 fact is still checked as one: its body edited is named.
    edit(path, "UPDATE audit SET body = replace(body, '\"running\"', '\"failed\"') "
               "WHERE seq = (SELECT min(seq) FROM audit WHERE kind = 'status')")
    code, report = verify(path, capsys=capsys)
    assert code == 1 and first(report)["what"] == "edited", report
    assert len(report["breaks"]) == 1, report  # (the run's rows, checked as version 2, hold)


@pytest.mark.anyio
async def test_a_version_2_store_verifies_once_migrated_and_chains_on_in_version_3(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A store version 2 wrote (hex hashes, `prev` kept, the log's six fact columns), some
    # of its facts still in the log (a process killed, or still open): migration 0013
    # folds them as they are and makes the log again; each fact verifies by its version.
    from handrail.store import Store
    from handrail.store._sqlite import _CALL_COLUMNS

    _as_version_2(store)
    facts = rows(store, "SELECT * FROM audit WHERE seq > 4 ORDER BY seq")
    calls = {r[0]: r for r in rows(store, f"SELECT {_CALL_COLUMNS} FROM calls")}
    assert len(facts) > 3 and any(f[3] == "call" for f in facts)
    db = sqlite3.connect(store)
    db.execute("DELETE FROM audit WHERE seq > 4")
    for seq, run, n, kind, ref, body, prev, digest, link, at in facts:
        chained = (seq, n, prev, digest, link, at)
        if kind == "call":  # in its record's row (its latest state's columns, for each)
            db.execute(f"INSERT INTO log (kind, run_id, {', '.join(f'c{i}' for i in range(29))})"
                       f" VALUES (1, ?, {', '.join('?' * 29)})", (run, *calls[ref], *chained))
        else:
            db.execute("INSERT INTO log (kind, run_id, c0, c1, c2, c23, c24, c25, c26, c27, "
                       "c28) VALUES (2, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (run, kind, ref, body, *chained))
    db.commit()
    db.close()
    await _extended(store, Store.open(store), capsys, 4 + len(facts))


@pytest.mark.anyio
async def test_a_log_the_previous_layout_left_unfolded_verifies_once_migrated(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before migration 0012 every fact was a log row of its own (kind 2: c0 seq, c1 n, c2
    # kind, c3 ref, c4 body, c5 prev, c6 hash, c7 link, c8 at), folded into `audit` later.
    # A store a process of that version left unfolded (killed, or still open) is folded as
    # it is, then given the fact's columns; its chain holds, and new writes extend it.
    from handrail.store import Store
    from handrail.store._sqlite import MIGRATIONS

    _as_version_2(store)
    facts = rows(store, "SELECT * FROM audit WHERE seq > 4 ORDER BY seq")
    assert len(facts) > 3
    edit(store, "DELETE FROM audit WHERE seq > 4",
         *(f"ALTER TABLE log DROP COLUMN c{i}" for i in range(23, 29)),
         "DELETE FROM _migrations WHERE name = '0012_facts_in_log_rows'",
         f"PRAGMA user_version = {len(MIGRATIONS) - 2}")
    db = sqlite3.connect(store)
    db.executemany("INSERT INTO log (kind, run_id, c0, c1, c2, c3, c4, c5, c6, c7, c8) "
                   "VALUES (2, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [(f[1], f[0], *f[2:]) for f in facts])
    db.commit()
    db.close()
    await _extended(store, Store.open(store), capsys, 4 + len(facts))


@pytest.mark.anyio
async def test_a_lone_writer_reads_nothing_to_chain(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A writer chains on the tips it cached while its connection's data version says
    # nobody else wrote since its last commit: a store that created its file knows its
    # chain is empty and reads nothing for its first write; it reads the store's newest
    # fact again only after another connection committed, and a store opened on an
    # existing file reads it for its first write.
    import time

    from handrail.store import Batch, CallRecord, RunRecord, Store
    from handrail.store._records import CallStatus

    path = tmp_path / "runs.db"
    run = RunRecord(id="r", task="t", created_at=time.time(), policy={"layers": []})

    async def turn(store: Any, n: int) -> None:
        run.steps = n
        await store.write(Batch(run=run, calls=[CallRecord(
            id=f"r:c{n}", run_id="r", call_id=f"c{n}", turn=n, index=0, model_name="m",
            status=CallStatus.FINISHED, started_at=time.time())]))

    def reads(statements: list[str]) -> list[str]:
        return [s for s in statements if "FROM log WHERE c23 IS NOT NULL ORDER BY id DESC" in s
                or "FROM audit ORDER BY seq DESC" in s]

    store = Store.open(path)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    try:
        for n in range(5):
            await turn(store, n)
        assert reads(statements) == [], statements
        # Another connection commits (a change: SQLite writes nothing for a row rewritten
        # as it was, and the data version then rightly stays; tokens are not chained).
        edit(path, "UPDATE runs SET input_tokens = input_tokens + 1")
        for n in range(5, 8):
            await turn(store, n)
    finally:
        await store.close()
    assert len(reads(statements)) == 1, statements
    again = Store.open(path)
    statements = []
    again._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    try:
        for n in range(8, 10):
            await turn(again, n)
    finally:
        await again.close()
    assert len(reads(statements)) >= 1, statements  # (the log was folded: the table too)
    code, report = verify(path, capsys=capsys)
    # (The run's start, ten calls, its status as each store chained it first.)
    assert code == 0 and report["facts"] == 1 + 10 + 2, report


@pytest.mark.anyio
async def test_a_write_rolled_back_after_chaining_leaves_no_hole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A store chains its next write on the tips it cached, reading nothing, only when its
    # data version says nobody else wrote since its last commit and nothing it chained was
    # rolled back since. Writes that fail after chaining (a pending item naming a run there
    # is not: the foreign key), a merged group rolled back to be written a write at a time,
    # a write of a group rolled back alone: the writes after each chain where the store's
    # chain really ends.
    import contextlib
    import time

    import anyio

    from handrail.errors import StoreError
    from handrail.store import Batch, CallRecord, PendingItem, RunRecord, RunStatus, Store
    from handrail.store._records import CallStatus

    path = tmp_path / "runs.db"
    store = Store.open(path)
    r0, r1, r2, r3 = (RunRecord(id=f"r{i}", task="t", created_at=time.time(),
                                policy={"layers": []}, status=RunStatus.RUNNING)
                      for i in range(4))

    def turn(run: RunRecord, n: int, *, broken: bool = False) -> Batch:
        run.steps = n
        return Batch(run=run, calls=[CallRecord(
            id=f"{run.id}:c{n}", run_id=run.id, call_id=f"c{n}", turn=n, index=0,
            model_name="m", status=CallStatus.FINISHED, started_at=time.time())],
            pending=[PendingItem(id=f"p{run.id}{n}", kind="approval", run_id="no such run",
                                 call_record=f"{run.id}:c{n}")] if broken else [])

    async def group(*writes: tuple[RunRecord, int, bool]) -> None:
        async def one(run: RunRecord, n: int, broken: bool) -> None:
            with contextlib.suppress(StoreError):
                await store.write(turn(run, n, broken=broken))

        async with anyio.create_task_group() as tg:
            for write in writes:
                tg.start_soon(one, *write)

    try:
        for n in range(2):
            await store.write(turn(r0, n))
        with pytest.raises(StoreError):
            await store.write(turn(r2, 0, broken=True))  # r2's first write: rolled back
        await store.write(turn(r0, 2))
        await group((r1, 0, False), (r2, 1, False), (r0, 3, False))
        # Merged, then (r1's row is not as this store left it: another process changed it)
        # rolled back and written a write at a time, all of which commit.
        edit(path, "UPDATE runs SET owner = 'another process' WHERE id = 'r1'")
        await group((r1, 1, False), (r2, 2, False), (r0, 4, False))
        # A write at a time in savepoints: the second is rolled back alone.
        await group((r1, 2, False), (r3, 0, True), (r0, 5, False))
        await store.write(turn(r1, 3))
    finally:
        await store.close()
    code, report = verify(path, capsys=capsys)
    assert code == 0, report["breaks"]
    assert rows(path, "SELECT count(*) FROM calls") == [(12,)]


def test_a_memory_store_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", "--store", "memory://"]) == 1
    assert "keeps no audit chain" in capsys.readouterr().err


AUDITABLE = Path(__file__).with_name("auditable.py")


def _store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return str(tmp_path / "runs.db")
    return str(request.getfixturevalue("pg_url"))


def _writers(url: str, processes: int, runs: int) -> list[str]:
    """`processes` writers at once on one store, `runs` concurrent runs each."""
    import subprocess
    import sys

    started = [subprocess.Popen([sys.executable, str(AUDITABLE), url, str(runs), f"w{i}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(processes)]
    ids: list[str] = []
    for p in started:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        ids += json.loads(out)
    return ids


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_writers_chain_one_record(backend: str, tmp_path: Path,
                                             request: pytest.FixtureRequest,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    url = _store_url(backend, tmp_path, request)
    ids = _writers(url, processes=3, runs=8)
    assert len(set(ids)) == 24
    code = main(["audit", "verify", "--store", url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"], report["breaks"][:3]
    assert report["runs"] == 24
    # Each run: its start, its statuses, each call's states, and no fact lost or doubled:
    # the store-wide chain has no gap (checked by verify) and every run's chain is whole.
    for run in ids[:3]:
        assert main(["audit", "verify", "--store", url, "--run", run, "--json"]) == 0
        one = json.loads(capsys.readouterr().out)
        assert one["ok"] and one["rows"] == 1 + 2  # the run and its two calls


def _pg(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def test_postgres_tampering_is_named(pg_url: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    ids = _writers(pg_url, processes=1, runs=3)

    def check(*extra: str) -> tuple[int, Any]:
        code = main(["audit", "verify", "--store", pg_url, "--json", *extra])
        return code, json.loads(capsys.readouterr().out)

    assert main(["audit", "keygen", str(tmp_path / "key")]) == 0
    capsys.readouterr()
    code, report = check("--sign", str(tmp_path / "key"))
    assert code == 0 and report["signed"], report
    (call,), = _pg(pg_url, "SELECT id FROM calls WHERE run_id = %s AND turn = 0", (ids[0],))

    # An edited decision's approver.
    _pg(pg_url, "UPDATE calls SET decided_by = 'mallory' WHERE id = %s", (call,))
    code, report = check()
    assert code == 1 and (first(report)["what"], first(report)["where"]) == (
        "edited", f"call {call}")
    # A deleted call (its approver edit is gone with it).
    _pg(pg_url, "DELETE FROM calls WHERE id = %s", (call,))
    code, report = check()
    assert code == 1 and (first(report)["what"], first(report)["where"]) == (
        "deleted", f"call {call}")
    # A forged approval.
    _pg(pg_url, "INSERT INTO pending (id, kind, run_id, call_record, agent, tool, payload, "
                "created_at, state, decision, decided_by, decided_at) VALUES ('ap-forged', "
                "'approval', %s, %s, 'auditable', "
                "'world/effect', '{}', 1.0, 'decided', '{}', 'alice', 2.0)", (ids[1], call))
    code, report = check()
    assert code == 1 and any(b["where"] == "pending item ap-forged" and b["what"] == "inserted"
                             for b in report["breaks"])
    # A fact removed from the middle of the store's chain.
    _pg(pg_url, "DELETE FROM audit WHERE seq = 3")
    code, report = check()
    assert code == 1 and first(report)["what"] == "deleted" and first(report)["seq"] <= 4
    # A head rewritten (as a rewrite of everything before it would leave it): the signed
    # head is not the one the chain has.
    (head,), = _pg(pg_url, "SELECT max(seq) FROM audit")
    _pg(pg_url, "UPDATE audit SET link = %s WHERE seq = %s", ("f" * 64, head))
    code, report = check("--key", str(tmp_path / "key.pub"))
    assert code == 1 and {"what": "rewritten", "where": f"signed head #{head}"}.items() <= next(
        b for b in report["breaks"] if b["what"] == "rewritten").items()


def test_a_decision_not_yet_resumed_is_chained(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # `deny --no-resume`: the decision and the run's move to READY are one transaction of
    # `decide`, with nothing of the run's own after them: both must be in the chain.
    path = tmp_path / "runs.db"
    assert main(["demo", "--store", str(path)]) == 0
    found = re.search(r" approve (\S+)", capsys.readouterr().out)
    assert found
    assert main(["deny", found.group(1), "--reason", "no", "--no-resume",
                 "--store", str(path)]) == 0
    capsys.readouterr()
    code, report = verify(path, capsys=capsys)
    assert code == 0, report["breaks"]
    assert rows(path, "SELECT status FROM runs") == [("ready",)]
    (run,), = rows(path, "SELECT id FROM runs")
    (last,), = rows(path, "SELECT body FROM audit ORDER BY seq DESC LIMIT 1")
    assert json.loads(last) == [3, "status", run, run, [run, "ready", None]]


@pytest.mark.anyio
async def test_a_live_store_verifies_with_its_log_not_folded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # While a store is open its facts wait in the log (folded every so many writes, and on
    # close): verify reads them there, and a fact edited there is found as in the table.
    import sys

    sys.path.insert(0, str(AUDITABLE.parent))
    try:
        from auditable import build
    finally:
        sys.path.pop(0)
    from handrail.store import Store

    path = tmp_path / "runs.db"
    store = Store.open(path)
    try:
        import handrail as hr

        await build().run("change the world, run live", store=store, approver=hr.ApproveAll())
        assert rows(path, "SELECT count(*) FROM log WHERE c23 IS NOT NULL")[0][0] > 0
        assert rows(path, "SELECT count(*) FROM audit") == [(0,)]
        code, report = verify(path, capsys=capsys)
        assert code == 0 and report["facts"] > 0, report
        # A call's row in the log (its verdict: c11), before the fold moved it.
        edit(path, "UPDATE log SET c11 = replace(c11, '\"ask\"', '\"allow\"') WHERE kind = 1")
        code, report = verify(path, capsys=capsys)
        assert code == 1 and first(report)["what"] == "edited"
    finally:
        await store.close()


def test_a_migrated_postgres_store_chains_its_record_as_found(
        pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _writers(pg_url, processes=1, runs=2)
    # The database as the previous schema left it: no chain.
    _pg(pg_url, "DROP TABLE audit, audit_tip, audit_signatures")
    _pg(pg_url, "DROP FUNCTION handrail_audit")
    _pg(pg_url, "DELETE FROM handrail_migrations WHERE name = '0010_audit_chain'")
    assert main(["audit", "verify", "--store", pg_url]) == 1
    assert "no audit chain yet" in capsys.readouterr().err

    async def reopen() -> None:
        from handrail.store import Store

        store = Store.open(pg_url)
        await store.runs()
        await store.close()

    import anyio

    anyio.run(reopen)
    assert main(["audit", "verify", "--store", pg_url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"] == 2 and report["rows"] == 2 + 4
    # And the store chains on from there.
    _writers(pg_url, processes=1, runs=1)
    assert main(["audit", "verify", "--store", pg_url]) == 0
