"""The CLI's tests read its plain output: no colours asked of it by the environment."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # FORCE_COLOR (set on some CI runners) would style even captured output; the tests that
    # check the styles set what they need themselves.
    monkeypatch.delenv("FORCE_COLOR", raising=False)
