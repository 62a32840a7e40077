"""Quotas: `limit call "mail/send" 20 per 1d per agent`, counted by the store.

A `Limit` says how many calls matching `act pattern` may *start* in one window, counted per
key (the run, the agent, the principal who started the run, or everyone). The call that would
go over gets the limit's effect (`deny`, the default, or `ask`). Windows are fixed and aligned
to the Unix epoch in UTC: `1d` is a UTC day, `1h` a clock hour, `15m` a quarter of an hour.

The policy only says which limits a call meets; the count is the store's, taken in the same
transaction as the call's STARTED mark (`Batch.claims`), so that however many processes
start calls at once, no window ever starts more than `count`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from handrail.errors import PolicyError
from handrail.policy._patterns import compile_pattern
from handrail.tools import Act

if TYPE_CHECKING:
    from handrail.policy._policy import Effect

__all__ = ["LIMIT_KEYS", "Limit", "quota_lines", "window_seconds"]

LIMIT_KEYS = ("run", "agent", "principal", "global")
"""What a limit counts per: one count per run, per agent name, per principal, or one for all."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})([smhdw])$")
_MAX_WINDOW = 366 * 86400
MAX_COUNT = 10**9
"""The largest count a limit may allow per window."""


def window_seconds(text: str) -> int:
    """`"1d"` -> 86400: a window of a number and a unit (s, m, h, d, w), at most 366 days.

    Raises:
        PolicyError: not a window, or longer than 366 days.
    """
    match = _WINDOW.match(text) if isinstance(text, str) else None
    if match is None:
        raise PolicyError(f"a window is a number and a unit (s, m, h, d, w), like '1d' or "
                          f"'15m', not {text!r}")
    seconds = int(match[1]) * _UNITS[match[2]]
    if seconds > _MAX_WINDOW:
        raise PolicyError(f"window {text!r} is longer than 366 days")
    return seconds


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Limit:
    """At most `count` calls matching `act pattern` start per `per` window, per `key`.

    `Limit("call", "mail/send", 20, per="1d", key="agent")` is `limit call 'mail/send' 20 per
    1d per agent`: each agent may start 20 `mail/send` calls a UTC day; the 21st gets `effect`
    (`deny` by default; `ask`: a person decides, and a call they approve counts). Validated on
    construction (`PolicyError`).
    """

    act: Act
    """The kind of action counted."""
    pattern: str
    """The glob its canonical target must match (as a deny rule's: in any letter case)."""
    count: int
    """How many may start per window (at least 1)."""
    per: str = "1d"
    """The window: a number and a unit (`90s`, `15m`, `1h`, `1d`, `1w`)."""
    key: str = "global"
    """What is counted apart: `run`, `agent`, `principal` (who started the run) or `global`."""
    effect: Effect | str = "deny"
    """What the call that would go over gets: `Effect.DENY` or `Effect.ASK` (text accepted)."""

    def __post_init__(self) -> None:
        from handrail.policy._policy import Effect, parse_act

        object.__setattr__(self, "act", parse_act(self.act))
        compile_pattern(self.act, self.pattern)
        if isinstance(self.count, bool) or not isinstance(self.count, int) or \
                not 1 <= self.count <= MAX_COUNT:
            raise PolicyError(f"limit {self.act.value} {self.pattern!r}: the count is a whole "
                              f"number from 1 to {MAX_COUNT}, not {self.count!r} (to allow "
                              "none, write a deny rule)")
        window_seconds(self.per)
        if self.key not in LIMIT_KEYS:
            raise PolicyError(f"limit {self.act.value} {self.pattern!r}: unknown key "
                              f"{self.key!r} (one of {', '.join(LIMIT_KEYS)})")
        effect = Effect.parse(self.effect)
        if effect is Effect.ALLOW:
            raise PolicyError(f"limit {self.act.value} {self.pattern!r}: the call over a limit "
                              "gets 'ask' or 'deny', not 'allow'")
        object.__setattr__(self, "effect", effect)

    @property
    def then(self) -> Effect:
        """The effect as an `Effect` (what `effect` holds once constructed)."""
        from handrail.policy._policy import Effect

        return Effect.parse(self.effect)

    @property
    def seconds(self) -> int:
        """The window's length in seconds."""
        return window_seconds(self.per)

    def describe(self) -> str:
        """`limit call 'mail/send' 20 per 1d per agent, then deny`."""
        per_key = "" if self.key == "global" else f" per {self.key}"
        return (f"limit {self.act.value} {self.pattern!r} {self.count} per {self.per}{per_key}"
                f", then {self.then.value}")

    def counter(self, value: str) -> str:
        """The store's key for this limit's count for one key value.

        It names what is counted (act, pattern, window, key), not the count allowed: raising
        a limit from 20 to 30 keeps the day's count.
        """
        return f"{self.act.value}:{self.pattern}|{self.per}|{self.key}={value}"

    def window(self, now: float) -> tuple[int, float, float]:
        """The window `now` falls in: (its number since the epoch, its start, its end)."""
        seconds = self.seconds
        bucket = int(now // seconds)
        return bucket, float(bucket * seconds), float((bucket + 1) * seconds)

    def window_text(self, now: float) -> str:
        """`2026-12-01T00:00:00Z..2026-12-02T00:00:00Z`: the window `now` falls in."""
        _, start, end = self.window(now)
        return f"{_iso(start)}..{_iso(end)}"

    def to_dict(self) -> dict[str, Any]:
        """The canonical form: `{"rule": "call:mail/send", "max": 20, "per": "1d", ...}`."""
        return {"rule": f"{self.act.value}:{self.pattern}", "max": self.count, "per": self.per,
                "key": self.key, "then": self.then.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limit:
        """The inverse of `to_dict` (`key` defaults to `global`, `then` to `deny`).

        Raises:
            PolicyError: a key missing or unknown, or a value malformed.
        """
        known = {"rule", "max", "per", "key", "then"}
        if not isinstance(data, Mapping) or not {"rule", "max", "per"} <= set(data) or \
                not set(data) <= known:
            raise PolicyError('a limit is {rule = "act:pattern", max = N, per = "1d", '
                              f'key = "agent", then = "deny"}}, got {data!r}')
        rule = data["rule"]
        if not isinstance(rule, str) or ":" not in rule:
            raise PolicyError(f"a limit's rule is 'act:pattern', like 'call:mail/send', "
                              f"not {rule!r}")
        from handrail.policy._policy import parse_act

        act, _, pattern = rule.partition(":")
        return cls(parse_act(act), pattern, data["max"], per=data["per"],
                   key=data.get("key", "global"), effect=data.get("then", "deny"))


def quota_lines(verdict: Mapping[str, Any] | None) -> list[str]:
    """What a call record's verdict says of its quotas, one line each, for a person.

    `limit call 'mail/send' 20 per 1d per agent, then deny: 7 of 20 in
    2026-12-01T00:00:00Z..2026-12-02T00:00:00Z (agent=coder)`; a call the limit held back
    ends `— full, not counted`. Read from a record (the store's text): every value is shown
    as text, never trusted to be of its kind.
    """
    shown = None if not isinstance(verdict, Mapping) else verdict.get("quota")
    if not isinstance(shown, list):
        return []
    lines = []
    for entry in shown:
        if not isinstance(entry, Mapping):
            continue
        count = entry.get("count")
        used = "counted" if count is None and entry.get("counted") else f"{count}"
        line = (f"{entry.get('limit')}: {used} of {entry.get('max')} in {entry.get('window')} "
                f"({entry.get('key')})")
        if entry.get("over"):
            line += " — full, not counted"
        elif not entry.get("counted"):
            line += " — not counted"
        lines.append(line)
    return lines
