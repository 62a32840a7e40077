"""Fixtures for the inbox: a store with paused runs, and the app behind Starlette's client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the inbox needs the web extra: pip install -e '.[web]'")

import inbox_agents
from inbox_support import TOKEN, Inbox, login, run_store
from starlette.testclient import TestClient

import handrail as hr
from handrail.web import create_app


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[Inbox]:
    db = tmp_path / "runs.db"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run_store(db, lambda store: store.runs())  # create the file
    store = hr.Store.open(db)
    app = create_app(store, agent_for=inbox_agents.by_ref, login_tokens=(TOKEN,),
                     reusable_tokens=("team-token-0123456789abcdef",), default_user="alice")
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        csrf = login(client)
        yield Inbox(client, db, workspace, csrf)
