"""Where a waiting call stands against its quotas: the counts a person deciding it is shown.

A call's quota entries are written when it starts (`gate`: the claim goes with its STARTED
mark), so a call that waits for a person has none yet unless a quota held it back. The inbox
and `handrail show` still show, for each limit its action meets, the window's count now: a
person approving the 20th mail of the day should see that it is the 20th.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handrail.errors import HandrailError
from handrail.store import RunRecord, Store

__all__ = ["quota_standing"]

MAX_LIMITS = 16
"""The most limits read for one call (one store read each)."""


async def quota_standing(store: Store, run: RunRecord, payload: Mapping[str, Any]) -> list[str]:
    """One line per limit the waiting call's actions meet, with the count of the window now.

    `limit call 'mail/send' 20 per 1d per agent, then ask: 19 of 20 in
    2026-12-02T00:00:00Z..2026-12-03T00:00:00Z (agent=mailer) — not counted yet: it counts
    when it starts`; `— full` when the window has no room left. `payload` is the pending
    approval's (`Request.to_dict()`: its `actions`, else `act` and `target`). Nothing when
    the run recorded no policy, the policy has no limits, or the store keeps no counts.
    """
    from handrail.approval._request import action_from_dict
    from handrail.policy import Action, Policy
    from handrail.runs._agent import _principal_of

    if not run.policy or not run.policy.get("layers"):
        return []
    try:
        policy = Policy.from_dict(run.policy)
        if not policy.limits:
            return []
        raw = payload.get("actions") or [{"act": payload.get("act"),
                                          "target": payload.get("target")}]
        actions: list[Action] = [action_from_dict(a) for a in list(raw)[:64]
                                 if isinstance(a, Mapping)]
        met = policy.limits_for(actions, workspace=run.workspace)
    except (HandrailError, KeyError, TypeError, ValueError):
        return []  # a payload or policy this handrail cannot read: no counts, not an error
    now = store.clock()
    principal = _principal_of(run.events) or ""
    lines = []
    for limit, _layer in met[:MAX_LIMITS]:
        value = {"run": run.id, "agent": run.agent or "", "principal": principal}.get(
            limit.key, "")
        window, _, _ = limit.window(now)
        try:
            count = await store.quota_count(limit.counter(value), window)
        except HandrailError:
            return []  # a backend without counts
        key = f"{limit.key}={value}" if limit.key != "global" else "global"
        room = ("full" if count >= limit.count
                else "not counted yet: it counts when it starts")
        lines.append(f"{limit.describe()}: {count} of {limit.count} in "
                     f"{limit.window_text(now)} ({key}) — {room}")
    return lines
