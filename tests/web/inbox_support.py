"""Helpers of the inbox's tests: a store with paused runs, a client signed in.

A module of its own (not `conftest`): every test folder has a conftest.py, and a test that
imported `from conftest import ...` got whichever folder's conftest pytest had loaded last
(a selection spanning tests/notify and tests/web, as `scripts/mutants` runs, failed to
import). The fixtures stay in conftest.py.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("starlette", reason="the inbox needs the web extra: pip install -e '.[web]'")

import inbox_agents
from starlette.testclient import TestClient

import handrail as hr

TOKEN = "login-token-for-tests-0123456789"


def run_store(db: Path, fn: Callable[[hr.Store], Any]) -> Any:
    """Run `fn(store)` (async) on its own store and event loop (the app has its own).

    In a thread of its own: Playwright's sync API keeps an event loop in the test's thread.
    """

    async def go() -> Any:
        store = hr.Store.open(db)
        try:
            return await fn(store)
        finally:
            await store.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, go).result(timeout=120)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll `check` until it returns something truthy (the app resumes in its own thread)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Inbox:
    """The app under test, a client signed in as alice, and the store's path."""

    client: TestClient
    db: Path
    workspace: Path
    csrf: str

    def pause(self, tool: str, arguments: dict[str, Any]) -> hr.RunResult:
        """Start a run that pauses on one call, in this process, on the same store file."""
        return run_store(self.db, lambda store: _start(store, self.workspace, tool, arguments))

    def item_for(self, run_id: str) -> hr.PendingItem:
        items = run_store(self.db, lambda store: store.pending())
        (item,) = [p for p in items if p.run_id == run_id]
        return item  # type: ignore[no-any-return]

    def run(self, run_id: str) -> hr.RunRecord:
        return run_store(self.db, lambda store: store.run(run_id))  # type: ignore[no-any-return]

    def item(self, item_id: str) -> hr.PendingItem:
        return run_store(self.db,  # type: ignore[no-any-return]
                         lambda store: store.pending_item(item_id))

    def post(self, path: str, data: dict[str, str] | None = None, *, csrf: bool = True) -> Any:
        form = dict(data or {})
        if csrf:
            form["csrf"] = self.csrf
        return self.client.post(path, data=form, follow_redirects=False)

    def finished(self, run_id: str) -> hr.RunRecord:
        return wait_until(lambda: (r := self.run(run_id)).status in (
            hr.RunStatus.COMPLETED, hr.RunStatus.FAILED) and r, f"run {run_id} to finish")


async def _start(store: hr.Store, workspace: Path, tool: str, arguments: dict[str, Any]
                 ) -> hr.RunResult:
    return await inbox_agents.agent(workspace=str(workspace)).run(_task(tool, arguments),
                                                                  store=store)


def _task(tool: str, arguments: dict[str, Any]) -> str:
    import json

    return json.dumps({"tool": tool, "arguments": arguments})


def login(client: TestClient, token: str = TOKEN, user: str = "alice") -> str:
    """Sign in; returns the session's CSRF token."""
    response = client.post("/login", data={"token": token, "user": user},
                           follow_redirects=False)
    assert response.status_code == 303, response.text
    page = client.get("/")
    match = re.search(r'data-csrf="([^"]+)"', page.text)
    assert match, page.text
    return match.group(1)
