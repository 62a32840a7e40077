"""Test doubles shared by several test directories (on pytest's `pythonpath`, pyproject.toml).

Kept to what more than one directory needs; a helper one directory uses stays there.
"""

from __future__ import annotations

import handrail as hr


class Recorder:
    """An approver that remembers every request and answers each with the same decision.

    `Recorder()` denies with "not asked for"; `Recorder(hr.Decision.approve())` approves. The
    requests are in `requests`, in the order asked (the taint tests read their taint and the
    sentences shown to the person asked).
    """

    name = "recorder"

    def __init__(self, decision: hr.Decision | None = None) -> None:
        self.decision = hr.Decision.deny("not asked for") if decision is None else decision
        self.requests: list[hr.Request] = []

    async def decide(self, request: hr.Request) -> hr.Decision:
        self.requests.append(request)
        return self.decision
