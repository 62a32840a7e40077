"""`handrail inbox --notify-url ...`: the inbox process sends notifications and enforces
deadlines, beside the page; its options are checked before it listens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from inbox_support import run_store

import handrail as hr
from handrail.cli import main
from handrail.store import Batch, PendingItem, RunRecord, RunStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notify"))
from receiver import Receiver

SECRET = "webhook-secret-for-tests-0123456789"


def _private(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    run_store(path, lambda s: s.runs())
    return path


def test_notify_options_are_checked_before_it_listens(db: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    secret = _private(tmp_path / "secret", SECRET)
    assert main(["inbox", "--store", str(db), "--notify-url", "http://127.0.0.1:9/h"]) == 1
    assert "--notify-secret-file" in capsys.readouterr().err
    assert main(["inbox", "--store", str(db), "--notify-url", "http://127.0.0.1:9/h",
                 "--notify-secret-file", str(secret), "--link-key-file", str(secret)]) == 1
    assert "--public-url" in capsys.readouterr().err
    assert main(["inbox", "--store", str(db), "--link-key-file", str(secret)]) == 1
    assert "go with --notify-url" in capsys.readouterr().err
    assert main(["inbox", "--store", str(db), "--notify-url", "ftp://x/h",
                 "--notify-secret-file", str(secret)]) == 1
    assert "http(s) URL" in capsys.readouterr().err
    loose = tmp_path / "loose"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    assert main(["inbox", "--store", str(db), "--notify-url", "http://127.0.0.1:9/h",
                 "--notify-secret-file", str(loose)]) == 1
    assert "--notify-secret-file" in capsys.readouterr().err


@pytest.mark.slow
def test_the_inbox_process_notifies_with_links_and_enforces_deadlines(db: Path,
                                                                      tmp_path: Path) -> None:
    now = time.time()

    async def seed(store: hr.Store) -> None:
        for run_id, item in (
                ("r1", PendingItem(id="a1", kind="approval", run_id="r1", call_record="r1:c",
                                   tool="x/pay", payload={"act": "call", "target": "x/pay"},
                                   created_at=now)),
                ("r2", PendingItem(id="a2", kind="approval", run_id="r2", call_record="r2:c",
                                   payload={"act": "call", "target": "x/pay"},
                                   created_at=now - 3600, deadline=now - 1,
                                   on_expiry={"kind": "deny", "reason": "expired after 1h"}))):
            await store.write(Batch(run=RunRecord(
                id=run_id, task="t", policy={"layers": []}, created_at=now,
                status=RunStatus.AWAITING_APPROVAL,
                outcome={"kind": "awaiting_approval", "request_id": item.id}),
                pending=[item]))

    run_store(db, seed)
    secret = _private(tmp_path / "secret", SECRET)
    key = _private(tmp_path / "key", "link-key-for-tests-0123456789abcdef")
    env = {**os.environ}
    env.pop("HANDRAIL_STORE", None)
    with Receiver(SECRET) as receiver:
        proc = subprocess.Popen(
            [sys.executable, "-m", "handrail.cli", "inbox", "--store", str(db), "--port", "0",
             "--notify-url", receiver.url, "--notify-secret-file", str(secret),
             "--link-key-file", str(key), "--public-url", "https://inbox.example"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        watchdog = threading.Timer(90, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            said = []
            for line in proc.stdout:
                said.append(line)
                if re.search(r"/login\?token=", line):
                    break
            assert any("notifying webhook http://127.0.0.1" in s and "decision links" in s
                       for s in said), said
            assert receiver.arrived.wait(60), "no notification arrived"
        finally:
            watchdog.cancel()
            proc.terminate()
            proc.wait(timeout=15)
            if proc.stdout is not None:
                proc.stdout.close()
    (got,) = receiver.deliveries  # a2 expired in the same round, before it was owed one
    assert got["item"] == "a1" and got["inbox_url"] == "https://inbox.example/items/a1"
    assert got["approve_url"].startswith("https://inbox.example/links/")
    expired = run_store(db, lambda s: s.pending_item("a2"))
    assert (expired.decided_by, expired.decision["reason"]) == ("expiry", "expired after 1h")
