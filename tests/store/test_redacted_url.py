"""A store URL is shown and logged without its password (`handrail inbox`, store errors)."""

from __future__ import annotations

import pytest

from handrail.store.contract import redacted_url


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:s3cret@db:5432/runs", "postgresql://app:***@db:5432/runs"),
    ("postgresql://app:p@ss@db/runs", "postgresql://app:***@db/runs"),
    ("postgresql://app@db/runs", "postgresql://app@db/runs"),
    ("postgresql://db/runs?user=app&password=s3cret&sslmode=require",
     "postgresql://db/runs?user=app&password=***&sslmode=require"),
    ("postgresql://db/runs?PASSWORD=s3cret", "postgresql://db/runs?PASSWORD=***"),
    ("postgresql://db/runs?sslpassword=key&application_name=x",
     "postgresql://db/runs?sslpassword=***&application_name=x"),
    ("runs.db", "runs.db"),
    ("/var/lib/handrail/user:pw@host.db", "/var/lib/handrail/user:pw@host.db"),
    ("memory://", "memory://"),
])
def test_a_password_never_shows(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
