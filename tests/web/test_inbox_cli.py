"""`handrail inbox`: what it refuses before it listens, and what it prints when it does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from inbox_support import run_store

from handrail.cli import main


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    run_store(path, lambda s: s.runs())
    return path


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::"])
def test_a_non_loopback_host_needs_a_token_file_or_allow_remote(
        db: Path, host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inbox", "--store", str(db), "--host", host]) == 1
    err = capsys.readouterr().err
    assert "--token-file" in err and "--allow-remote" in err


def test_a_short_token_file_is_refused(db: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("short\n")
    token.chmod(0o600)
    assert main(["inbox", "--store", str(db), "--host", "0.0.0.0", "--token-file",
                 str(token)]) == 1
    assert "shorter than 16" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_token_file_others_can_read_is_refused(db: Path, tmp_path: Path, mode: int,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 33: as ssh refuses a private key others can read.
    token = tmp_path / "token"
    token.write_text("team-token-0123456789abcdef\n")
    token.chmod(mode)
    assert main(["inbox", "--store", str(db), "--host", "0.0.0.0", "--token-file",
                 str(token)]) == 1
    err = capsys.readouterr().err
    assert "can be read by other users" in err and f"chmod 600 {token}" in err


def test_a_missing_store_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inbox", "--store", str(tmp_path / "nope.db")]) == 1
    assert "no run store" in capsys.readouterr().err


@pytest.mark.slow
def test_it_prints_a_one_time_login_link_and_guards_everything_else(db: Path) -> None:
    env = {**os.environ}
    env.pop("HANDRAIL_STORE", None)
    proc = subprocess.Popen([sys.executable, "-m", "handrail.cli", "inbox", "--store", str(db),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            found = re.search(r"(http://127\.0\.0\.1:\d+)/login\?token=(\S+)", line)
            if found:
                url = found.group(1)
                break
        # Story: the link works once, and a second person learnt it from a failed sign-in.
        note = proc.stdout.readline()
        watchdog.cancel()
        assert url is not None
        assert "signs in once" in note and "--token-file" in note, note
        with urllib.request.urlopen(f"{url}/login") as response:
            assert response.status == 200
            assert "Content-Security-Policy" in response.headers
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/items/x")
        assert refused.value.code == 401
        refused.value.close()
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()


def test_it_never_prints_the_stores_password(pg_url: str) -> None:
    # The test server trusts local connections, so a password in the URL is accepted unused.
    url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@", 1)
    assert "s3cret-pw" in url
    env = {**os.environ}
    env.pop("HANDRAIL_STORE", None)
    proc = subprocess.Popen([sys.executable, "-m", "handrail.cli", "inbox", "--store", url,
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            printed.append(line)
            if "/login?token=" in line:
                break
        watchdog.cancel()
        assert any("/login?token=" in line for line in printed), printed
        assert any("postgres:***@" in line for line in printed), printed
        assert not any("s3cret-pw" in line for line in printed), printed
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
